// GPTQ: damped Hessian, upper Cholesky of its inverse, blocked column-wise quantization with
// error feedback.
#include "kiln/quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/core/thread_pool.h"
#include "kiln/kernels/gemm.h"

namespace kiln::quant {

bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int64_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    const double ljj = std::sqrt(d);
    a[j * n + j] = ljj;
    const double inv = 1.0 / ljj;
    parallel_for(n - j - 1, 64, [&](int64_t i0, int64_t i1) {
      for (int64_t i = j + 1 + i0; i < j + 1 + i1; ++i) {
        double s = a[i * n + j];
        const double* ri = &a[i * n];
        const double* rj = &a[j * n];
        for (int64_t k = 0; k < j; ++k) s -= ri[k] * rj[k];
        a[i * n + j] = s * inv;
      }
    });
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) a[i * n + j] = 0;
  return true;
}

bool inverse_upper_cholesky(const std::vector<double>& h, int64_t n, std::vector<double>& u) {
  std::vector<double> l = h;
  if (!cholesky_lower(l, n)) return false;
  // Linv = L⁻¹ (lower), column by column of forward substitution; stored transposed in m so
  // that m[j*n + i] = Linv[i][j] for i >= j (rows of m are contiguous columns of Linv).
  std::vector<double> m(static_cast<size_t>(n * n), 0.0);
  parallel_for(n, 8, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double* x = &m[j * n];  // solve L x = e_j; x[i] = 0 for i < j
      for (int64_t i = j; i < n; ++i) {
        double s = i == j ? 1.0 : 0.0;
        const double* li = &l[i * n];
        for (int64_t k = j; k < i; ++k) s -= li[k] * x[k];
        x[i] = s / li[i];
      }
    }
  });
  // H⁻¹ = Linvᵀ Linv: (H⁻¹)[a][b] = Σ_k Linv[k][a] Linv[k][b] = Σ_k m[a][k] m[b][k], k >= max(a, b).
  std::vector<double> hinv(static_cast<size_t>(n * n));
  parallel_for(n, 8, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a)
      for (int64_t b = 0; b <= a; ++b) {
        double s = 0;
        const double* ma = &m[a * n];
        const double* mb = &m[b * n];
        for (int64_t k = a; k < n; ++k) s += ma[k] * mb[k];
        hinv[a * n + b] = s;
      }
  });
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = a + 1; b < n; ++b) hinv[a * n + b] = hinv[b * n + a];
  if (!cholesky_lower(hinv, n)) return false;
  u.assign(static_cast<size_t>(n * n), 0.0);  // U = L2ᵀ
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) u[j * n + i] = hinv[i * n + j];
  return true;
}

double layer_output_error(const float* w, const float* wq, int64_t rows, int64_t cols, const float* h) {
  std::vector<double> per_row(static_cast<size_t>(rows), 0.0);
  parallel_for(rows, 4, [&](int64_t r0, int64_t r1) {
    std::vector<double> d(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) d[c] = static_cast<double>(w[r * cols + c]) - wq[r * cols + c];
      double e = 0;
      for (int64_t i = 0; i < cols; ++i) {
        if (d[i] == 0) continue;
        double s = 0;
        for (int64_t j = 0; j < cols; ++j) s += static_cast<double>(h[i * cols + j]) * d[j];
        e += d[i] * s;
      }
      per_row[r] = 0.5 * e;
    }
  });
  double e = 0;
  for (double v : per_row) e += v;
  return e;
}

