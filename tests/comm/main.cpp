// The MPI tests' main (tests/comm, tests/parallel): runs every test on every rank of an mpirun job (p = 1..5 in CTest).
// After each test all ranks agree on pass/fail; a test that fails on some ranks only, or that
// hangs past the watchdog, ends the whole job with a message instead of deadlocking it.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "kiln/comm/communicator.h"

namespace {

// Per-test watchdog: a test that needs more than this is a hang (the slowest takes ~2 s at
// p = 5 oversubscribed on 2 cores).
constexpr unsigned kTestTimeoutSeconds = 60;
char g_current_test[256] = "(none)";

void on_alarm(int) {
  const char head[] = "kiln MPI test: watchdog: a test hung (rank stuck in a collective?): ";
  ssize_t ignored = write(2, head, sizeof(head) - 1);
  ignored = write(2, g_current_test, std::strlen(g_current_test));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(124);  // mpirun sees a rank die without MPI_Finalize and ends the job
}

class MpiAgreement : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo& info) override {
    std::snprintf(g_current_test, sizeof(g_current_test), "%s.%s", info.test_suite_name(),
                  info.name());
    alarm(kTestTimeoutSeconds);
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    alarm(0);
    const int failed = info.result()->Failed() ? 1 : 0;
    int any = 0, all = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&failed, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (any != all) {
      kiln::comm::abort_job(std::string("test ") + info.test_suite_name() + "." + info.name() +
                            (failed ? " failed on this rank but passed on others"
                                    : " passed on this rank but failed on others"));
    }
  }
};

// Ranks other than 0 print only failures, prefixed with their rank.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure in %s\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), g_current_test,
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  kiln::comm::init(&argc, &argv);
  std::signal(SIGALRM, on_alarm);
  const int rank = kiln::comm::Communicator::world().rank();
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    std::unique_ptr<testing::TestEventListener> quiet(listeners.Release(listeners.default_result_printer()));
    listeners.Append(new FailurePrinter(rank));
  }
  listeners.Append(new MpiAgreement);
  const int rc = RUN_ALL_TESTS();
  kiln::comm::finalize();
  return rc;
}
