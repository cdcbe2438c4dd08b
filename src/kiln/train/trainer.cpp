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
      m_(model.params().size(), 0.0f), v_(model.params().size(), 0.0f), total_steps_(o.max_steps) {}

StepStats Trainer::step() {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  ++step_;
  model_.zero_grad();
  double loss = 0;
  for (int64_t micro = 0; micro < o_.grad_accum; ++micro) {
    loader_.batch_at((step_ - 1) * o_.grad_accum + micro, x_, y_);
    loss += model_.forward(x_.data(), y_.data(), o_.batch, o_.seq_len).value();
    model_.backward();
  }
  loss /= static_cast<double>(o_.grad_accum);
  std::span<float> g = model_.grads();
  const float inv_accum = 1.0f / static_cast<float>(o_.grad_accum);
  double sq = 0;
  for (float& gi : g) {
    gi *= inv_accum;
    sq += static_cast<double>(gi) * gi;
  }
  const double norm = std::sqrt(sq);
  if (o_.clip_norm > 0 && norm > o_.clip_norm) {
    const float s = static_cast<float>(o_.clip_norm / (norm + 1e-6));
    for (float& gi : g) gi *= s;
  }
  AdamWConfig cfg;
  cfg.lr = learning_rate(o_, step_, total_steps_);
  cfg.beta1 = o_.beta1;
  cfg.beta2 = o_.beta2;
  for (const ParamEntry& e : model_.param_entries()) {
    cfg.weight_decay = e.decay ? o_.weight_decay : 0.0;
    cpu::adamw_step(model_.params().data() + e.offset, g.data() + e.offset, m_.data() + e.offset,
                    v_.data() + e.offset, e.shape.numel(), cfg, step_);
  }
  StepStats s;
  s.step = step_;
  s.loss = static_cast<float>(loss);
  s.lr = cfg.lr;
  s.grad_norm = norm;
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
}  // namespace

Status Trainer::save_checkpoint(const std::string& path) const {
  nlohmann::json header = {{"format", "kiln-checkpoint-1"}, {"step", step_}, {"num_params", m_.size()},
                           {"model", model_.config().describe()}, {"options", options_json(o_)}};
  // A step count derived from a time budget is part of the schedule; --steps comes from the flags.
  if (o_.max_seconds > 0) header["time_budget_steps"] = total_steps_;
  const std::string h = header.dump();
  const uint64_t hlen = h.size();
  const float* params = model_.params().data();
  return write_file_atomic(path, {std::string_view(kCkptMagic, 8), as_bytes(&hlen, 1), h,
                                  as_bytes(params, m_.size()), as_bytes(m_.data(), m_.size()),
                                  as_bytes(v_.data(), v_.size())});
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
  if (n != m_.size())
    return invalid_argument("{} holds {} parameters; this model has {} ({})", path, n, m_.size(),
                            header.value("model", std::string("?")));
  if (16 + hlen + 3 * n * sizeof(float) != size) return data_loss("{}: size does not match its header (truncated?)", path);
  if (header["options"] != options_json(o_))
    return invalid_argument("{} was written with options {}; resume with the same ones (now {})", path,
                            header["options"].dump(), options_json(o_).dump());
  const auto bytes = static_cast<std::streamsize>(n * sizeof(float));
  in.read(reinterpret_cast<char*>(model_.params().data()), bytes);
  in.read(reinterpret_cast<char*>(m_.data()), bytes);
  in.read(reinterpret_cast<char*>(v_.data()), bytes);
  if (!in) return data_loss("{}: short read", path);
  step_ = header["step"].get<int64_t>();
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
