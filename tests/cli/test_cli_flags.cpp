// Runs the `kiln` binary with bad flags and bad environment variables: each must end in a
// non-zero exit, a message naming the flag or variable, and no crash (signal, std::terminate,
// KILN_CHECK abort), before any work starts (a case still running after the timeout fails).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct RunResult {
  bool exited = false;  // normal exit (not a signal, not our timeout)
  int code = -1;
  int signal = 0;
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};

// Runs KILN_EXE with args and the extra environment entries ("NAME=value"); kills it after
// timeout_s. Output is read while it runs, so a full pipe never blocks the child.
RunResult run_kiln(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                   int timeout_s = 60) {
  std::vector<std::string> argv_s = {KILN_EXE};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool overridden = false;
    for (const auto& x : env) overridden |= kv.substr(0, kv.find('=') + 1) == x.substr(0, x.find('=') + 1);
    if (!overridden) env_s.push_back(kv);
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  RunResult r;
  if (pipe(fds) != 0) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    r.output = std::string("posix_spawn failed: ") + std::strerror(rc);
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child closed its output (exited)
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!r.timed_out && WIFEXITED(status)) {
    r.exited = true;
    r.code = WEXITSTATUS(status);
  }
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

struct BadCase {
  std::vector<std::string> args;
  std::string names;  // the message must contain this (the flag or variable)
  std::vector<std::string> env = {};
};

std::string describe(const BadCase& c) {
  std::string s;
  for (const auto& e : c.env) s += e + " ";
  s += "kiln";
  for (const auto& a : c.args) s += " " + a;
  return s;
}

void expect_clean_refusal(const BadCase& c) {
  SCOPED_TRACE(describe(c));
  const RunResult r = run_kiln(c.args, c.env);
  EXPECT_FALSE(r.timed_out) << "still running after the timeout: the bad value was accepted\n" << r.output;
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << " (" << strsignal(r.signal) << ")\n" << r.output;
  EXPECT_TRUE(r.exited && r.code != 0) << "exit code " << r.code << "\n" << r.output;
  EXPECT_NE(r.output.find(c.names), std::string::npos) << "the message does not name " << c.names << ":\n" << r.output;
  for (const char* crash : {"terminate called", "Aborted", "KILN_CHECK", "Check failed", "runtime error:"})
    EXPECT_EQ(r.output.find(crash), std::string::npos) << "crash marker '" << crash << "':\n" << r.output;
}

const std::string kTokenizer = std::string(KILN_SOURCE_DIR) + "/tests/reference/kiln_tokenizer.json";

