// What a program does to its own threads and process image (tests/reliability/hostile_process.cpp),
// run under the shim exactly as it runs without it: docs/reliability.md, "third round".
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/hostile_process";

Env env(bool shim, const Env& extra = {}) {
  Env e{{"LD_LIBRARY_PATH", kFakeDir}};
  if (shim) e["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

RunResult program(std::vector<std::string> args, const Env& e, int timeout_s = 120) {
  args.insert(args.begin(), kProgram);
  return run(args, e, timeout_s);
}

// The events of a trace file (JSON lines), or an empty list if it is empty or unreadable.
std::vector<nlohmann::json> trace_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  for (const std::string& line : split_lines(read_file(path))) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return lines;
}

std::size_t kernels_in(const std::vector<nlohmann::json>& lines) {
  std::size_t n = 0;
  for (const auto& l : lines) n += l.is_object() && l.value("ev", "") == "kernel";
  return n;
}

// pthread_cancel of a thread inside a hook: glibc unwinds it at a cancellation point (here the
// fake driver's write(2) of its call log, inside cuLaunchKernel) with a forced unwind, which a
// catch (...) that swallows it turns into abort ("FATAL: exception not rethrown"). The
// process must go on working: no lock or table left half-updated by the cancelled thread.
// Under AddressSanitizer a forced unwind leaves the redzones of the frames it skips poisoned on
// the thread's stack, and ASan's own sigaltstack call at the next no-return function reports
// (or CHECK-fails on) its own stack: google/sanitizers issues 1399 and 1010. With the
// instrumented frames on ASan's fake stack (detect_stack_use_after_return=1) the real stack
// stays clean, so the sanitized run still checks everything else, with or without the shim.
Env cancelling(Env e) {
  if (const char* asan = std::getenv("ASAN_OPTIONS")) e["ASAN_OPTIONS"] = std::string(asan) + ":detect_stack_use_after_return=1";
  return e;
}

TEST(HostileProcess, ThreadCancelledInsideAHookLeavesTheProcessWorking) {
  const std::string log = temp_dir() + "/driver.log";
  RunResult plain = program({"cancel_in_hook", "30"}, cancelling(env(false, {{"FAKECUDA_LOG", log}})));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  for (const char* policy : {"learned", "demand"}) {
    RunResult r = program({"cancel_in_hook", "30"},
                          cancelling(env(true, {{"FAKECUDA_LOG", log}, {"SPILLWAY_POLICY", policy}})));
    EXPECT_EQ(r.status, 0) << policy << ": " << describe(r);
    EXPECT_EQ(field(r.out, "cancelled"), "30");
    EXPECT_EQ(r.err, "") << policy;
  }
}

// The shim dlopen()ed by a program that already uses the driver (not preloaded): its entry
// points must pass through (or redirect), never answer CUDA_ERROR_NOT_INITIALIZED.
TEST(HostileProcess, ShimDlopenedLateIsNoBrokenDriver) {
  RunResult r = program({"dlopen_late", kShim}, env(false));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "alloc"), "0");
  EXPECT_EQ(field(r.out, "free"), "0");
  EXPECT_EQ(field(r.out, "info"), "0");
}

// exec replaces the image without exit-time code: the trace the first image created at its
// first event was left at 0 bytes. Now it is written whole before the exec, and the new image
// (a second CUDA process of the run) records to <name>.<pid>.<ext> and says so.
TEST(HostileProcess, ExecLeavesTheFirstImagesTraceWhole) {
  const std::string dir = temp_dir();
  const std::string trace = dir + "/t.jsonl";
  RunResult r = program({"exec_child"}, env(true, {{"SPILLWAY_TRACE", trace}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "exec_after"), "done");
  std::vector<nlohmann::json> first = trace_lines(trace);
  ASSERT_FALSE(first.empty()) << "the first image's trace is empty";
  EXPECT_TRUE(first.front().is_object() && first.front().value("format", "") == "spillway-trace") << first.front().dump();
  EXPECT_EQ(kernels_in(first), 1u);
  std::size_t others = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path() == trace) continue;
    ++others;
    EXPECT_EQ(kernels_in(trace_lines(entry.path())), 1u) << entry.path();
  }
  EXPECT_EQ(others, 1u) << "the exec'd image's own trace";
  EXPECT_EQ(lines_with(r.err, "records its trace to").size(), 1u) << r.err;
}

// A pool the program made the device's current pool (cuDeviceSetMemPool) is the program's:
// cuMemAllocAsync must take from it, as without the shim (docs: pools the program created
// stay as they are).
TEST(HostileProcess, PoolMadeCurrentByTheProgramIsLeftToTheDriver) {
  RunResult plain = program({"program_pool"}, env(false));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  RunResult r = program({"program_pool"}, env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "from_pool"), "1");
}

}  // namespace
}  // namespace spillway::test
