// The fault-injection matrix. training_step runs once cleanly under the
// preloaded shim with FAKECUDA_LOG; every driver call that run made — the program's own and
// the ones the shim makes on its behalf — is then made to fail in turn (FAKECUDA_FAIL=name:n,
// n = first, second and last occurrence). Each faulty run must:
//   - exit 0: no crash, no corrupt block, no invalid result (training_step's own checks);
//   - show the program exactly the injected error code wherever it sees a failure (the
//     shim neither swallows a failure into a bogus success nor invents another code), or
//     none at all when the shim absorbed the failure of its own call and passed through;
//   - free every block the driver handed out (matched from the driver's log), but for the
//     sub-allocator's ranges, which the shim keeps: then the program's blocks must all be
//     freed (the report's live_blocks) and the driver's unfreed allocations must be exactly
//     the ranges the report counts;
//   - under --sanitize (ASan), end with LeakSanitizer finding no leak.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/training_step";

bool asan_run() {
  const char* first = std::getenv("SPILLWAY_TEST_PRELOAD_FIRST");
  return first != nullptr && std::string(first).find("libasan") != std::string::npos;
}

// LeakSanitizer suppressions for runs where the injected failure is a destroy call: the
// driver then still owns the object (a real driver keeps it until the process ends), and
// the fake, which keeps events, streams and modules only behind their handles, shows it as
// a leak of its own. Only objects the fake allocated are suppressed — never the shim's.
std::string driver_owned_suppressions() {
  static const std::string path = [] {
    std::string p = temp_dir() + "/lsan.supp";
    std::FILE* f = std::fopen(p.c_str(), "w");
    if (f != nullptr) {
      std::fputs("leak:libcuda.so.1\n", f);  // objects the (fake) driver allocated
      std::fclose(f);
    }
    return p;
  }();
  return path;
}

Env env_for(const std::string& log, const std::string& fail) {
  Env env{{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}, {"FAKECUDA_LOG", log}, {"SPILLWAY_REPORT", log + ".json"}};
  if (!fail.empty()) env["FAKECUDA_FAIL"] = fail;
  // Under ASan the shim's heap is checked for leaks at exit (LeakSanitizer).
  if (asan_run()) {
    env["ASAN_OPTIONS"] = "detect_leaks=1:verify_asan_link_order=0:exitcode=23";
    bool destroy = fail.find("Destroy") != std::string::npos || fail.find("Unload") != std::string::npos;
    if (destroy) env["LSAN_OPTIONS"] = "suppressions=" + driver_owned_suppressions();
  }
  return env;
}

// The exported symbol of each log line, in order.
std::vector<std::string> calls(const std::string& log) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(log)) {
    std::istringstream words(line);
    std::string sym;
    if (words >> sym) out.push_back(sym);
  }
  return out;
}

bool is_alloc(const std::string& sym) { return sym.rfind("cuMemAlloc", 0) == 0 && sym.rfind("cuMemAllocHost", 0) != 0; }
bool is_free(const std::string& sym) { return sym.rfind("cuMemFree", 0) == 0 && sym.rfind("cuMemFreeHost", 0) != 0; }

// Blocks the driver handed out and never got back, from its log.
std::set<std::string> unfreed_blocks(const std::string& log) {
  std::set<std::string> live;
  for (const std::string& line : split_lines(log)) {
    if (line.size() < 5 || line.compare(line.size() - 5, 5, " -> 0") != 0) continue;
    std::string sym = line.substr(0, line.find(' '));
    std::string ptr = field(line, "dptr");
    if (ptr.empty()) continue;
    if (is_alloc(sym)) live.insert(ptr);
    else if (is_free(sym)) live.erase(ptr);
  }
  return live;
}

// What the run left behind that it should not have: the driver's unfreed allocations beyond
// the sub-allocator's ranges, and the program's blocks the shim still holds (report).
std::string leaks(const std::string& log_path, const std::string& log) {
  std::set<std::string> unfreed = unfreed_blocks(log);
  std::string text = read_file(log_path + ".json");
  if (text.empty()) {  // (no report: the shim saw no CUDA event, or the program stopped first)
    return unfreed.empty() ? "" : "driver allocations unfreed: " + std::to_string(unfreed.size()) + ", no report\n";
  }
  nlohmann::json j = nlohmann::json::parse(text);
  std::string out;
  if (j["bytes"]["live_blocks"] != 0) out += "live blocks at exit: " + j["bytes"]["live_blocks"].dump() + "\n";
  if (unfreed.size() != j["suballocator"]["ranges"].get<std::size_t>()) {
    out += "driver allocations unfreed: " + std::to_string(unfreed.size()) + ", ranges " +
           j["suballocator"]["ranges"].dump() + "\n";
  }
  return out;
}