Expected<GptqResult> gptq_quantize(const float* w, int64_t rows, int64_t cols, const float* h, const QuantScheme& s,
                                   const GptqOptions& o) {
  KILN_RETURN_IF_ERROR(check_scheme(s, cols));
  if (s.format != QFormat::kInt) return invalid_argument("[gptq] integer schemes only, got {}", s.describe());
  if (o.block <= 0) return invalid_argument("[gptq] block size {} must be positive", o.block);
  const int64_t n = cols;
  // Working copy, transposed: wt[c] is input column c as a contiguous (rows,) vector.
  std::vector<float> wt(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) wt[c * rows + r] = w[r * cols + c];
  std::vector<double> hd(h, h + n * n);
  for (int64_t c = 0; c < n; ++c) {
    if (hd[c * n + c] == 0) {  // a dead input: never active in calibration
      hd[c * n + c] = 1;
      std::fill(wt.begin() + c * rows, wt.begin() + (c + 1) * rows, 0.0f);
    }
  }
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (o.act_order)
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return hd[a * n + a] > hd[b * n + b]; });
  std::vector<int64_t> inv_perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) inv_perm[perm[i]] = i;
  // Permuted working copies.
  std::vector<float> wp(static_cast<size_t>(n * rows));
  for (int64_t i = 0; i < n; ++i) std::copy_n(wt.begin() + perm[i] * rows, rows, wp.begin() + i * rows);
  std::vector<double> hp(static_cast<size_t>(n * n));
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) hp[i * n + j] = hd[perm[i] * n + perm[j]];
    mean_diag += hp[i * n + i];
  }
  mean_diag /= static_cast<double>(n);
  std::vector<double> ud;
  double damp = o.damp * mean_diag;
  bool ok = false;
  for (int attempt = 0; attempt < 6 && !ok; ++attempt, damp *= 10) {
    std::vector<double> hdamp = hp;
    for (int64_t i = 0; i < n; ++i) hdamp[i * n + i] += damp;
    ok = inverse_upper_cholesky(hdamp, n, ud);
    if (ok) break;
  }
  if (!ok) return failed_precondition("[gptq] H + λI is not positive definite for a ({}, {}) weight", rows, cols);
  std::vector<float> u(ud.begin(), ud.end());

  GptqResult res;
  res.damp_used = damp;
  QTensor& t = res.q;
  t.scheme = s;
  t.rows = rows;
  t.cols = cols;
  t.codes.assign(static_cast<size_t>(rows * cols), 0);
  const int64_t gpr = t.groups_per_row(), gs = t.group_size();
  const bool per_tensor = s.group == QuantScheme::kPerTensor;
  t.scales.assign(per_tensor ? 1 : static_cast<size_t>(rows * gpr), 1.0f);
  t.zeros.assign(t.scales.size(), 0.0f);
  std::vector<char> group_ready(static_cast<size_t>(gpr), 0);
  // Per-channel and per-tensor parameters come from the whole original weight, up front.
  if (s.group <= 0) {
    QTensor r = quantize_rtn(w, rows, cols, s);
    t.scales = r.scales;
    t.zeros = r.zeros;
    std::fill(group_ready.begin(), group_ready.end(), 1);
  }
  std::vector<float> gvals(static_cast<size_t>(gs));
  std::vector<float> err(static_cast<size_t>(o.block * rows));  // (block, rows)
  for (int64_t i1 = 0; i1 < n; i1 += o.block) {
    const int64_t i2 = std::min(i1 + o.block, n), nb = i2 - i1;
    for (int64_t i = i1; i < i2; ++i) {
      const int64_t c = perm[i];
      const int64_t g = c / gs;
      if (!group_ready[g]) {
        // Parameters of group g from its columns' current values (none quantized yet).
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t k = 0; k < gs; ++k) gvals[k] = wp[inv_perm[g * gs + k] * rows + r];
          float lo, hi;
          choose_range(s, gvals, lo, hi);
          const QParams p = params_for_range(s, lo, hi);
          t.scales[r * gpr + g] = p.scale;
          t.zeros[r * gpr + g] = p.zero;
        }
        group_ready[g] = 1;
      }
      float* col = &wp[i * rows];
      const float d = u[i * n + i];
      float* e = &err[(i - i1) * rows];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t pi = t.param_index(r, c);
        const QParams p{t.scales[pi], t.zeros[pi]};
        const uint8_t q = quantize_value(s, p, col[r]);
        t.codes[r * cols + c] = q;
        const float diff = col[r] - dequantize_value(s, p, q);
        e[r] = diff / d;
        res.loss += 0.5 * static_cast<double>(diff) * diff / (static_cast<double>(d) * d);
      }
      // Within the block: column j -= err · U[i][j].
      parallel_for(i2 - i - 1, 16, [&](int64_t j0, int64_t j1) {
        for (int64_t j = i + 1 + j0; j < i + 1 + j1; ++j) {
          const float uij = u[i * n + j];
          float* cj = &wp[j * rows];
          for (int64_t r = 0; r < rows; ++r) cj[r] -= e[r] * uij;
        }
      });
    }
    if (i2 < n) {
      // Lazy batch update: wp[i2:n] (n−i2, rows) −= U[i1:i2, i2:n]ᵀ (n−i2, nb) · err (nb, rows).
      GemmParams p;
      p.m = n - i2; p.n = rows; p.k = nb;
      p.a = &u[i1 * n + i2]; p.lda = n; p.trans_a = true;
      p.b = err.data(); p.ldb = rows;
      p.c = &wp[i2 * rows]; p.ldc = rows;
      p.alpha = -1.0f; p.beta = 1.0f;
      cpu::gemm(p);
    }
  }
  return res;
}

}  // namespace kiln::quant
