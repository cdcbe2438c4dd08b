// Fake quantization with a straight-through estimator, and the export after QAT.
#include "kiln/quant/qat.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/gemm.h"

namespace kiln::quant {

Expected<QatConfig> parse_qat(const std::string& name) {
  QatConfig c;
  c.name = name;
  KILN_ASSIGN_OR_RETURN(c.weight, parse_weight_scheme(name));
  c.act_int8 = name.ends_with("a8");
  if (c.weight.format != QFormat::kInt) return invalid_argument("[qat] '{}': QAT takes integer schemes", name);
  return c;
}

FakeQuantLinear::FakeQuantLinear(const Linear& l, const QatConfig& c) : c_(c) { sync(l); }

void FakeQuantLinear::sync(const Linear& l) {
  const QTensor q = quantize_rtn(l.w, l.out, l.in, c_.weight);
  wq_.resize(static_cast<size_t>(l.out * l.in));
  q.dequantize(wq_.data());
  mask_.resize(wq_.size());
  // Inside the clipping range: round(w/Δ) + z lands on the grid without clamping.
  const float qmax = static_cast<float>(c_.weight.qmax());
  parallel_for(l.out, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < l.in; ++k) {
        const int64_t pi = q.param_index(r, k);
        const float v = std::nearbyint(l.w[r * l.in + k] / q.scales[pi]) + q.zeros[pi];
        mask_[r * l.in + k] = v >= 0.0f && v <= qmax;
      }
  });
}

const float* FakeQuantLinear::act_input(const float* x, int64_t n, int64_t in) const {
  if (!c_.act_int8) return x;
  xa_.assign(x, x + n * in);
  fake_quantize_rows(xa_.data(), n, in, QFormat::kInt, 8);
  return xa_.data();
}

void FakeQuantLinear::forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const {
  const float* xin = act_input(x, n, l.in);
  GemmParams p;
  p.m = n; p.n = l.out; p.k = l.in;
  p.a = xin; p.lda = l.in;
  p.b = wq_.data(); p.ldb = l.in; p.trans_b = true;
  p.c = y; p.ldc = l.out;
  p.bias = l.b;
  p.residual = residual; p.ldr = l.out;
  cpu::gemm(p);
}

void FakeQuantLinear::backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                               bool accumulate_dx) const {
  // Per-token symmetric activation ranges span each row's max |x|: nothing is clipped, so the
  // activation STE mask is 1 everywhere and dx = dy Ŵ.
  const float* xin = act_input(x, n, l.in);
  GemmParams pd;  // dx (n, in) = dy (n, out) Ŵ (out, in)
  pd.m = n; pd.n = l.in; pd.k = l.out;
  pd.a = dy; pd.lda = l.out;
  pd.b = wq_.data(); pd.ldb = l.in;
  pd.c = dx; pd.ldc = l.in;
  pd.beta = accumulate_dx ? 1.0f : 0.0f;
  cpu::gemm(pd);
  tmp_.resize(wq_.size());
  GemmParams pw;  // tmp (out, in) = dyᵀ x̂
  pw.m = l.out; pw.n = l.in; pw.k = n;
  pw.a = dy; pw.lda = l.out; pw.trans_a = true;
  pw.b = xin; pw.ldb = l.in;
  pw.c = tmp_.data(); pw.ldc = l.in;
  cpu::gemm(pw);
  parallel_for(static_cast<int64_t>(tmp_.size()), 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      if (mask_[i]) l.dw[i] += tmp_[i];
  });
  if (l.db != nullptr) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < l.out; ++c) l.db[c] += dy[r * l.out + c];
  }
}

Status install_qat(Transformer& model, const QatConfig& c) {
  std::vector<Linear*> ls = model.linears();
  ls.pop_back();  // the LM head stays fp32 (tied to the embedding in llama-tiny)
  for (Linear* l : ls) {
    if (l->backend) return failed_precondition("[qat] {} already has a backend (e.g. --precision)", l->name);
    KILN_RETURN_IF_ERROR(check_scheme(c.weight, l->in));
  }
  for (Linear* l : ls) l->backend = std::make_shared<FakeQuantLinear>(*l, c);
  return {};
}

Status check_qat_tensor_split(const QatConfig& c, const ModelConfig& m, int tp) {
  for (int r = 0; r < tp; ++r) {
    for (const ParamEntry& e : Transformer::param_entries_for(m, r, tp)) {
      const ParamSplit& s = e.split;
      if (s.kind != ParamSplit::Kind::kColumns || s.count == s.full[1]) continue;
      if (c.act_int8)
        return invalid_argument("--qat {} with --tp {}: int8 activations take a per-token scale over the whole input "
                                "row of {}, which tensor parallelism cuts", c.name, tp, e.name);
      if (c.weight.group <= 0 || s.begin % c.weight.group != 0 || s.count % c.weight.group != 0)
        return invalid_argument("--qat {} with --tp {}: {} holds {} of its {} input columns per rank, not whole "
                                "groups of {} ({})", c.name, tp, e.name, s.count, s.full[1], c.weight.describe(),
                                c.weight.group <= 0 ? "its scales span the whole row" : "groups would straddle ranks");
    }
  }
  return {};
}

QuantizedState export_qat(Transformer& model, const QatConfig& c) {
  QuantizedState st;
  st.method = Method::kQat;
  st.scheme = c.weight;
  st.act = c.act_int8 ? ActQuant::kInt8 : ActQuant::kNone;
  std::vector<Linear*> ls = model.linears();
  ls.pop_back();
  for (Linear* l : ls) {
    l->backend.reset();
    st.weights.emplace(l->name, quantize_rtn(l->w, l->out, l->in, c.weight));
  }
  install_backends(model, st);
  return st;
}

}  // namespace kiln::quant
