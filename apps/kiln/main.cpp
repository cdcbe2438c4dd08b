// kiln: one CLI for training, generation, serving, quantization, benchmarks and profiling.
// Every error ends here as one message naming what was wrong and a non-zero exit: flags and
// environment variables are checked before any work (and so before any MPI communication, which
// gives every rank of a job the same verdict); an exception that escapes a subcommand is reported,
// never left to std::terminate.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/kiln/commands.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/env.h"
#include "kiln/core/thread_pool.h"
#include "kiln/kernels/cpu/gemm_cpu.h"

namespace {

constexpr int kInternalError = 1;  // an exception or out of memory: not the user's input alone

// CLI11's Range lets NaN through (every comparison with NaN is false) and options without a
// Range take anything strtod reads, "nan" and "inf" included: every floating-point flag of every
// subcommand refuses NaN here; inf is refused by each flag's Range (--rate inf is meaningful).
void refuse_nan_in_float_flags(CLI::App& app) {
  const CLI::Validator not_nan(
      [](std::string& s) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return end != s.c_str() && std::isnan(v) ? "Value " + s + " is not a number (NaN)" : std::string();
      },
      "", "not NaN");
  for (CLI::Option* o : app.get_options())  // "FLOAT", then the descriptions of its validators
    if (o->get_type_name().rfind("FLOAT", 0) == 0) o->check(not_nan);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_nan_in_float_flags(*sub);
}

// "kiln train", "kiln bench gemm": the subcommands this run parsed, for messages.
std::string command_path(CLI::App& app) {
  std::string path = "kiln";
  for (CLI::App* a = &app;;) {
    const auto subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    path += " " + a->get_name();
  }
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln: train, parallelize, quantize, serve and measure transformer language models"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  int threads = 0;
  std::string simd;
  app.add_option("--threads", threads, "Worker threads for every kernel (default: all CPUs, or KILN_NUM_THREADS)")
      ->check(CLI::Range(1, static_cast<int>(kiln::kMaxThreads)));
  app.add_option("--simd", simd, "Force a lower SIMD target (also KILN_SIMD)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  bool no_autotune = false;
  app.add_flag("--no-autotune", no_autotune,
               "Never time GEMM blockings at first use on a new CPU (also KILN_AUTOTUNE=0): the cache model's blocking, or the tune file's");
  // Runs after every flag of every subcommand parsed and passed its checks, before any subcommand.
  app.parse_complete_callback([&] {
    if (kiln::Status st = kiln::validate_environment(); !st.ok()) {
      std::fprintf(stderr, "kiln: %s\n", st.message().c_str());
      throw CLI::RuntimeError(kiln::app::kUserError);
    }
    if (threads > 0) {
      kiln::set_num_threads(threads);
    } else if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
               local != nullptr && std::getenv("KILN_NUM_THREADS") == nullptr) {
      // Under mpirun the ranks of one machine share its cores: each takes its part.
      const int ranks = std::max(1, std::atoi(local));
      kiln::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks));
    }
    // First-use autotune (kernels/cpu/gemm_cpu.h): on unless switched off; the value was validated above.
    const auto autotune_env = kiln::env_choice("KILN_AUTOTUNE", kiln::kAutotuneChoices);
    kiln::cpu::set_first_use_autotune(!no_autotune && !(autotune_env.ok() && *autotune_env && **autotune_env == "0"));
    if (!simd.empty()) {
      for (const auto& info : kiln::kSimdTargets) {
        if (info.name == simd && !kiln::set_simd_target(info.target)) {
          std::fprintf(stderr, "kiln: --simd %s is not supported by this CPU\n", simd.c_str());
          throw CLI::RuntimeError(kiln::app::kUserError);
        }
      }
    }
  });

  kiln::app::register_info(app);
  kiln::app::register_bench(app);
  kiln::app::register_bench_attention(app);
  kiln::app::register_tokenizer(app);
  kiln::app::register_train(app);
  kiln::app::register_bench_tokenizer(app);
  kiln::app::register_comm(app);  // after bench: adds `bench comm` and `plan comm`
  kiln::app::register_plan_tp(app);  // after comm: adds `plan tp`
  kiln::app::register_plan_pp(app);  // after comm: adds `plan pp`
  kiln::app::register_plan_cp(app);  // after comm: adds `plan cp`
  kiln::app::register_eval(app);
  kiln::app::register_bench_train(app);  // after bench: adds `bench train`
  kiln::app::register_bench_offload(app);  // after bench: adds `bench offload`
  kiln::app::register_bench_numerics(app);  // after bench: adds `bench numerics`
  kiln::app::register_serve(app);
  kiln::app::register_bench_serve(app);  // after bench: adds `bench serve`
  kiln::app::register_quantize(app);  // after bench: adds `bench quant-decode`
  kiln::app::register_convert(app);
  kiln::app::register_bench_quant(app);  // after bench: adds `bench quant`
  kiln::app::register_bench_prepacked(app);  // after bench: adds `bench prepacked`
  kiln::app::register_bench_grouped_gemm(app);  // after bench: adds `bench grouped-gemm`
  kiln::app::register_bench_moe(app);  // after bench: adds `bench moe`
  kiln::app::register_profile(app);  // `profile` and `roofline`
  refuse_nan_in_float_flags(app);  // after every register_*: covers every subcommand's flags

  const kiln::app::ProfileCommand profile = kiln::app::take_profile_command(argc, argv);
  if (!profile.error.empty()) {
    std::fprintf(stderr, "%s\n", profile.error.c_str());
    return kiln::app::kUserError;
  }
  std::vector<char*> args;  // the command line, with `profile` rewritten (see commands.h)
  for (const std::string& a : profile.args) args.push_back(const_cast<char*>(a.c_str()));
  try {
    app.parse(static_cast<int>(args.size()), args.data());
    if (profile.active) return kiln::app::print_profile_summary(profile);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports an unknown command as "A subcommand is required": name the word instead.
    if (dynamic_cast<const CLI::RequiredError*>(&e) && app.get_subcommands().empty() && !app.remaining().empty()) {
      std::fprintf(stderr, "kiln: unknown command '%s' (see kiln --help)\n", app.remaining().front().c_str());
      return e.get_exit_code();
    }
    return app.exit(e);  // names the flag; a subcommand's own error was printed before its throw
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory\n", command_path(app).c_str());
    return kInternalError;
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "%s: unexpected JSON: %s\n", command_path(app).c_str(), e.what());
    return kInternalError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", command_path(app).c_str(), e.what());
    return kInternalError;
  } catch (...) {
    std::fprintf(stderr, "%s: unknown error\n", command_path(app).c_str());
    return kInternalError;
  }
  return 0;
}
