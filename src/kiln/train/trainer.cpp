// Training loop and checkpoints.
#include "kiln/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"

namespace kiln {

double learning_rate(const TrainOptions& o, int64_t step, int64_t total) {
  if (step <= o.warmup_steps) return o.lr * static_cast<double>(step) / std::max<int64_t>(o.warmup_steps, 1);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) /
                                            std::max<int64_t>(total - o.warmup_steps, 1));
  const double min_lr = o.lr * o.min_lr_fraction;
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double evaluate(Transformer& model, const TokenShard& data, int64_t batch, int64_t seq_len, int64_t batches) {
  BatchLoader loader(&data, batch, seq_len, 0);
  std::vector<int32_t> x, y;
  double sum = 0;
  int64_t n = 0;
  for (int64_t i = 0; i < batches && loader.eval_batch(i, x, y); ++i) {
    sum += model.forward(x.data(), y.data(), batch, seq_len).value();
    ++n;
  }
  return n ? sum / n : -1;
}

Trainer::Trainer(Transformer& model, const TokenShard& train_data, const TokenShard* val_data, const TrainOptions& o)
    : model_(model), val_(val_data), o_(o), loader_(&train_data, o.batch, o.seq_len, o.seed),
      m_(Tensor::zeros({static_cast<int64_t>(model.params().size())})),
      v_(Tensor::zeros({static_cast<int64_t>(model.params().size())})),
      scaler_(o.loss_scale, o.dynamic_loss_scale, o.loss_scale_window), total_steps_(o.max_steps) {
  model_.set_checkpointing(o.checkpoint);
  auto ctx = install_precision(model_, o.precision, o.amax_history);
  KILN_CHECK_MSG(ctx.ok(), "{}", ctx.status().message());
  precision_ = *ctx;
}

StepStats Trainer::step() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  ++step_;
  model_.zero_grad();
  const int64_t flushed0 = precision_->grads_flushed, rounded0 = precision_->values_rounded;
  const double loss_scale = scaler_.scale();
  double loss = 0;
  for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
    loader_.batch_at((step_ - 1) * o_.grad_accum + micro, x_, y_);
    loss += model_.forward(x_.data(), y_.data(), o_.batch, o_.seq_len).value();
    model_.backward(static_cast<float>(loss_scale));
  }
  loss /= static_cast<double>(o_.grad_accum);
  std::span<float> g = model_.grads();
  // Unscale (1/S) and average over micro-batches in one multiply; S is a power of two in the
  // dynamic scaler, so unscaling is exact.
  const float inv = static_cast<float>(1.0 / (static_cast<double>(o_.grad_accum) * loss_scale));
  double sq = 0;
  for (float& gi : g) {
    gi *= inv;
    sq += static_cast<double>(gi) * gi;
  }
  const double norm = std::sqrt(sq);
  const bool apply = scaler_.update(!std::isfinite(sq));  // an inf or NaN anywhere makes sq non-finite
  AdamWConfig cfg;
  cfg.lr = learning_rate(o_, step_, total_steps_);
  cfg.beta1 = o_.beta1;
  cfg.beta2 = o_.beta2;
  if (apply) {
    if (o_.clip_norm > 0 && norm > o_.clip_norm) {
      const float s = static_cast<float>(o_.clip_norm / (norm + 1e-6));
      for (float& gi : g) gi *= s;
    }
    for (const ParamEntry& e : model_.param_entries()) {
      cfg.weight_decay = e.decay ? o_.weight_decay : 0.0;
      cpu::adamw_step(model_.params().data() + e.offset, g.data() + e.offset, m_.data<float>() + e.offset,
                      v_.data<float>() + e.offset, e.shape.numel(), cfg, step_);
    }
    sync_backends(model_);  // low-precision copies (and any other backend's state) follow the master
  }
  StepStats s;
  s.step = step_;
  s.loss = static_cast<float>(loss);
  s.lr = cfg.lr;
  s.grad_norm = norm;
  s.loss_scale = loss_scale;
  s.skipped = !apply;
  s.grads_flushed = precision_->grads_flushed - flushed0;
  s.grads_rounded = precision_->values_rounded - rounded0;
  s.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  elapsed_ += s.seconds;
  s.elapsed = elapsed_;
  s.tokens_per_second = static_cast<double>(o_.batch * o_.seq_len * o_.grad_accum) / s.seconds;
  // A time budget fixes the step count once the step time is known (after 5 steps), so the
  // cosine schedule still ends at its floor.
  if (o_.max_seconds > 0 && step_ == 5)
    total_steps_ = std::min(total_steps_, step_ + static_cast<int64_t>((o_.max_seconds - elapsed_) / (elapsed_ / 5)));
  if (o_.max_seconds > 0 && elapsed_ >= o_.max_seconds) stop_ = true;
  if (val_ && o_.eval_every > 0 && (step_ % o_.eval_every == 0 || done()))
    s.val_loss = evaluate(model_, *val_, o_.batch, o_.seq_len, o_.eval_batches);
  return s;
}

