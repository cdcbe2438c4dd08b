// The quantized GEMMs' tile variants (kernels/cpu/quant_tiles.h) for the kernel harness: every
// candidate of every knob (the others at their defaults) against the reference, and against the
// default variant bit for bit, over 1..33 rows (decode, batch and prefill paths, every row
// remainder of the 4-, 6- and 8-row tiles), channel counts that leave partial 16-channel tiles
// and partial register tiles, Q8_0 / Q4_0 (VNNI and the 16-bit path) and weight-only int8 /
// int4 (zero-points) / f16.
//
// Tolerances: against the reference as in cases_block_quant_gemm.cpp (1e-10) and
// cases_quant_gemm.cpp (1e-9); against the default variant 0: a variant only changes which
// outputs share a pass, never the order of an output's sum. The harness runs each case on every
// SIMD target (AVX2 and scalar ignore the choice: trivially equal) and at 1-3 threads.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kiln/kernels/block_quant_gemm.h"
#include "kiln/kernels/cpu/quant_tiles.h"
#include "kiln/kernels/quant_gemm.h"
#include "tests/kernels/harness.h"
#include "tests/kernels/quant_test_util.h"

namespace kiln::testing {
namespace {

// Every candidate of every knob, the other knobs at their defaults (the default itself first).
std::vector<cpu::QuantTiles> variants() {
  std::vector<cpu::QuantTiles> v{cpu::QuantTiles{}};
  const auto add = [&](auto field, const auto& values) {
    for (const auto& x : values) {
      cpu::QuantTiles t;
      t.*field = x;
      if (!(t == cpu::QuantTiles{})) v.push_back(t);
    }
  };
  add(&cpu::QuantTiles::bq_decode, cpu::kBqDecodeTiles);
  add(&cpu::QuantTiles::bq_batch, cpu::kBqShapes);
  add(&cpu::QuantTiles::bq_prefill, cpu::kBqShapes);
  add(&cpu::QuantTiles::wo_gemv, cpu::kWoGemvChannels);
  add(&cpu::QuantTiles::wo_rows, cpu::kWoRowsChannels);
  return v;
}

// y under the given tiles (the process's choice restored after).
template <class F>
std::vector<float> run_with(const cpu::QuantTiles& t, std::vector<float> y, F&& run) {
  const cpu::QuantTiles saved = cpu::quant_tiles();
  cpu::set_quant_tiles(t);
  run(y.data());
  cpu::set_quant_tiles(saved);
  return y;
}

std::vector<Compare> compare_variants(const std::vector<float>& y_ref, const std::vector<float>& y_default,
                                      const std::vector<cpu::QuantTiles>& tiles, const std::vector<std::vector<float>>& ys,
                                      int64_t n, int64_t out, int64_t ldy, double ref_nmse) {
  std::vector<Compare> cmp = compare_strided("y default tiles", y_ref, y_default, n, out, ldy, ref_nmse);
  for (size_t v = 0; v < ys.size(); ++v) {
    const std::string name = cpu::quant_tiles_name(tiles[v]);
    for (Compare& c : compare_strided("y " + name, y_ref, ys[v], n, out, ldy, ref_nmse)) cmp.push_back(std::move(c));
    for (Compare& c : compare_strided("y " + name + " == default", y_default, ys[v], n, out, ldy, 0.0))
      cmp.push_back(std::move(c));
  }
  return cmp;
}

KernelCase make_block_case(QuantFormat f, int64_t n, int64_t out, int64_t in, bool vnni, uint64_t seed) {
  return {fmt::format("tiles block {} n={} out={} in={} vnni={}", quant_format_name(f), n, out, in, vnni), [=]() {
            Rng rng(seed);
            const OwnedQuantWeight src = random_quant_weight(rng, f, out, in, kQuantBlock, false);
            PackedBlockWeight packed;
            EXPECT_TRUE(pack_block_quant(src.w, &packed).ok());
            const int64_t ldx = in + 1, ldy = out + 2;
            const std::vector<float> x = random_vector(rng, static_cast<size_t>(n * ldx), -2.0f, 2.0f);
            const std::vector<float> bias = random_vector(rng, static_cast<size_t>(out));
            BlockQuantGemmParams p;
            p.w = &packed.w;
            p.n = n;
            p.x = x.data();
            p.ldx = ldx;
            p.ldy = ldy;
            p.bias = bias.data();
            const std::vector<float> blank(static_cast<size_t>(n * ldy), kPaddingSentinel);
            std::vector<float> y_ref = blank;
            p.y = y_ref.data();
            ref::block_quant_gemm(p);
            const auto run = [&](float* y) {
              p.y = y;
              cpu::set_block_quant_vnni_allowed(vnni);
              cpu::block_quant_gemm(p);
              cpu::set_block_quant_vnni_allowed(true);
            };
            const std::vector<cpu::QuantTiles> tiles = variants();
            const std::vector<float> y_default = run_with(tiles[0], blank, run);
            std::vector<std::vector<float>> ys;
            for (size_t v = 1; v < tiles.size(); ++v) ys.push_back(run_with(tiles[v], blank, run));
            return compare_variants(y_ref, y_default, {tiles.begin() + 1, tiles.end()}, ys, n, out, ldy, 1e-10);
          }};
}

KernelCase make_wo_case(QuantFormat f, int64_t n, int64_t out, int64_t in, int64_t group, bool zeros, uint64_t seed) {
  return {fmt::format("tiles weight-only {} n={} out={} in={} group={} zeros={}", quant_format_name(f), n, out, in,
                      group, zeros),
          [=]() {
            Rng rng(seed);
            const OwnedQuantWeight src = random_quant_weight(rng, f, out, in, group, zeros);
            const int64_t ldx = in + 3, ldy = out + 1;
            const std::vector<float> x = random_vector(rng, static_cast<size_t>(n * ldx));
            const std::vector<float> res = random_vector(rng, static_cast<size_t>(n * ldy));
            QuantGemmParams p;
            p.w = &src.w;
            p.n = n;
            p.x = x.data();
            p.ldx = ldx;
            p.ldy = ldy;
            p.residual = res.data();
            p.ldr = ldy;
            const std::vector<float> blank(static_cast<size_t>(n * ldy), kPaddingSentinel);
            std::vector<float> y_ref = blank;
            p.y = y_ref.data();
            ref::quant_gemm(p);
            const auto run = [&](float* y) {
              p.y = y;
              cpu::quant_gemm(p);
            };
            const std::vector<cpu::QuantTiles> tiles = variants();
            const std::vector<float> y_default = run_with(tiles[0], blank, run);
            std::vector<std::vector<float>> ys;
            for (size_t v = 1; v < tiles.size(); ++v) ys.push_back(run_with(tiles[v], blank, run));
            return compare_variants(y_ref, y_default, {tiles.begin() + 1, tiles.end()}, ys, n, out, ldy, 1e-9);
          }};
}

}  // namespace

KILN_KERNEL_CASES(quant_tiles) {
  std::vector<KernelCase> cases;
  uint64_t seed = 900;
  // Rows: decode (1), batch (2..15: every remainder of 4-, 6- and 8-row tiles), prefill (16+).
  const int64_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 15, 16, 17, 23, 33};
  // Channels: 1 tile, partial tiles, 3 / 5 / 9 / 17 tiles (tails of every register width).
  const int64_t outs[] = {7, 33, 70, 130, 275};
  int idx = 0;
  for (int64_t n : ns) {
    const int64_t out = outs[idx % 5];
    for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4})
      cases.push_back(make_block_case(f, n, out, idx % 3 == 0 ? 160 : 96, idx % 2 == 0, seed++));
    if (n < 16) {  // the weight-only tiles (16+ rows take the dequantized panels)
      cases.push_back(make_wo_case(QuantFormat::kInt8, n, out, 256, 256, false, seed++));
      cases.push_back(make_wo_case(QuantFormat::kInt4, n, outs[(idx + 2) % 5], 192, 64, true, seed++));
      cases.push_back(make_wo_case(QuantFormat::kF16, n, outs[(idx + 3) % 5], 128, 32, false, seed++));
    }
    ++idx;
  }
  // Many tiles at every path's row counts: several full passes of the widest register tiles
  // (8 decode tiles, 4-tile rows) and a tail of each width.
  for (int64_t n : {1, 2, 3, 5, 8, 13, 17, 30})
    for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kInt4})
      cases.push_back(make_block_case(f, n, 16 * 19 + 5, 64, n % 2 == 1, seed++));
  for (int64_t n : {1, 2, 5, 9})
    cases.push_back(make_wo_case(QuantFormat::kInt4, n, 16 * 5 + 3, 128, 128, true, seed++));
  // Long reductions at decode and batch sizes.
  for (int64_t n : {1, 8}) {
    cases.push_back(make_block_case(QuantFormat::kInt4, n, 200, 2048, true, seed++));
    cases.push_back(make_wo_case(QuantFormat::kInt8, n, 100, 2048, 2048, false, seed++));
  }
  return cases;
}

}  // namespace kiln::testing
