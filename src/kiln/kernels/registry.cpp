// The list behind `kiln info`: one line per kernel family, asking each for its picked path.
#include "kiln/kernels/registry.h"

#include <fmt/format.h>

#include "kiln/core/cpu_features.h"
#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/cpu/attention_tiles.h"
#include "kiln/kernels/cpu/gemm_cpu.h"
#include "kiln/kernels/cpu/ops_paths.h"
#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/kernels/gemm_f16.h"
#include "kiln/kernels/quant_gemm.h"

namespace kiln {

std::vector<KernelPath> kernel_paths() {
  std::vector<KernelPath> out;
  out.push_back({"active SIMD target", std::string(simd_target_name(active_simd_target()))});
  out.push_back({"gemm f32", cpu::gemm_path_name(cpu::GemmPath::kF32)});
  out.push_back({"gemm bf16", cpu::gemm_path_name(cpu::GemmPath::kBF16) + " (" + cpu::bf16_gemm_choice() + ")"});
  const cpu::GemmBlocking f = cpu::gemm_blocking(cpu::GemmPath::kF32), b = cpu::gemm_blocking(cpu::GemmPath::kBF16);
  out.push_back({"gemm blocking", fmt::format("f32 mc={} kc={} nc={}, bf16 mc={} kc={} nc={} ({})", f.mc, f.kc, f.nc,
                                              b.mc, b.kc, b.nc, cpu::gemm_blocking_source())});
  out.push_back({"gemm f16 (fp16 math)", cpu::gemm_f16_path_name()});
  out.push_back({"gemm m<=8 (decode)", cpu::gemm_small_m_name()});
  out.push_back({"gemm w8/w4/fp8 a32", cpu::quant_gemm_path_name()});
  out.push_back({"gemm w8a8 int8", cpu::w8a8_path_name()});
  out.push_back({"gemm q8_0/q4_0 (block)", cpu::block_quant_path_name()});
  out.push_back({"quant tiles", fmt::format("{} ({}{})", cpu::quant_tiles_name(cpu::quant_tiles()), cpu::quant_tiles_source(),
                                            active_simd_target() == SimdTarget::kAvx512 ? "" : "; this target has one shape")});
  cpu::append_op_kernel_paths(out);  // norms, softmax, activations, rope, embedding, CE, adamw
  const cpu::FlashTileChoice t = cpu::flash_tiles();
  out.push_back({"attention", fmt::format("{} flash tiles fwd {} bwd {} ({}); split-KV decode (<=8 queries, key-group "
                                          "row kernel); naive TxT scores (--attention naive)",
                                          simd_target_name(active_simd_target()), cpu::flash_tiles_name(t.fwd),
                                          cpu::flash_tiles_name(t.bwd), cpu::flash_tiles_source())});
  return out;
}

}  // namespace kiln
