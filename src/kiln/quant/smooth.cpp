// AWQ and SmoothQuant scale search and exact folding.
#include "kiln/quant/smooth.h"

#include <algorithm>
#include <cmath>

#include "kiln/kernels/gemm.h"

namespace kiln::quant {

namespace {
Linear* find_linear(Transformer& m, const std::string& name) {
  for (Linear* l : m.linears())
    if (l->name == name) return l;
  return nullptr;
}

// Averages (mode 0) or maxes (mode 1) v over the `tie` heads that share each KV channel, and
// writes the result back to all of them.
void tie_channels(std::vector<float>& v, int64_t tie, int64_t head_dim, bool use_max) {
  if (tie <= 1) return;
  const int64_t kv_width = static_cast<int64_t>(v.size()) / tie;
  for (int64_t kc = 0; kc < kv_width; ++kc) {
    const int64_t kvh = kc / head_dim, d = kc % head_dim;
    float acc = use_max ? 0.0f : 0.0f;
    for (int64_t t = 0; t < tie; ++t) {
      const float x = v[(kvh * tie + t) * head_dim + d];
      acc = use_max ? std::max(acc, x) : acc + x;
    }
    if (!use_max) acc /= static_cast<float>(tie);
    for (int64_t t = 0; t < tie; ++t) v[(kvh * tie + t) * head_dim + d] = acc;
  }
}

// Σ ‖X (Ŵ − W)ᵀ‖² over the sample rows, Ŵ = Q(W diag(s)) diag(s)⁻¹.
double output_error(const Linear& l, const LinearStats& x, const QuantScheme& scheme, const std::vector<float>& s) {
  const int64_t out = l.out, in = l.in;
  std::vector<float> ws(static_cast<size_t>(out * in));
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) ws[r * in + c] = l.w[r * in + c] * s[c];
  QTensor q = quantize_rtn(ws.data(), out, in, scheme);
  q.dequantize(ws.data());
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) ws[r * in + c] = ws[r * in + c] / s[c] - l.w[r * in + c];
  std::vector<float> y(static_cast<size_t>(x.sample_rows * out));
  GemmParams p;
  p.m = x.sample_rows; p.n = out; p.k = in;
  p.a = x.sample.data(); p.lda = in;
  p.b = ws.data(); p.ldb = in; p.trans_b = true;
  p.c = y.data(); p.ldc = out;
  cpu::gemm(p);
  double e = 0;
  for (float v : y) e += static_cast<double>(v) * v;
  return e;
}
}  // namespace

