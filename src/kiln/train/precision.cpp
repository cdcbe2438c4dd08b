// The mixed-precision LinearBackends (bf16 GEMM; emulated fp16 and fp8), loss scaling and fp8
// delayed scaling.
#include "kiln/train/precision.h"

#include "kiln/comm/collectives.h"

#include <algorithm>
#include <cmath>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/elementwise.h"
#include "kiln/kernels/gemm.h"

namespace kiln {

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "fp32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "fp16";
    case Precision::kFP8: return "fp8";
  }
  return "?";
}

Expected<Precision> parse_precision(std::string_view s) {
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kF16, Precision::kFP8})
    if (s == precision_name(p)) return p;
  return invalid_argument("[precision] unknown precision '{}' (known: fp32, bf16, fp16, fp8)", s);
}

// ---- scalers ---------------------------------------------------------------------------------
float DelayedScaler::scale() const {
  float amax = 0.0f;
  for (float a : history_) amax = std::max(amax, a);
  return amax > 0.0f ? fp8_max(kind_) / amax : 1.0f;
}

void DelayedScaler::record(float amax) {
  if (!std::isfinite(amax)) return;
  history_.push_back(amax);
  while (static_cast<int>(history_.size()) > history_len_) history_.pop_front();
}

bool LossScaler::update(bool found_nonfinite) {
  if (!dynamic_) return !found_nonfinite;
  if (found_nonfinite) {
    scale_ *= 0.5;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ >= window_) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
  return true;
}

// ---- context ---------------------------------------------------------------------------------
void* PrecisionContext::scratch(Tensor& t, int64_t bytes) {
  if (!t.defined() || t.nbytes() < bytes) {
    t = Tensor();  // give the smaller block back first: no moment with both live
    t = Tensor::empty({(bytes + 3) / 4});
  }
  return t.raw_data();
}

namespace {
// Largest input and output widths over the model's Linears (the LM head included).
std::pair<int64_t, int64_t> max_widths(const ModelConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff, HD = c.n_heads * c.head_dim();
  const int64_t in = std::max({C, F, HD});
  const int64_t out = std::max({c.is_llama() ? HD : 3 * C, C, F, c.vocab_size});
  return {in, out};
}
int64_t elem_bytes(Precision p) { return p == Precision::kBF16 ? 2 : 4; }
}  // namespace

int64_t PrecisionContext::scratch_bytes(Precision p, const ModelConfig& c, int64_t rows) {
  if (p == Precision::kF32) return 0;
  const auto [in, out] = max_widths(c);
  return rows * (in + out) * elem_bytes(p);
}

int64_t PrecisionContext::weight_copy_bytes(Precision p, const ModelConfig& c) {
  if (p == Precision::kF32) return 0;
  const int64_t C = c.d_model, F = c.d_ff, D = c.head_dim(), V = c.vocab_size;
  const int64_t per_layer = c.is_llama() ? C * (c.n_heads + 2 * c.n_kv_heads) * D + c.n_heads * D * C + 3 * C * F
                                         : 3 * C * C + C * C + 2 * C * F;
  return (c.n_layers * per_layer + V * C) * elem_bytes(p);
}

