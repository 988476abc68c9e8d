// Failures reported against other CUDA interception libraries, each as a
// mode of tests/reliability/other_shims.cpp run under the real shim and the fake driver, and,
// where it makes a difference, without the shim for comparison.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/other_shims";

Env env(bool shim, const Env& extra = {}) {
  Env e{{"LD_LIBRARY_PATH", kFakeDir}};
  if (shim) e["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

// True if the shim hooks exactly `symbol`: a SPILLWAY_*_HOOK row of interpose/hooks.def.
bool hooked(const std::string& symbol) {
  static const std::string table = read_file(HOOKS_DEF);
  return table.find("_HOOK(" + symbol + ",") != std::string::npos;
}

// Every "X -> lib:sym" line of `with` names the same symbol as in `without`, from the shim
// exactly when the shim hooks that very symbol, and from the same library otherwise.
void expect_same_symbols(const std::string& without, const std::string& with) {
  auto a = split_lines(without), b = split_lines(with);
  ASSERT_EQ(a.size(), b.size()) << without << "\n---\n" << with;
  for (size_t i = 0; i < a.size(); ++i) {
    auto arrow = a[i].find(" -> ");
    if (arrow == std::string::npos) continue;
    std::string plain = a[i].substr(arrow + 4), shimmed = b[i].substr(b[i].find(" -> ") + 4);
    std::string plain_sym = plain.substr(0, plain.find(' ')), shim_sym = shimmed.substr(0, shimmed.find(' '));
    std::string sym = plain_sym.substr(plain_sym.find(':') + 1);
    std::string rest_plain = plain.substr(plain_sym.size()), rest_shim = shimmed.substr(shim_sym.size());
    EXPECT_EQ(rest_plain, rest_shim) << "result codes differ: " << a[i] << " / " << b[i];
    if (plain_sym == "null") {
      EXPECT_EQ(shim_sym, "null") << b[i];
    } else if (hooked(sym)) {
      EXPECT_EQ(shim_sym, "libspillway.so:" + sym) << "the hook for exactly this symbol: " << b[i];
    } else {
      EXPECT_EQ(shim_sym, plain_sym) << "untouched: " << b[i];
    }
  }
}

TEST(OtherShims, GetProcAddressFirstAskedForItselfGivesExactlyEachVersionsAbi) {
  RunResult plain = run({kProgram, "getproc_first"}, env(false));
  RunResult with = run({kProgram, "getproc_first"}, env(true));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  ASSERT_EQ(with.status, 0) << describe(with);
  EXPECT_NE(plain.out.find("cuMemAdvise@8000 -> libcuda.so.1:cuMemAdvise r=0"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("cuMemAllocAsync@11010 -> null r=500"), std::string::npos) << "too old a version: not found";
  // The last line differs on purpose: managed=0 without the shim, 1 with it.
  EXPECT_NE(plain.out.find("managed=0"), std::string::npos);
  EXPECT_NE(with.out.find("managed=1"), std::string::npos);
  expect_same_symbols(plain.out.substr(0, plain.out.find("managed=")), with.out.substr(0, with.out.find("managed=")));
  EXPECT_EQ(with.err, "");
}

TEST(OtherShims, HostVmmFromAThreadWithoutContextIsPassedThroughUntouched) {
  std::string dir = temp_dir();
  RunResult plain = run({kProgram, "vmm_worker"}, env(false, {{"FAKECUDA_LOG", dir + "/plain.log"}}));
  RunResult with = run({kProgram, "vmm_worker"}, env(true, {{"FAKECUDA_LOG", dir + "/shim.log"}}));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  ASSERT_EQ(with.status, 0) << describe(with);
  EXPECT_NE(with.out.find("worker context none"), std::string::npos) << with.out;
  EXPECT_EQ(with.out, plain.out) << "the same results, call by call";
  EXPECT_EQ(with.err, "");
  // The driver sees the same calls, in the same order, with the same outcome: the shim adds
  // no device query (or anything else) on the worker's behalf. Its own start-up lookups
  // (cuGetProcAddress*) and the calls it makes at initialisation on the main thread before
  // the program's first call are the only extra lines.
  auto strip = [](const std::string& log) {
    std::string out;
    for (const std::string& line : split_lines(log)) {
      std::string sym = line.substr(0, line.find(' '));
      if (sym.rfind("cuGetProcAddress", 0) == 0) continue;
      auto arrow = line.rfind(" -> ");
      out += sym + line.substr(arrow) + "\n";
    }
    return out;
  };
  std::string p = strip(read_file(dir + "/plain.log")), s = strip(read_file(dir + "/shim.log"));
  auto worker_part = [](const std::string& log) { return log.substr(log.find("cuCtxGetCurrent")); };
  ASSERT_NE(p.find("cuCtxGetCurrent"), std::string::npos) << p;
  ASSERT_NE(s.find("cuCtxGetCurrent"), std::string::npos) << s;
  EXPECT_EQ(worker_part(s), worker_part(p));
}

TEST(OtherShims, DlsymStormDuringInitialisationNoDeadlockNoWrongSymbol) {
  RunResult plain = run({kProgram, "dlsym_storm", "8", "200"}, env(false), 60);
  RunResult with = run({kProgram, "dlsym_storm", "8", "200"}, env(true), 60);
  ASSERT_EQ(plain.status, 0) << describe(plain);
  ASSERT_EQ(with.status, 0) << "every thread got the same answer for every name, no hang: " << describe(with);
  EXPECT_NE(with.out.find("handle cudnnCreate -> null"), std::string::npos) << with.out;
  EXPECT_NE(with.out.find("default cublasCreate_v2 -> null"), std::string::npos) << with.out;
  expect_same_symbols(plain.out, with.out);
  EXPECT_EQ(with.err, "");
}

TEST(OtherShims, FreeAndLaunchInsideACaptureKeepTheCaptureValid) {
  std::string log = temp_dir() + "/capture.log";
  RunResult r = run({kProgram, "capture_ops"}, env(true, {{"FAKECUDA_LOG", log}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "capturing=1\nend_capture=0 graph=1\n");
  EXPECT_EQ(r.err, "");
  // On the capturing stream the driver saw only the program's own calls — its launch, its
  // queries and the end of the capture — and no work of the shim's (no event record,
  // prefetch, copy or free: the free is the shim's to defer); nothing failed while capturing.
  std::string text = read_file(log);
  int launches = 0;
  for (const std::string& line : lines_with(text, "capturing=1")) {
    std::string sym = line.substr(0, line.find(' '));
    EXPECT_TRUE(sym == "cuLaunchKernel" || sym == "cuStreamIsCapturing" || sym == "cuStreamGetCaptureInfo_v3" ||
                sym == "cuStreamEndCapture")
        << line << "\n" << text;
    EXPECT_EQ(line.substr(line.size() - 5), " -> 0") << line;
    launches += sym == "cuLaunchKernel";
  }
  EXPECT_EQ(launches, 1) << text;
}

TEST(OtherShims, ExitWithWorkInFlightIsCleanAndSilent) {
  for (const char* policy : {"demand", "advise"}) {
    RunResult r = run({kProgram, "exit_in_flight"}, env(true, {{"FAKECUDA_ASYNC", "1"}, {"SPILLWAY_POLICY", policy}}), 30);
    EXPECT_EQ(r.status, 0) << policy << ": " << describe(r);
    EXPECT_EQ(r.out, "exiting with work queued\n");
    EXPECT_EQ(r.err, "") << policy;
  }
}

TEST(OtherShims, ExitFromAnotherThreadIsCleanAndSilent) {
  for (int i = 0; i < 5; ++i) {
    RunResult r = run({kProgram, "exit_other_thread"}, env(true), 30);
    EXPECT_EQ(r.status, 0) << describe(r);
    EXPECT_EQ(r.err, "");
  }
}

TEST(OtherShims, ForkWithoutExecChildThatNeverUsesCudaIsCleanAndSilent) {
  RunResult r = run({kProgram, "fork_child"}, env(true, {{"SPILLWAY_LOG", "info"}}), 30);
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_NE(r.out.find("child sum=1000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("child status=0 parent data=intact"), std::string::npos) << r.out;
  // With SPILLWAY_LOG=info the parent prints its one statistics table at exit; the child,
  // which allocated nothing, prints none: exactly one table.
  EXPECT_EQ(lines_with(r.err, "report (policy").size(), 1u) << r.err;
}

}  // namespace
}  // namespace spillway::test
