// The ways an adversarial user broke the shim, each as a correct program
// (tests/reliability/hostile.cpp) that must run under the shim exactly as it runs without it.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/hostile";

Env env(bool shim, const Env& extra = {}) {
  Env e{{"LD_LIBRARY_PATH", kFakeDir}};
  if (shim) e["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

RunResult hostile(std::vector<std::string> args, const Env& e, int timeout_s = 120) {
  args.insert(args.begin(), kProgram);
  return run(args, e, timeout_s);
}

nlohmann::json report(const std::string& path) {
  std::string text = read_file(path);
  return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
}

std::size_t count_calls(const std::string& log, const std::string& name) {
  std::size_t n = 0;
  for (const std::string& line : split_lines(log)) n += line.rfind(name + " ", 0) == 0;
  return n;
}

// 1. A kernel handle reused after its code was unloaded must not be scanned with the old
// kernel's layout (8 parameters read from a 1-entry array: SIGSEGV).
TEST(Hostile, KernelHandleReusedAfterUnloadIsScannedWithItsNewLayout) {
  for (const std::string kind : {"module", "library"}) {
    RunResult plain = hostile({"reload", kind}, env(false));
    ASSERT_EQ(plain.status, 0) << describe(plain);
    ASSERT_EQ(field(plain.out, "reused"), "1") << "the fake did not hand out the same handle: the test proves nothing";
    RunResult r = hostile({"reload", kind}, env(true));
    EXPECT_EQ(r.status, 0) << kind << ": " << describe(r);
    EXPECT_EQ(field(r.out, "reused"), "1");
    EXPECT_EQ(r.err, "");
  }
}

// 8. Without a parameter layout the shim scans nothing: an `extra` buffer's claimed size is
// not its real size.
TEST(Hostile, ExtraBufferLargerThanClaimedIsNotReadWithoutALayout) {
  // The layout cannot be read (the shim asks twice for parameter 0: handle kind, then layout).
  Env e{{"FAKECUDA_FAIL", "cuFuncGetParamInfo:1,cuFuncGetParamInfo:2"}};
  RunResult plain = hostile({"extra_buffer"}, env(false, e));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  RunResult r = hostile({"extra_buffer"}, env(true, e));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "launch"), field(plain.out, "launch"));
}