namespace {
// y (n, out) = x Wᵀ + b (+ residual) with A and B of dtype dt (f32 or bf16 bits).
void gemm_forward(const Linear& l, float* y, const void* x, const void* w, DType dt, int64_t n, const float* residual) {
  GemmParams p;
  p.m = n; p.n = l.out; p.k = l.in;
  p.a = x; p.lda = l.in; p.a_dtype = dt;
  p.b = w; p.ldb = l.in; p.b_dtype = dt; p.trans_b = true;
  p.c = y; p.ldc = l.out;
  p.bias = l.b;
  p.residual = residual; p.ldr = l.out;
  cpu::gemm(p);
}

// dx (n, in) = dy W (+=), dW += dyᵀ x, db += Σ dy; dy, x, W of dtype dt; dy_f32 for the bias.
void gemm_backward(const Linear& l, float* dx, const void* dy, const void* x, const void* w, DType dt, int64_t n,
                   bool accumulate_dx, const float* dy_f32) {
  GemmParams pd;  // dx (n, in) = dy (n, out) W (out, in)
  pd.m = n; pd.n = l.in; pd.k = l.out;
  pd.a = dy; pd.lda = l.out; pd.a_dtype = dt;
  pd.b = w; pd.ldb = l.in; pd.b_dtype = dt;
  pd.c = dx; pd.ldc = l.in;
  pd.beta = accumulate_dx ? 1.0f : 0.0f;
  cpu::gemm(pd);
  GemmParams pw;  // dW (out, in) += dyᵀ (out, n) x (n, in)
  pw.m = l.out; pw.n = l.in; pw.k = n;
  pw.a = dy; pw.lda = l.out; pw.a_dtype = dt; pw.trans_a = true;
  pw.b = x; pw.ldb = l.in; pw.b_dtype = dt;
  pw.c = l.dw; pw.ldc = l.in;
  pw.beta = 1.0f;
  cpu::gemm(pw);
  if (l.db != nullptr) cpu::bias_backward(l.db, dy_f32, n, l.out);
}

// bf16: a bf16 copy of W; activations and output gradients rounded to bf16 per call.
class Bf16Backend final : public LinearBackend {
 public:
  explicit Bf16Backend(std::shared_ptr<PrecisionContext> ctx) : ctx_(std::move(ctx)) {}
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    auto* xb = static_cast<uint16_t*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 2));
    convert_to_bf16(xb, x, n * l.in);
    gemm_forward(l, y, xb, w_.raw_data(), DType::kBF16, n, residual);
  }
  void backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                bool accumulate_dx) const override {
    auto* xb = static_cast<uint16_t*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 2));
    auto* dyb = static_cast<uint16_t*>(ctx_->scratch(ctx_->dy_scratch, n * l.out * 2));
    convert_to_bf16(xb, x, n * l.in);
    convert_to_bf16(dyb, dy, n * l.out);
    gemm_backward(l, dx, dyb, xb, w_.raw_data(), DType::kBF16, n, accumulate_dx, dy);
  }
  void sync(const Linear& l) override {
    if (!w_.defined()) w_ = Tensor::empty({l.out, l.in}, DType::kBF16);
    convert_to_bf16(static_cast<uint16_t*>(w_.raw_data()), l.w, l.out * l.in);
  }

 private:
  std::shared_ptr<PrecisionContext> ctx_;
  Tensor w_;  // (out, in) bf16
};

// fp16, emulated: values rounded to f16 and kept as f32, then the f32 GEMM.
class F16Backend final : public LinearBackend {
 public:
  explicit F16Backend(std::shared_ptr<PrecisionContext> ctx) : ctx_(std::move(ctx)) {}
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    auto* xr = static_cast<float*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 4));
    round_through_f16(xr, x, n * l.in);
    gemm_forward(l, y, xr, w_.raw_data(), DType::kF32, n, residual);
  }
  void backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                bool accumulate_dx) const override {
    auto* xr = static_cast<float*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 4));
    auto* dyr = static_cast<float*>(ctx_->scratch(ctx_->dy_scratch, n * l.out * 4));
    round_through_f16(xr, x, n * l.in);
    ctx_->grads_flushed += round_through_f16(dyr, dy, n * l.out);
    ctx_->values_rounded += n * l.out;
    gemm_backward(l, dx, dyr, xr, w_.raw_data(), DType::kF32, n, accumulate_dx, dyr);
  }
  void sync(const Linear& l) override {
    if (!w_.defined()) w_ = Tensor::empty({l.out, l.in});
    round_through_f16(w_.data<float>(), l.w, l.out * l.in);
  }

 private:
  std::shared_ptr<PrecisionContext> ctx_;
  Tensor w_;  // (out, in), f16 values as f32
};