Expected<std::vector<SmoothGroup>> smooth_groups(Transformer& model) {
  const ModelConfig& c = model.config();
  if (!c.is_llama())
    return unimplemented("[quant] AWQ/SmoothQuant folding is implemented for Llama blocks, not {}",
                         family_name(c.family));
  std::vector<SmoothGroup> out;
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    out.push_back({{p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"},
                   p + "input_layernorm.weight", "", 1, 0});
    out.push_back({{p + "self_attn.o_proj.weight"}, "", p + "self_attn.v_proj.weight", c.n_heads / c.n_kv_heads,
                   c.head_dim()});
    out.push_back({{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, p + "post_attention_layernorm.weight", "",
                   1, 0});
    out.push_back({{p + "mlp.down_proj.weight"}, "", p + "mlp.up_proj.weight", 1, 0});
  }
  return out;
}

Status apply_smoothing(Transformer& model, const SmoothGroup& g, const std::vector<float>& s) {
  for (const std::string& name : g.consumers) {
    Linear* l = find_linear(model, name);
    float* w = model.param(name);
    if (l == nullptr || w == nullptr) return not_found("[smooth] no Linear {}", name);
    if (static_cast<int64_t>(s.size()) != l->in)
      return invalid_argument("[smooth] {} scales for {} with {} inputs", s.size(), name, l->in);
    for (int64_t r = 0; r < l->out; ++r)
      for (int64_t c = 0; c < l->in; ++c) w[r * l->in + c] *= s[c];
  }
  if (!g.norm.empty()) {
    float* nw = model.param(g.norm);
    if (nw == nullptr) return not_found("[smooth] no norm weight {}", g.norm);
    for (size_t c = 0; c < s.size(); ++c) nw[c] /= s[c];
  } else {
    Linear* prev = find_linear(model, g.prev_linear);
    float* w = model.param(g.prev_linear);
    if (prev == nullptr || w == nullptr) return not_found("[smooth] no Linear {}", g.prev_linear);
    // Output row r of prev feeds input channels {r + t·kv_width} after the tie (GQA).
    float* bias = prev->b != nullptr ? model.param(g.prev_linear.substr(0, g.prev_linear.rfind('.')) + ".bias") : nullptr;
    const int64_t tie = std::max<int64_t>(1, g.tie);
    if (prev->out * tie != static_cast<int64_t>(s.size()))
      return invalid_argument("[smooth] {} has {} outputs, the consumer {} inputs (tie {})", g.prev_linear, prev->out,
                              s.size(), tie);
    for (int64_t r = 0; r < prev->out; ++r) {
      float sr = s[r];
      if (tie > 1) {
        const int64_t kvh = r / g.head_dim, d = r % g.head_dim;
        sr = s[(kvh * tie) * g.head_dim + d];
      }
      for (int64_t c = 0; c < prev->in; ++c) w[r * prev->in + c] /= sr;
      if (bias != nullptr) bias[r] /= sr;  // HF attention_bias / mlp_bias: the whole output row scales
    }
  }
  return {};
}

std::vector<float> smoothquant_scales(Transformer& model, const SmoothGroup& g, const LinearStats& x, double alpha) {
  const int64_t in = x.in;
  std::vector<float> wmax(static_cast<size_t>(in), 0.0f);
  for (const std::string& name : g.consumers) {
    Linear* l = find_linear(model, name);
    for (int64_t r = 0; r < l->out; ++r)
      for (int64_t c = 0; c < in; ++c) wmax[c] = std::max(wmax[c], std::fabs(l->w[r * in + c]));
  }
  std::vector<float> xmax = x.abs_max;
  tie_channels(xmax, g.tie, g.head_dim, true);
  tie_channels(wmax, g.tie, g.head_dim, true);
  std::vector<float> s(static_cast<size_t>(in));
  for (int64_t c = 0; c < in; ++c) {
    const double v = std::pow(std::max(xmax[c], 1e-5f), alpha) / std::pow(std::max(wmax[c], 1e-5f), 1.0 - alpha);
    s[c] = static_cast<float>(std::clamp(v, 1e-4, 1e4));
  }
  return s;
}

AwqChoice awq_search(Transformer& model, const SmoothGroup& g, const LinearStats& x, const QuantScheme& scheme,
                     double alpha) {
  std::vector<float> xmean = x.abs_mean;
  tie_channels(xmean, g.tie, g.head_dim, false);
  std::vector<double> alphas;
  if (alpha >= 0) {
    alphas = {0.0, alpha};
  } else {
    for (int i = 0; i <= 20; ++i) alphas.push_back(0.05 * i);  // the AWQ grid (n_grid = 20)
  }
  AwqChoice best;
  best.error = -1;
  for (double a : alphas) {
    std::vector<float> s(xmean.size());
    float smax = 0, smin = 1e30f;
    for (size_t c = 0; c < s.size(); ++c) {
      s[c] = static_cast<float>(std::pow(std::max(xmean[c], 1e-4f), a));
      smax = std::max(smax, s[c]);
      smin = std::min(smin, s[c]);
    }
    const float norm = std::sqrt(smax * smin);  // AWQ normalizes s by sqrt(max · min)
    for (float& v : s) v /= norm;
    double e = 0;
    for (const std::string& name : g.consumers) e += output_error(*find_linear(model, name), x, scheme, s);
    if (a == 0.0) best.error_rtn = e;
    const bool candidate = alpha < 0 || a == alpha;  // a given α is used as is
    if (candidate && (best.error < 0 || e < best.error)) {
      best.error = e;
      best.alpha = a;
      best.s = s;
    }
  }
  return best;
}

}  // namespace kiln::quant