// 3. Stream-ordered calls on a destroyed or garbage stream get the driver's own error; the
// block survives the refused free, and nothing is left behind.
TEST(Hostile, InvalidStreamsGetTheDriversErrorAndLeakNothing) {
  RunResult plain = hostile({"bad_stream"}, env(false));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  std::string path = temp_dir() + "/r.json";
  RunResult r = hostile({"bad_stream"}, env(true, {{"SPILLWAY_REPORT", path}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, plain.out);
  nlohmann::json j = report(path);
  EXPECT_EQ(j["bytes"]["live_blocks"], 0) << j.dump();
  EXPECT_EQ(j["allocations"]["redirected"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["frees"], 1) << j.dump();
}

// 4. Two threads freeing one block at once: exactly one succeeds, the table stays true.
TEST(Hostile, ConcurrentFreesOfOneBlockSucceedExactlyOnce) {
  RunResult r = hostile({"double_free", "300"}, env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "both"), "0");
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err, "");
}

// 5. Short-lived threads do not each leave ordering events behind.
TEST(Hostile, ThreadChurnCreatesBoundedEvents) {
  std::string log = temp_dir() + "/fake.log";
  // 16 MiB of blocks over an 8 MiB budget: every launch evicts, so every thread orders.
  RunResult r = hostile({"churn", "400"}, env(true, {{"FAKECUDA_LOG", log}, {"SPILLWAY_BUDGET", "8MiB"}, {"SPILLWAY_POLICY", "learned"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  std::string text = read_file(log);
  ASSERT_GT(count_calls(text, "cuMemPrefetchAsync_v2"), 400u) << "the launches did not evict: the test proves nothing";
  EXPECT_LE(count_calls(text, "cuEventCreate"), 16u);
}

// 6. exit() from a signal handler that lands while a launch's plan holds the Engine's lock
// must exit. With no report asked for (the case that hung), the shim's exit path takes no
// lock and allocates nothing. (A report written at exit allocates: if the signal landed
// inside malloc, that is the program's own signal-unsafe exit, and glibc may abort it —
// seen once in about a hundred runs — with or without the shim; so no report here.)
TEST(Hostile, ExitFromASignalHandlerDuringLaunchesNeverHangs) {
  // Under ASan a signal that lands inside ASan's allocator (here: the fake driver building a
  // log line) deadlocks exit(): glibc's __call_tls_dtors frees its own list of thread-local
  // destructors, and ASan's free waits on the region lock the interrupted malloc holds
  // (gdb, 4 hangs in about 1000 runs of the ASan build after CI timed out at 2c1b383:
  // __call_tls_dtors -> free -> SizeClassAllocator64::GetFromAllocator, interrupted in
  // PopulateFreeArray). The program's signal-unsafe exit, not the shim; the plain and TSan
  // builds run the test.
  if (const char* first = std::getenv("SPILLWAY_TEST_PRELOAD_FIRST"); first && std::strstr(first, "asan"))
    GTEST_SKIP() << "exit() from a signal handler that interrupted ASan's allocator deadlocks in ASan";
  // (Before the fix about one run in six hung: the signal must land inside the lock.)
  for (int i = 0; i < 24; ++i) {
    Env e{{"SPILLWAY_BUDGET", "32MiB"}, {"SPILLWAY_POLICY", i % 2 ? "learned" : "sequential"}};
    // exit() from a signal handler is the program's own signal-unsafe act; what is tested is
    // that it exits. (Under TSan, which would report every allocation made at exit.)
    if (const char* tsan = std::getenv("TSAN_OPTIONS")) e["TSAN_OPTIONS"] = std::string(tsan) + ":report_signal_unsafe=0";
    RunResult r = hostile({"exit_in_handler", std::to_string(20000 + 7919 * i)}, env(true, e), 15);
    EXPECT_EQ(r.status, 3) << "run " << i << ": " << describe(r);
  }
}

// a child forked before its parent used CUDA records a
// trace of its own, and closes it at exit.
TEST(Hostile, AChildForkedBeforeCudaWritesAWholeTrace) {
  for (const std::string name : {"t.jsonl", "t.jsonl.gz"}) {
    std::string dir = temp_dir();
    RunResult r = hostile({"fork_child"}, env(true, {{"SPILLWAY_TRACE", dir + "/" + name}}));
    ASSERT_EQ(r.status, 0) << describe(r);
    RunResult replay = run({SPILLWAY_CLI, "replay", dir + "/" + name, "--policy", "demand", "--capacity", "1GiB"}, {});
    EXPECT_EQ(replay.status, 0) << name << ": " << describe(replay);
    EXPECT_NE(replay.out.find("kernels 5,"), std::string::npos) << name << ": " << replay.out;
  }
}

// Output paths that are not regular files are written as they are, and `spillway run`
// removes none of them (found in review: it deleted a symbolic link and would have taken
// /dev/null's name for a file of its own).
TEST(Hostile, OutputsThatAreNotRegularFilesAreWrittenAsTheyAre) {
  std::string dir = temp_dir();
  std::string target = dir + "/target.json", link = dir + "/link.json";
  { std::FILE* f = std::fopen(target.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  RunResult r = run({SPILLWAY_CLI, "run", "--report", link, "--trace", "/dev/null", "--", kProgram, "churn", "2"},
                    env(false));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "") << "no other file was taken for /dev/null or the link";
  struct stat st {};
  ASSERT_EQ(lstat(link.c_str(), &st), 0) << "the link was removed";
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  nlohmann::json j = report(target);
  EXPECT_EQ(j["allocations"]["redirected"], 4) << "the report went through the link: " << j.dump();
}

// 9. Threads allocating, launching and freeing: no prefetch or advice reaches the driver
// for a range already freed (the fake refuses those with CUDA_ERROR_INVALID_VALUE).
TEST(Hostile, NoPrefetchOrAdviceReachesTheDriverForAFreedRange) {
  for (const char* policy : {"learned", "sequential", "advise"}) {
    std::string log = temp_dir() + "/fake.log";
    RunResult r = hostile({"race_frees", "4", "600"},
                          env(true, {{"FAKECUDA_LOG", log}, {"SPILLWAY_BUDGET", "6MiB"}, {"SPILLWAY_POLICY", policy}}));
    ASSERT_EQ(r.status, 0) << describe(r);
    std::size_t refused = 0, moves = 0;
    for (const std::string& line : split_lines(read_file(log))) {
      if (line.rfind("cuMemPrefetchAsync", 0) != 0 && line.rfind("cuMemAdvise", 0) != 0) continue;
      ++moves;
      if (line.find("-> 0") == std::string::npos) {
        if (++refused <= 3) ADD_FAILURE() << policy << ": " << line;
      }
    }
    EXPECT_GT(moves, 0u) << policy << ": the shim moved nothing; the test proves nothing";
    EXPECT_EQ(refused, 0u) << policy;
  }
}

}  // namespace
}  // namespace spillway::test
