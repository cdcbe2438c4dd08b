// Training loop implementation.
#include "kiln/train/trainer.h"

#include <chrono>
#include <cmath>

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

std::vector<StepStats> train(Transformer& model, const TokenShard& train_data, const TokenShard* val_data,
                             const TrainOptions& o, const std::function<void(const StepStats&)>& on_step) {
  using clock = std::chrono::steady_clock;
  BatchLoader loader(&train_data, o.batch, o.seq_len, o.seed);
  const size_t n = model.params().size();
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<StepStats> history;
  std::vector<int32_t> x, y;
  const auto start = clock::now();
  for (int64_t step = 1; step <= o.max_steps; ++step) {
    const auto t0 = clock::now();
    model.zero_grad();
    double loss = 0;
    for (int64_t micro = 0; micro < o.grad_accum; ++micro) {
      loader.batch_at((step - 1) * o.grad_accum + micro, x, y);
      loss += model.forward(x.data(), y.data(), o.batch, o.seq_len).value();
      model.backward();
    }
    loss /= static_cast<double>(o.grad_accum);
    std::span<float> g = model.grads();
    const float inv_accum = 1.0f / static_cast<float>(o.grad_accum);
    double sq = 0;
    for (float& gi : g) {
      gi *= inv_accum;
      sq += static_cast<double>(gi) * gi;
    }
    const double norm = std::sqrt(sq);
    if (o.clip_norm > 0 && norm > o.clip_norm) {
      const float s = static_cast<float>(o.clip_norm / (norm + 1e-6));
      for (float& gi : g) gi *= s;
    }
    AdamWConfig cfg;
    cfg.lr = learning_rate(o, step, o.max_steps);
    cfg.beta1 = o.beta1;
    cfg.beta2 = o.beta2;
    for (const ParamEntry& e : model.param_entries()) {
      cfg.weight_decay = e.decay ? o.weight_decay : 0.0;
      cpu::adamw_step(model.params().data() + e.offset, g.data() + e.offset, m.data() + e.offset,
                      v.data() + e.offset, e.shape.numel(), cfg, step);
    }
    StepStats s;
    s.step = step;
    s.loss = static_cast<float>(loss);
    s.lr = cfg.lr;
    s.grad_norm = norm;
    s.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    s.elapsed = std::chrono::duration<double>(clock::now() - start).count();
    s.tokens_per_second = static_cast<double>(o.batch * o.seq_len * o.grad_accum) / s.seconds;
    const bool last = step == o.max_steps || (o.max_seconds > 0 && s.elapsed >= o.max_seconds);
    if (val_data && o.eval_every > 0 && (step % o.eval_every == 0 || last))
      s.val_loss = evaluate(model, *val_data, o.batch, o.seq_len, o.eval_batches);
    history.push_back(s);
    if (on_step) on_step(s);
    if (last) break;
  }
  return history;
}

}  // namespace kiln
