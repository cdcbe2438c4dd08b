// The `kiln` CLI: each subcommand registers itself from its own cmd_*.cpp file.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/graph.h"
#include "kiln/model/transformer.h"
#include "kiln/quant/qmodel.h"

namespace kiln::app {

void register_info(CLI::App& app);
// `kiln info --cuda` (cmd_info_cuda.cpp): adds its flags to `info` (after info's --seq, which it
// reads too); the function returned runs it and says true when --cuda was given.
std::function<bool()> add_info_cuda(CLI::App* info);
void register_bench(CLI::App& app);
void register_tokenizer(CLI::App& app);
void register_train(CLI::App& app);
void register_bench_tokenizer(CLI::App& app);  // after register_bench
void register_comm(CLI::App& app);  // `bench comm` and `plan comm` (cmd_comm.cpp)
void register_bench_attention(CLI::App& app);  // `bench attention` (cmd_bench_attention.cpp)
void register_eval(CLI::App& app);         // `eval` (cmd_eval.cpp)
void register_bench_train(CLI::App& app);  // `bench train`, after register_bench (cmd_bench_train.cpp)
void register_bench_offload(CLI::App& app);  // `bench offload`, after register_bench (cmd_bench_offload.cpp)
void register_bench_numerics(CLI::App& app);  // `bench numerics`, after register_bench (cmd_bench_numerics.cpp)
void register_serve(CLI::App& app);  // `serve` (cmd_serve.cpp)
void register_bench_serve(CLI::App& app);  // `bench serve`, after register_bench (cmd_bench_serve.cpp)
void register_quantize(CLI::App& app);  // `quantize` and `bench quant-decode`, after register_bench (cmd_quantize.cpp)
void register_convert(CLI::App& app);       // `convert` (cmd_convert.cpp)
void register_bench_quant(CLI::App& app);   // `bench quant`, after register_bench (cmd_bench_quant.cpp)
void register_bench_prepacked(CLI::App& app);  // `bench prepacked`, after register_bench (cmd_bench_prepacked.cpp)
void register_bench_grouped_gemm(CLI::App& app);  // `bench grouped-gemm`, after register_bench (cmd_bench_grouped_gemm.cpp)
void register_bench_moe(CLI::App& app);  // `bench moe`, after register_bench (cmd_bench_moe.cpp)
void register_bench_dp(CLI::App& app);  // `bench dp`, called by register_bench (cmd_bench_dp.cpp)
void register_bench_tp_decode(CLI::App& app);  // `bench tp-decode`, called by register_bench (cmd_bench_tp_decode.cpp)
void register_bench_tp(CLI::App& app);  // `bench tp`, called by register_bench (cmd_bench_tp.cpp)
void register_bench_pp(CLI::App& app);  // `bench pp`, called by register_bench (cmd_bench_pp.cpp)
void register_bench_cp(CLI::App& app);  // `bench cp`, called by register_bench (cmd_bench_cp.cpp)
void register_bench_mla_decode(CLI::App& app);  // `bench mla-decode`, called by register_bench (cmd_bench_mla_decode.cpp)
void register_bench_graph(CLI::App& app);  // `bench graph`, called by register_bench (cmd_bench_graph.cpp)
void register_bench_train_graph(CLI::App& app);  // `bench train-graph` (cmd_bench_train_graph.cpp)
void register_bench_launch(
    CLI::App& app);  // `bench launch`, called by register_bench (cmd_bench_launch.cpp)
void register_bench_fusion(CLI::App& app);  // `bench fusion`, called by register_bench (cmd_bench_fusion.cpp)
void register_plan_tp(CLI::App& app);   // `plan tp`, after register_comm (cmd_plan_tp.cpp)
void register_plan_pp(CLI::App& app);   // `plan pp`, after register_comm (cmd_plan_pp.cpp)
void register_plan_cp(CLI::App& app);   // `plan cp`, after register_comm (cmd_plan_cp.cpp)

void register_profile(CLI::App& app);  // `profile` and `roofline` (cmd_profile.cpp)

// `kiln profile [--out FILE] [--svg FILE] CMD ...`: main runs `kiln CMD ... --profile FILE` in its
// place, then print_profile_summary. Other command lines pass through unchanged.
// --graph fused: perf/graph_fusion.h's pass, printing each graph's fused chains (cmd_profile.cpp).
graph::GraphPass graph_fusion_pass();
// --graph eager|capture|fused of train, generate and serve: capture the steps unless eager, and
// run graph_fusion_pass() on each graph when fused.
void apply_graph_mode(const std::string& mode, bool& capture, graph::GraphPass& pass);

struct ProfileCommand {
  bool active = false;
  std::string error;  // `kiln profile` without a command that takes --profile
  std::string trace_path = "kiln-profile.json", svg_path;
  std::vector<std::string> args;  // the command line to parse
};
ProfileCommand take_profile_command(int argc, char** argv);
int print_profile_summary(const ProfileCommand& pc);  // rank 0 prints; 0 or kUserError

// `--tp T` of serve and generate (mpirun -np T, cmd_serve.cpp): replaces `model` with this
// rank's shard. Rank 0 returns true and runs the engine; ranks 1.. run rank 0's steps until its
// engine stops, finalize MPI and return false. A bad --tp is one message, alike on every rank.
// `quantized`: a kiln-quantized model's weights (generate), sliced with it.
bool serve_tensor_parallel(std::unique_ptr<Transformer>& model, int tp, const char* cmd,
                           const quant::QuantizedState* quantized = nullptr);

// Exit code for a subcommand that failed on user input (message already printed).
inline constexpr int kUserError = 2;

}  // namespace kiln::app
