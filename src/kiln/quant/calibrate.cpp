// Calibration capture and the clipping-vs-rounding report.
#include "kiln/quant/calibrate.h"

#include <algorithm>
#include <cmath>

#include "kiln/kernels/gemm.h"

namespace kiln::quant {

std::vector<float> LinearStats::hessian() const {
  std::vector<float> h(xtx.size());
  const float f = rows > 0 ? 2.0f / static_cast<float>(rows) : 0.0f;
  for (size_t i = 0; i < h.size(); ++i) h[i] = f * xtx[i];
  return h;
}

CaptureLinear::CaptureLinear(LinearStats* stats, std::shared_ptr<LinearBackend> inner, bool want_xtx,
                             int64_t sample_every, int64_t max_sample_rows)
    : stats_(stats), inner_(std::move(inner)), want_xtx_(want_xtx), sample_every_(std::max<int64_t>(1, sample_every)),
      max_sample_rows_(max_sample_rows) {}

void CaptureLinear::forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const {
  LinearStats& s = *stats_;
  const int64_t in = l.in;
  if (s.in == 0) {
    s.in = in;
    s.abs_mean.assign(static_cast<size_t>(in), 0.0f);
    s.abs_max.assign(static_cast<size_t>(in), 0.0f);
    if (want_xtx_) s.xtx.assign(static_cast<size_t>(in * in), 0.0f);
  }
  if (want_xtx_) {
    GemmParams p;  // xtx (in, in) += xᵀ (in, n) x (n, in)
    p.m = in; p.n = in; p.k = n;
    p.a = x; p.lda = in; p.trans_a = true;
    p.b = x; p.ldb = in;
    p.c = s.xtx.data(); p.ldc = in;
    p.beta = 1.0f;
    cpu::gemm(p);
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * in;
    for (int64_t j = 0; j < in; ++j) {
      const float a = std::fabs(row[j]);
      s.abs_mean[j] += a;  // a sum until finish
      s.abs_max[j] = std::max(s.abs_max[j], a);
    }
    if ((s.rows + r) % sample_every_ == 0 && s.sample_rows < max_sample_rows_) {
      s.sample.insert(s.sample.end(), row, row + in);
      ++s.sample_rows;
    }
  }
  s.rows += n;
  if (inner_) {
    inner_->forward(l, y, x, n, residual);
  } else {
    l.forward_f32(y, x, n, residual);
  }
}

std::vector<int32_t> calibration_tokens(const TokenShard& shard, const CalibOptions& o) {
  BatchLoader loader(&shard, o.samples, o.seq_len, o.seed);
  std::vector<int32_t> x, y;
  loader.batch_at(0, x, y);
  return x;
}

Expected<std::map<std::string, LinearStats>> capture_stats(Transformer& model, const std::vector<int32_t>& tokens,
                                                           const CalibOptions& o, bool want_xtx,
                                                           const std::vector<std::string>& names) {
  const int64_t T = o.seq_len;
  if (T <= 0 || static_cast<int64_t>(tokens.size()) % T != 0)
    return invalid_argument("[calibrate] {} tokens are not whole sequences of {}", tokens.size(), T);
  const int64_t num_seq = static_cast<int64_t>(tokens.size()) / T;
  std::map<std::string, LinearStats> stats;
  std::vector<std::pair<Linear*, std::shared_ptr<LinearBackend>>> saved;
  // Rows seen per Linear = num_seq·T; keep about max_sample_rows of them, evenly strided.
  const int64_t every = std::max<int64_t>(1, num_seq * T / std::max<int64_t>(1, o.max_sample_rows));
  for (Linear* l : model.linears()) {
    if (!names.empty() && std::find(names.begin(), names.end(), l->name) == names.end()) continue;
    if (stats.count(l->name)) continue;  // a tied head shares the embedding's name: capture once
    saved.emplace_back(l, l->backend);
    l->backend = std::make_shared<CaptureLinear>(&stats[l->name], l->backend, want_xtx, every, o.max_sample_rows);
  }
  Status status;
  for (int64_t s0 = 0; s0 < num_seq && status.ok(); s0 += o.batch) {
    const int64_t b = std::min(o.batch, num_seq - s0);
    status = model.forward(tokens.data() + s0 * T, nullptr, b, T).status();
  }
  for (auto& [l, backend] : saved) l->backend = backend;
  KILN_RETURN_IF_ERROR(status);
  for (auto& [name, s] : stats)
    for (float& v : s.abs_mean) v /= static_cast<float>(std::max<int64_t>(1, s.rows));
  return stats;
}

std::string range_report(Transformer& model, const std::map<std::string, LinearStats>& stats,
                         const QuantScheme& weight_scheme) {
  std::string out = fmt::format(
      "{:<44} {:>28} {:>28} {:>28} | weight {} (clip / round MSE)\n", "input of Linear (int8 per-tensor static)",
      "min-max clip / round", "p99.99 clip / round", "MSE-opt clip / round", weight_scheme.describe());
  const RangeMethod methods[3] = {RangeMethod::kMinMax, RangeMethod::kPercentile, RangeMethod::kMse};
  for (Linear* l : model.linears()) {
    auto it = stats.find(l->name);
    if (it == stats.end() || it->second.sample.empty()) continue;
    const auto& sample = it->second.sample;
    std::string row = fmt::format("{:<44}", l->name);
    for (RangeMethod m : methods) {
      QuantScheme s;
      s.bits = 8;
      s.symmetric = true;
      s.group = QuantScheme::kPerTensor;
      s.range = m;
      s.percentile = 99.99;
      float lo, hi;
      choose_range(s, sample, lo, hi);
      const ErrorSplit e = split_error(s, sample, lo, hi);
      row += fmt::format(" {:>13.3e} / {:<12.3e}", e.clip_mse, e.round_mse);
    }
    // The weight: clipped vs rounded error summed over groups under the scheme's range.
    const int64_t gs = weight_scheme.group > 0 ? weight_scheme.group : l->in;
    double clip = 0, round = 0;
    for (int64_t r = 0; r < l->out; ++r)
      for (int64_t c0 = 0; c0 < l->in; c0 += gs) {
        std::span<const float> g(l->w + r * l->in + c0, static_cast<size_t>(gs));
        float lo, hi;
        choose_range(weight_scheme, g, lo, hi);
        const ErrorSplit e = split_error(weight_scheme, g, lo, hi);
        clip += e.clip_mse * gs;
        round += e.round_mse * gs;
      }
    const double n = static_cast<double>(l->in * l->out);
    row += fmt::format(" | {:.3e} / {:.3e}\n", clip / n, round / n);
    out += row;
  }
  return out;
}

}  // namespace kiln::quant