TEST(CliFlags, GoodRunsSucceed) {  // the harness itself: a valid command exits 0
  RunResult r = run_kiln({"info"});
  EXPECT_TRUE(r.exited && r.code == 0) << r.output;
  r = run_kiln({"info"}, {"KILN_NUM_THREADS=1", "KILN_SIMD=scalar", "KILN_PIN_THREADS=off"});
  EXPECT_TRUE(r.exited && r.code == 0) << r.output;
  r = run_kiln({"info", "--cuda", "--gpu", "b200", "--shape", "512,1024,256", "--seq", "8192"});
  EXPECT_TRUE(r.exited && r.code == 0) << r.output;
  EXPECT_NE(r.output.find("gemm m,n,k = 512,1024,256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("seq 8192"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("B200"), std::string::npos) << r.output;
}

TEST(CliFlags, BadFloatsAreRefused) {
  const std::vector<BadCase> cases = {
      {{"train", "--lr", "nan"}, "--lr"},
      {{"train", "--lr", "NaN"}, "--lr"},
      {{"train", "--lr", "inf"}, "--lr"},
      {{"train", "--lr", "-1"}, "--lr"},
      {{"train", "--lr", "1e400"}, "--lr"},
      {{"train", "--lr", "0.1x"}, "--lr"},
      {{"train", "--minutes", "nan"}, "--minutes"},
      {{"train", "--weight-decay", "nan"}, "--weight-decay"},
      {{"train", "--clip", "nan"}, "--clip"},
      {{"train", "--clip", "inf"}, "--clip"},
      {{"train", "--loss-scale", "nan"}, "--loss-scale"},
      {{"train", "--loss-scale", "-2"}, "--loss-scale"},
      {{"train", "--loss-scale", "inf"}, "--loss-scale"},
      {{"train", "--loss-scale-init", "nan"}, "--loss-scale-init"},
      {{"generate", "--model", "no-such-dir", "--temperature", "nan"}, "--temperature"},
      {{"generate", "--model", "no-such-dir", "--temperature", "-1"}, "--temperature"},
      {{"generate", "--model", "no-such-dir", "--top-p", "nan"}, "--top-p"},
      {{"generate", "--model", "no-such-dir", "--top-p", "1.5"}, "--top-p"},
      {{"quantize", "--model", "no-such-dir", "--alpha", "nan"}, "--alpha"},
      {{"serve", "--model", "no-such-dir", "--kv-cache-mem", "nan"}, "--kv-cache-mem"},
      {{"serve", "--model", "no-such-dir", "--kv-cache-mem", "inf"}, "--kv-cache-mem"},
      {{"serve", "--model", "no-such-dir", "--kv-cache-mem", "-1G"}, "--kv-cache-mem"},
      {{"bench", "serve", "--rate", "nan"}, "--rate"},
      {{"bench", "serve", "--rate", "-1"}, "--rate"},
      {{"bench", "serve", "--timeout", "nan"}, "--timeout"},
      {{"bench", "serve", "--timeout", "inf"}, "--timeout"},
      {{"bench", "serve", "--timeout", "-1"}, "--timeout"},
      {{"bench", "serve", "--slo-ttft", "nan"}, "--slo-ttft"},
      {{"bench", "serve", "--slo-tpot", "inf"}, "--slo-tpot"},
      {{"bench", "serve", "--temperature", "nan"}, "--temperature"},
      {{"bench", "numerics", "--max-n", "nan"}, "--max-n"},
      {{"plan", "comm", "--topology", "h100-node", "--ranks", "8", "--size", "nan"}, "--size"},
      {{"plan", "comm", "--topology", "h100-node", "--ranks", "8", "--size", "-1"}, "--size"},
      {{"plan", "tp", "--gemm-efficiency", "nan"}, "--gemm-efficiency"},
      {{"plan", "tp", "--gemm-efficiency", "2"}, "--gemm-efficiency"},
      {{"plan", "tp", "--tflops", "-1"}, "--tflops"},
      {{"plan", "cp", "--efficiency", "nan"}, "--efficiency"},
      {{"plan", "cp", "--tflops", "-1"}, "--tflops"},
      {{"plan", "pp", "--ranks", "4", "--forward-ms", "nan"}, "--forward-ms"},
      {{"plan", "pp", "--ranks", "4", "--comm-ms", "-1"}, "--comm-ms"},
      {{"plan", "pp", "--ranks", "4", "--schedule", "zb-h1", "--weight-ms", "3"}, "--weight-ms"},  // W > B + W
  };
  for (const BadCase& c : cases) expect_clean_refusal(c);
}

TEST(CliFlags, BadIntegersAreRefused) {
  const std::vector<BadCase> cases = {
      {{"train", "--batch", "0"}, "--batch"},
      {{"train", "--batch", "-4"}, "--batch"},
      {{"train", "--batch", "99999999999999999999"}, "--batch"},
      {{"train", "--seq", "0"}, "--seq"},
      {{"train", "--preset", "gpt2-124m", "--seq", "100000"}, "--seq"},  // past the learned position table
      {{"train", "--steps", "-5"}, "--steps"},
      {{"train", "--grad-accum", "0"}, "--grad-accum"},
      {{"train", "--vocab-size", "3"}, "--vocab-size"},
      {{"train", "--eval-batches", "0"}, "--eval-batches"},
      {{"generate", "--model", "no-such-dir", "--max-tokens", "0"}, "--max-tokens"},
      {{"generate", "--model", "no-such-dir", "--samples", "0"}, "--samples"},
      {{"generate", "--model", "no-such-dir", "--num-speculative", "0"}, "--num-speculative"},
      {{"serve", "--model", "no-such-dir", "--port", "70000"}, "--port"},
      {{"serve", "--model", "no-such-dir", "--block-size", "0"}, "--block-size"},
      {{"serve", "--model", "no-such-dir", "--max-running", "0"}, "--max-running"},
      {{"serve", "--model", "no-such-dir", "--http-threads", "0"}, "--http-threads"},
      {{"quantize", "--model", "no-such-dir", "--bits", "5"}, "--bits"},
      {{"quantize", "--model", "no-such-dir", "--group", "-2"}, "--group"},
      {{"eval", "--model", "no-such-dir", "--seq", "0"}, "--seq"},
      {{"eval", "--model", "no-such-dir", "--batches", "0"}, "--batches"},
      {{"info", "--memory", "--batch", "0"}, "--batch"},
      {{"info", "--memory", "--seq", "-1"}, "--seq"},
      {{"info", "--memory", "--tp", "4"}, "--tp"},  // llama-tiny's 6 heads do not split over 4
      {{"info", "--memory", "--sp"}, "--sp"},
      {{"info", "--memory", "--tp", "2", "--sp", "--seq", "255"}, "--seq"},
      {{"info", "--memory", "--tp", "2", "--zero", "1"}, "--zero"},
      {{"info", "--cuda", "--gpu", "v100"}, "--gpu"},
      {{"info", "--cuda", "--shape", "1,2"}, "--shape"},
      {{"info", "--cuda", "--shape", "0,4,4"}, "--shape"},
      {{"info", "--cuda", "--shape", "4,4,4x"}, "--shape"},
      {{"info", "--cuda", "--seq", "0"}, "--seq"},
      {{"info", "--cuda", "--latency-ns", "0"}, "--latency-ns"},
      {{"info", "--cuda", "--latency-ns", "nan"}, "--latency-ns"},
      {{"bench", "serve", "--num", "0"}, "--num"},
      {{"bench", "serve", "--shared-prefix", "-1"}, "--shared-prefix"},
      {{"bench", "serve", "--prompt-len", "9:3"}, "--prompt-len"},
      {{"bench", "serve", "--prompt-len", "x"}, "--prompt-len"},
      {{"bench", "serve", "--output-len", "0:4"}, "--output-len"},
      {{"bench", "comm", "--min-bytes", "0"}, "--min-bytes"},
      {{"bench", "gemm", "--shapes", "256x3072"}, "--shapes"},
      {{"bench", "gemm", "--shapes", "512,d0"}, "--shapes"},
      {{"bench", "gemm", "--shapes", "16384x16384x16384"}, "--shapes"},  // 1 GiB per operand
      {{"bench", "gemm", "--dtype", "f16", "--pack"}, "--pack"},
      {{"bench", "gemm", "--tiles", "--pack"}, "--tiles"},
      {{"bench", "gemm", "--tiles", "--shapes", "512"}, "--tiles"},
      {{"bench", "gemm", "--dtype", "f16", "--f16-chunk", "0"}, "--f16-chunk"},
      {{"bench", "launch", "--device", "tpu"}, "--device"},
      {{"bench", "launch", "--launches", "0"}, "--launches"},
      {{"plan", "comm", "--topology", "h100-node"}, "--ranks"},
      {{"plan", "comm", "--topology", "h100-node", "--ranks", "1"}, "--ranks"},
      {{"plan", "tp", "--tp-list", "3"}, "--tp-list"},       // 32 heads do not split over 3
      {{"plan", "tp", "--tp-list", "16"}, "--tp-list"},      // an h100-node has 8 GPUs
      {{"plan", "tp", "--weak", "--tp-list", "16"}, "--weak"},  // Megatron's configs: tp 1..8
      {{"plan", "cp", "--cp", "16"}, "--cp"},              // an h100-node has 8 GPUs
      {{"plan", "cp", "--method", "rings"}, "--method"},
      {{"plan", "cp", "--seq", "8190"}, "--seq"},           // 2C does not divide T (zig-zag)
      {{"plan", "cp", "--preset", "llama-mla-tiny"}, "--preset"},
      {{"plan", "cp", "--check", "no-such-file"}, "--check"},
      {{"plan", "pp"}, "--ranks"},
      {{"plan", "pp", "--ranks", "0"}, "--ranks"},
      {{"plan", "pp", "--ranks", "4", "--micro-batches", "0"}, "--micro-batches"},
      {{"plan", "pp", "--ranks", "4", "--micro-batches", "6", "--schedule", "interleaved"}, "--micro-batches"},
      {{"plan", "pp", "--ranks", "4", "--micro-batches", "8", "--virtual-stages", "2"}, "--virtual-stages"},
      {{"plan", "pp", "--ranks", "4", "--schedule", "interleaved", "--virtual-stages", "1"}, "--virtual-stages"},
      {{"plan", "pp", "--ranks", "1024", "--micro-batches", "64"}, "--micro-batches"},  // past MPI's tags
      {{"bench", "tp", "--tp", "3"}, "--tp"},                // 3 does not divide P = 1
      {{"bench", "tp", "--steps", "0"}, "--steps"},
      {{"bench", "mla-decode", "--batch", "0"}, "--batch"},
      {{"bench", "mla-decode", "--gqa-group", "3"}, "--gqa-group"},  // 8 heads do not group by 3
      {{"bench", "mla-decode", "--d-model", "100"}, "--d-model"},    // not a multiple of 8 heads
      {{"bench", "mla-decode", "--batch", "64", "--context", "131072", "--layers", "256"}, "--context"},  // TiBs of KV
      {{"tokenizer", "decode", "--tokenizer", kTokenizer, "--ids", "99999999999999999999"}, "--ids"},
      {{"tokenizer", "decode", "--tokenizer", kTokenizer, "--ids", "-1"}, "--ids"},
      {{"--threads", "0", "info"}, "--threads"},
      {{"--threads", "nan", "info"}, "--threads"},
  };
  for (const BadCase& c : cases) expect_clean_refusal(c);
}

TEST(CliFlags, BadNamesAreRefused) {
  const std::vector<BadCase> cases = {
      {{"train", "--preset", "no-such-preset"}, "--preset"},
      {{"train", "--precision", "fp64"}, "--precision"},
      {{"train", "--checkpoint", "sometimes"}, "--checkpoint"},
      {{"train", "--qat", "w3z"}, "--qat"},
      {{"train", "--qat", "w4g128", "--precision", "bf16"}, "--qat"},
      {{"train", "--attention", "fast"}, "--attention"},
      {{"bench", "serve", "--output-dist", "lognormal:5"}, "--output-dist"},
      {{"bench", "serve", "--prompt-dist", "gamma:2"}, "--prompt-dist"},
      {{"bench", "serve", "--mix", "chat", "--output-dist", "exponential:-1"}, "--output-dist"},
      {{"bench", "serve", "--mix", "code"}, "--mix"},
      {{"bench", "serve", "--mix", "rag", "--shared-prefix", "2000"}, "--shared-prefix"},
      {{"serve", "--model", "no-such-dir", "--batching", "padded"}, "--batching"},
      {{"plan", "tp", "--topology", "tpu-torus-2d"}, "--tflops"},  // no device peak modelled
      {{"plan", "tp", "--topology", "no-such-topology"}, "--topology"},
      {{"bench", "tp", "--workload", "no-such-workload"}, "--workload"},
      {{"plan", "pp", "--ranks", "4", "--schedule", "foo"}, "--schedule"},
      {{"plan", "pp", "--ranks", "4", "--schedule", "foo"}, "'foo'"},
      {{"bench", "tp", "--sp", "sometimes"}, "--sp"},
      {{"bench", "pp", "--schedule", "foo"}, "--schedule"},
      {{"bench", "pp", "--schedule", "foo"}, "'foo'"},
      {{"bench", "pp", "--workload", "w9"}, "--workload"},
      {{"--simd", "avx9", "info"}, "--simd"},
      {{"no-such-command"}, "no-such-command"},
      {{"train", "--no-such-flag"}, "--no-such-flag"},
  };
  for (const BadCase& c : cases) expect_clean_refusal(c);
}

// `kiln plan pp` prints the lists, the bubble beside its formula, and writes the timeline SVG.
TEST(CliPlanPp, PrintsTheBubbleAndWritesTheTimeline) {
  const std::string svg = (std::filesystem::temp_directory_path() /
                           ("kiln_plan_pp_" + std::to_string(getpid()) + ".svg")).string();
  std::filesystem::remove(svg);
  const RunResult r = run_kiln({"plan", "pp", "--ranks", "4", "--micro-batches", "8", "--schedule", "zb-h1", "--svg", svg});
  EXPECT_TRUE(r.exited && r.code == 0) << r.output;
  EXPECT_NE(r.output.find("rank 3: RA0 F0 RA1 BI0 SG0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bubble: simulated 0.1111 (11.11%), formula 0.1111 (11.11%)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("simulated / bound: 4/4 4/4 4/4 4/4"), std::string::npos) << r.output;
  std::ifstream f(svg);
  ASSERT_TRUE(f.good()) << "no " << svg << "\n" << r.output;
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("bubble 11.1%"), std::string::npos);
  std::filesystem::remove(svg);
}

TEST(CliEnvironment, BadValuesAreRefused) {
  const std::vector<BadCase> cases = {
      {{"info"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=abc"}},
      {{"info"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=0"}},
      {{"info"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=-3"}},
      {{"info"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=4x"}},
      {{"info"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=99999999999999999999"}},
      {{"info"}, "KILN_SIMD", {"KILN_SIMD=avx9"}},
      {{"info"}, "KILN_PIN_THREADS", {"KILN_PIN_THREADS=sometimes"}},
      {{"info"}, "KILN_TUNE_FILE", {"KILN_TUNE_FILE=/"}},
      {{"info"}, "KILN_COMM_CALIBRATION", {"KILN_COMM_CALIBRATION=/"}},
      {{"info"}, "KILN_AUTOTUNE", {"KILN_AUTOTUNE=yes"}},
      {{"info"}, "KILN_BF16_GEMM", {"KILN_BF16_GEMM=fast"}},
      // Checked before the subcommand runs, whatever it is.
      {{"train", "--steps", "1"}, "KILN_NUM_THREADS", {"KILN_NUM_THREADS=many"}},
  };
  for (const BadCase& c : cases) expect_clean_refusal(c);
}

}  // namespace