// fp8, emulated: quantize-dequantize with delayed per-tensor scales, then the f32 GEMM.
class Fp8Backend final : public LinearBackend {
 public:
  Fp8Backend(std::shared_ptr<PrecisionContext> ctx, int history)
      : ctx_(std::move(ctx)), sx_(Fp8Kind::kE4M3, history), sw_(Fp8Kind::kE4M3, history),
        sdy_(Fp8Kind::kE5M2, history) {}
  void forward(const Linear& l, float* y, const float* x, int64_t n, const float* residual) const override {
    auto* xq = static_cast<float*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 4));
    x_scale_ = cast(sx_, xq, x, n * l.in);
    gemm_forward(l, y, xq, w_.raw_data(), DType::kF32, n, residual);
  }
  void backward(const Linear& l, float* dx, const float* dy, const float* x, int64_t n,
                bool accumulate_dx) const override {
    auto* xq = static_cast<float*>(ctx_->scratch(ctx_->x_scratch, n * l.in * 4));
    auto* dyq = static_cast<float*>(ctx_->scratch(ctx_->dy_scratch, n * l.out * 4));
    fp8_quantize_dequantize(xq, x, n * l.in, x_scale_, Fp8Kind::kE4M3);  // as in the forward
    cast(sdy_, dyq, dy, n * l.out);
    gemm_backward(l, dx, dyq, xq, w_.raw_data(), DType::kF32, n, accumulate_dx, dyq);
  }
  void sync(const Linear& l) override {
    if (!w_.defined()) w_ = Tensor::empty({l.out, l.in});
    cast(sw_, w_.data<float>(), l.w, l.out * l.in);
  }

 private:
  // dst = qdq(src) with the scaler's delayed scale (the first use: from this tensor's own
  // amax), then records this amax (over the tp ranks: PrecisionContext::amax_group). Returns the
  // scale used.
  float cast(DelayedScaler& s, float* dst, const float* src, int64_t n) const {
    float amax = abs_max(src, n);
    if (ctx_->amax_group != nullptr) {  // the whole tensor's amax (a shard holds part of it)
      const Status st = comm::all_reduce(*ctx_->amax_group, &amax, &amax, 1, DType::kF32, comm::ReduceOp::kMax);
      KILN_CHECK_MSG(st.ok(), "fp8 amax reduction: {}", st.to_string());
    }
    const float scale = s.empty() ? (amax > 0 && std::isfinite(amax) ? fp8_max(s.kind()) / amax : 1.0f) : s.scale();
    fp8_quantize_dequantize(dst, src, n, scale, s.kind());
    s.record(amax);
    return scale;
  }

  std::shared_ptr<PrecisionContext> ctx_;
  mutable DelayedScaler sx_, sw_, sdy_;
  mutable float x_scale_ = 1.0f;
  Tensor w_;  // (out, in), E4M3 values (dequantized) as f32
};
}  // namespace

Expected<std::shared_ptr<PrecisionContext>> install_precision(Transformer& model, Precision p, int amax_history,
                                                              comm::Communicator* amax_group) {
  auto ctx = std::make_shared<PrecisionContext>();
  ctx->precision = p;
  ctx->amax_history = amax_history;
  if (p == Precision::kFP8) ctx->amax_group = amax_group;  // before the weights' first casts below
  if (p == Precision::kF32) return ctx;
  if (amax_history < 1) return invalid_argument("[precision] --amax-history {} must be >= 1", amax_history);
  std::vector<Linear*> lins = model.linears();
  for (Linear* l : lins)
    if (l->backend) return failed_precondition("[precision] {} already has a backend; {} cannot be combined with it", l->name, precision_name(p));
  for (Linear* l : lins) {
    switch (p) {
      case Precision::kBF16: l->backend = std::make_shared<Bf16Backend>(ctx); break;
      case Precision::kF16: l->backend = std::make_shared<F16Backend>(ctx); break;
      case Precision::kFP8: l->backend = std::make_shared<Fp8Backend>(ctx, amax_history); break;
      case Precision::kF32: break;
    }
    l->backend->sync(*l);
  }
  return ctx;
}

void sync_backends(Transformer& model) {
  for (Linear* l : model.linears())
    if (l->backend) l->backend->sync(*l);
}

}  // namespace kiln
