// `kiln bench attention --device cuda` (attention_cuda_bench.h). Compiled only with the CUDA
// backend.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench/attention_cuda_bench.h"
#include "bench/bench_util.h"
#include "bench/cuda_bench_util.h"
#include "kiln/core/device.h"
#include "kiln/core/rng.h"
#include "kiln/core/tensor.h"
#include "kiln/kernels/attention.h"
#include "kiln/kernels/cuda/kernels.h"

namespace kiln::bench {
namespace {

constexpr int64_t kHeads = 12, kHeadDim = 64;

Tensor on_device(const std::vector<float>& x) {
  return Tensor::from_floats({static_cast<int64_t>(x.size())}, x).value().to(Device::kCuda).value();
}

}  // namespace

int run_attention_cuda_bench(const AttentionCudaBenchOptions& opt) {
  if (!cuda_available()) {
    std::fprintf(stderr, "kiln bench attention --device cuda: no CUDA device here\n");
    return 1;
  }
  if (!opt.json)
    std::printf("CUDA FlashAttention (W5): causal fp32, batch 1, %lld heads, head_dim %lld; median of %d, "
                "checked against kiln's CPU flash kernels\n%6s | %10s %10s | %9s | %10s %10s\n",
                static_cast<long long>(kHeads), static_cast<long long>(kHeadDim), opt.reps, "T", "fwd ms",
                "f+b ms", "fwd TF/s", "nmse out", "nmse grad");
  int failures = 0;
  for (const int64_t T : opt.seq_lens) {
    AttentionParams p;
    p.q_len = p.kv_len = T;
    p.n_heads = p.n_kv_heads = kHeads;
    p.head_dim = kHeadDim;
    p.causal = true;
    p = check_attention(p).value();
    const auto n = static_cast<size_t>(T * kHeads * kHeadDim);
    std::vector<float> q(n), k(n), v(n), dout(n), out(n), lse(static_cast<size_t>(kHeads * T)), dq(n), dk(n), dv(n);
    Rng rng(static_cast<uint64_t>(T));
    for (std::vector<float>* x : {&q, &k, &v, &dout}) rng.fill_uniform(*x);
    cpu::attention_forward_flash(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
    cpu::attention_backward_flash(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                  out.data(), lse.data(), p);
    // The same inputs on the device (g_*: its gradients).
    const Tensor d_q = on_device(q), d_k = on_device(k), d_v = on_device(v), d_dout = on_device(dout);
    const Tensor d_out = on_device(std::vector<float>(n)), d_lse = on_device(std::vector<float>(lse.size()));
    const Tensor g_q = on_device(std::vector<float>(n)), g_k = on_device(std::vector<float>(n)),
                 g_v = on_device(std::vector<float>(n));
    const auto forward = [&] {
      return cuda::attention_forward(d_out.data<float>(), d_lse.data<float>(), d_q.data<float>(), d_k.data<float>(),
                                     d_v.data<float>(), p);
    };
    const auto backward = [&] {
      return cuda::attention_backward(g_q.data<float>(), g_k.data<float>(), g_v.data<float>(), d_dout.data<float>(),
                                      d_q.data<float>(), d_k.data<float>(), d_v.data<float>(), d_out.data<float>(),
                                      d_lse.data<float>(), p);
    };
    Status st = forward();
    if (st.ok()) st = backward();
    if (!st.ok()) {
      std::fprintf(stderr, "kiln bench attention --device cuda: T=%lld: %s\n", static_cast<long long>(T),
                   st.message().c_str());
      ++failures;
      continue;
    }
    const double e_out = nmse(out, host_floats(d_out));
    const double e_grad = std::max({nmse(dq, host_floats(g_q)), nmse(dk, host_floats(g_k)), nmse(dv, host_floats(g_v))});
    // f32 in another summation order: ~1e-12; a wrong index, tile or race: ~1.
    const bool wrong = !(e_out < 1e-8 && e_grad < 1e-8);
    failures += wrong;
    std::vector<double> fwd_ms, fb_ms;
    for (int r = 0; r < std::max(1, opt.reps); ++r) {
      fwd_ms.push_back(cuda_event_ms([&] { (void)forward(); }));
      fb_ms.push_back(cuda_event_ms([&] {
        (void)forward();
        (void)backward();
      }));
    }
    const double f = summarize(fwd_ms).median, fb = summarize(fb_ms).median;
    const double tflops = attention_forward_cost(p).flops / (f * 1e-3) / 1e12;
    if (opt.json) {
      for (const auto& [pass, ms] : {std::pair{"fwd", f}, std::pair{"fwd+bwd", fb}})
        std::printf("%s\n", fmt::format("{{\"bench\": \"attention\", \"impl\": \"flash\", \"device\": \"cuda\", "
                                        "\"T\": {}, \"pass\": \"{}\", \"ms\": {:.4f}, \"nmse_out\": {:.3g}, "
                                        "\"nmse_grad\": {:.3g}, \"status\": \"{}\"}}",
                                        T, pass, ms, e_out, e_grad, wrong ? "WRONG" : "ok")
                                .c_str());
    } else {
      std::printf("%6lld | %10.3f %10.3f | %9.1f | %10.3g %10.3g%s\n", static_cast<long long>(T), f, fb, tflops, e_out,
                  e_grad, wrong ? "  WRONG" : "");
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace kiln::bench
