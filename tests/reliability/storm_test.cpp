// Concurrency: 16 threads allocate, free, launch and resolve symbols against
// 100 000 live blocks (tests/reliability/storm.cpp) under the preloaded shim. Passes when the
// program saw no failure (every block kept its tag, every lookup gave the same pointer, every
// launch its result) and the shim's own report agrees with the program: every allocation was
// redirected, every one freed, no managed byte left in the table. Under --sanitize the same
// run happens with the TSan (and ASan) build of the shim; scripts/test then fails on any report.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kPrograms = RELIABILITY_PROGRAM_DIR;

bool sanitized() { return std::getenv("SPILLWAY_TEST_PRELOAD_FIRST") != nullptr; }

long number(const std::string& out, const std::string& key) {
  std::string v = field(out, key);
  return v.empty() ? -1 : std::atol(v.c_str());
}

TEST(Storm, SixteenThreadsAgainstAHundredThousandLiveBlocks) {
  std::string report = temp_dir() + "/report.json";
  // Sanitized shims are 5-20x slower: fewer operations per thread, the same live table.
  std::string ops = sanitized() ? "1500" : "20000";
  RunResult r = run({kPrograms + "/storm", "100000", "16", ops},
                    {{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}, {"SPILLWAY_REPORT", report}}, 280);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(number(r.out, "failures"), 0);
  EXPECT_EQ(r.err.find("ThreadSanitizer"), std::string::npos) << r.err;
  long allocs = number(r.out, "allocs"), frees = number(r.out, "frees");
  EXPECT_GE(allocs, 100000 + 16);
  EXPECT_EQ(allocs, frees);
  std::string text = read_file(report);
  ASSERT_FALSE(text.empty()) << "no report written\n" << r.err;
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["allocations"]["redirected"].get<long>(), allocs) << "every allocation became managed";
  EXPECT_EQ(j["allocations"]["frees"].get<long>(), frees) << "every free reached the table";
  EXPECT_EQ(j["bytes"]["live_blocks"].get<long>(), 0) << "no block left behind in the table";
  std::printf("storm: 16 threads x %s ops against 100000 live blocks: %s", ops.c_str(), r.out.c_str());
}

}  // namespace
}  // namespace spillway::test