namespace {
constexpr char kCkptMagic[8] = {'K', 'I', 'L', 'N', 'C', 'K', 'P', 'T'};

nlohmann::json options_json(const TrainOptions& o) {
  return {{"batch", o.batch}, {"seq_len", o.seq_len}, {"grad_accum", o.grad_accum}, {"lr", o.lr},
          {"min_lr_fraction", o.min_lr_fraction}, {"warmup_steps", o.warmup_steps},
          {"weight_decay", o.weight_decay}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"clip_norm", o.clip_norm},
          {"seed", o.seed}};
}

// Only non-default precisions are recorded, so checkpoints from before mixed precision load.
nlohmann::json options_json_with_precision(const TrainOptions& o) {
  nlohmann::json j = options_json(o);
  if (o.precision != Precision::kF32) j["precision"] = std::string(precision_name(o.precision));
  return j;
}
}  // namespace

Status Trainer::save_checkpoint(const std::string& path) const {
  nlohmann::json header = {{"format", "kiln-checkpoint-1"}, {"step", step_}, {"num_params", m_.numel()},
                           {"model", model_.config().describe()}, {"options", options_json_with_precision(o_)},
                           {"loss_scale", scaler_.scale()}, {"loss_scale_good_steps", scaler_.good_steps()}};
  // A step count derived from a time budget is part of the schedule; --steps comes from the flags.
  if (o_.max_seconds > 0) header["time_budget_steps"] = total_steps_;
  const std::string h = header.dump();
  const uint64_t hlen = h.size();
  const float* params = model_.params().data();
  const auto n = static_cast<size_t>(m_.numel());
  return write_file_atomic(path, {std::string_view(kCkptMagic, 8), as_bytes(&hlen, 1), h, as_bytes(params, n),
                                  as_bytes(m_.data<float>(), n), as_bytes(v_.data<float>(), n)});
}

Status Trainer::load_checkpoint(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) return not_found("checkpoint {}: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint64_t hlen = 0;
  if (size < 16 || !in.read(magic, 8) || std::memcmp(magic, kCkptMagic, 8) != 0 ||
      !in.read(reinterpret_cast<char*>(&hlen), 8))
    return data_loss("{} is not a kiln checkpoint", path);
  if (hlen > (1u << 20) || 16 + hlen > size) return data_loss("{}: header length {} is corrupt", path, hlen);
  std::string h(hlen, '\0');
  in.read(h.data(), static_cast<std::streamsize>(hlen));
  const nlohmann::json header = nlohmann::json::parse(h, nullptr, false);
  if (header.is_discarded() || !header.contains("step") || !header.contains("num_params") || !header.contains("options"))
    return data_loss("{}: malformed header", path);
  const uint64_t n = header["num_params"].get<uint64_t>();
  if (n != static_cast<uint64_t>(m_.numel()))
    return invalid_argument("{} holds {} parameters; this model has {} ({})", path, n, m_.numel(),
                            header.value("model", std::string("?")));
  if (16 + hlen + 3 * n * sizeof(float) != size) return data_loss("{}: size does not match its header (truncated?)", path);
  if (header["options"] != options_json_with_precision(o_))
    return invalid_argument("{} was written with options {}; resume with the same ones (now {})", path,
                            header["options"].dump(), options_json_with_precision(o_).dump());
  const auto bytes = static_cast<std::streamsize>(n * sizeof(float));
  in.read(reinterpret_cast<char*>(model_.params().data()), bytes);
  in.read(reinterpret_cast<char*>(m_.data<float>()), bytes);
  in.read(reinterpret_cast<char*>(v_.data<float>()), bytes);
  if (!in) return data_loss("{}: short read", path);
  step_ = header["step"].get<int64_t>();
  if (header.contains("loss_scale"))
    scaler_.restore(header["loss_scale"].get<double>(), header.value("loss_scale_good_steps", int64_t{0}));
  sync_backends(model_);
  if (o_.max_seconds > 0 && header.contains("time_budget_steps")) total_steps_ = header["time_budget_steps"].get<int64_t>();
  return {};
}

std::vector<StepStats> train(Transformer& model, const TokenShard& train_data, const TokenShard* val_data,
                             const TrainOptions& o, const std::function<void(const StepStats&)>& on_step) {
  Trainer trainer(model, train_data, val_data, o);
  std::vector<StepStats> history;
  while (!trainer.done()) {
    history.push_back(trainer.step());
    if (on_step) on_step(history.back());
  }
  return history;
}

}  // namespace kiln