int injected_code(const std::string& sym) {
  bool alloc_family = sym.rfind("cuMemAlloc", 0) == 0 || sym == "cuMemHostAlloc" || sym == "cuMemCreate";
  return alloc_family ? 2 /* CUDA_ERROR_OUT_OF_MEMORY */ : 999 /* CUDA_ERROR_UNKNOWN */;
}

struct Clean {
  RunResult result;
  std::string log;
  std::string log_path;
};

const Clean& clean_run() {
  static const Clean clean = [] {
    std::string log = temp_dir() + "/clean.log";
    Clean c{run({kProgram}, env_for(log, "")), "", log};
    c.log = read_file(log);
    return c;
  }();
  return clean;
}

TEST(FaultMatrix, CleanRunUsesEveryFamilyAndVerifiesEveryBlock) {
  const Clean& c = clean_run();
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  EXPECT_EQ(c.result.out, "done blocks=6 verified=6\n") << describe(c.result);
  EXPECT_EQ(c.result.err, "");
  std::vector<std::string> seen = calls(c.log);
  for (const char* sym : {"cuMemAllocManaged", "cuEventRecord", "cuPointerGetAttribute",
                          "cuMemcpyHtoD_v2", "cuLaunchKernel"}) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), sym), seen.end()) << sym << " not called:\n" << c.log;
  }
  // Every device allocation family became managed: the driver saw none of them.
  for (const std::string& sym : seen) {
    EXPECT_TRUE(!is_alloc(sym) || sym == "cuMemAllocManaged") << sym << " reached the driver:\n" << c.log;
  }
  EXPECT_EQ(leaks(c.log_path, c.log), "");
}

TEST(FaultMatrix, EveryDriverCallFailingInTurn) {
  const Clean& c = clean_run();
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  std::map<std::string, int> count;
  for (const std::string& sym : calls(c.log)) ++count[sym];
  ASSERT_GE(count.size(), 15u) << c.log;

  int runs = 0, hit = 0, surfaced = 0, absorbed = 0;
  std::string dir = temp_dir();
  for (const auto& [sym, n] : count) {
    std::set<int> which{1, std::min(n, 2), n};
    for (int nth : which) {
      std::string spec = sym + ":" + std::to_string(nth);
      std::string log = dir + "/" + std::to_string(runs++) + ".log";
      RunResult r = run({kProgram}, env_for(log, spec), 60);
      std::string text = read_file(log);
      SCOPED_TRACE("FAKECUDA_FAIL=" + spec + "\n" + describe(r));
      EXPECT_EQ(r.status, 0);
      EXPECT_EQ(r.err.find("LeakSanitizer"), std::string::npos);
      ASSERT_NE(r.out.find("done blocks="), std::string::npos) << "the program did not finish cleanly";
      bool injected = !lines_with(text, "injected=1").empty();
      hit += injected;
      std::vector<std::string> fails = lines_with(r.out, "fail ");
      if (fails.empty()) ++absorbed;
      else ++surfaced;
      for (const std::string& line : fails) {
        int code = std::atoi(line.substr(line.rfind(' ') + 1).c_str());
        EXPECT_EQ(code, injected_code(sym)) << "the program saw another error than the driver's: " << line;
      }
      if (!fails.empty()) EXPECT_TRUE(injected) << "a failure the driver never reported";
      EXPECT_EQ(leaks(log, text), "") << text;
    }
  }
  RecordProperty("runs", runs);
  RecordProperty("faults_hit", hit);
  std::printf("fault matrix: %zu distinct driver calls, %d runs, %d faults hit, %d surfaced to the program, "
              "%d absorbed by the shim\n",
              count.size(), runs, hit, surfaced, absorbed);
  EXPECT_GE(hit, runs * 9 / 10) << "most injected faults must actually be hit";
}

}  // namespace
}  // namespace spillway::test
