// Limits that keep the host alive, under the real shim and the fake driver.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/limits";

double number(const std::string& out, const std::string& key) { return std::atof(field(out, key).c_str()); }

// With no SPILLWAY_MAX_MANAGED the cap is 80 % of host RAM, read at start: managed
// allocations stop there with CUDA_ERROR_OUT_OF_MEMORY (never the OOM killer: the blocks are
// never touched here, and past the cap nothing is allocated at all).
TEST(Limits, DefaultManagedCapIsEightyPercentOfHostRam) {
  double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  double cap = 0.8 * ram;
  std::string report = temp_dir() + "/r.json";
  // 16 GiB of fake device memory would refuse first without the shim: make it large enough
  // that only the shim's cap can refuse.
  RunResult r = run({kProgram, "fill", "1"}, {{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim},
                                               {"FAKECUDA_TOTAL_MEMORY", "1099511627776"}, {"SPILLWAY_REPORT", report}}, 120);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(field(r.out, "refused"), "2") << "CUDA_ERROR_OUT_OF_MEMORY past the cap: " << r.out;
  double bytes = number(r.out, "bytes");
  EXPECT_LE(bytes, cap) << r.out;
  EXPECT_GT(bytes, cap - double(1 << 30)) << r.out;
  std::string text = read_file(report);
  ASSERT_FALSE(text.empty()) << r.err;
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["allocations"]["refused"].get<int>(), 1) << text;
  EXPECT_NEAR(j["bytes"]["max_managed"].get<double>(), cap, 2.0) << "the cap the shim read at start";
  EXPECT_EQ(j["bytes"]["live_blocks"].get<long>(), 0) << text;
  std::printf("default cap: host RAM %.0f bytes, cap %.0f, managed allocated before refusal %.0f\n", ram, cap, bytes);
}

// The shim's own memory grows with the number of live blocks and no more, and comes back
// when they are freed: bounded per block and free of leaks per allocation. What stays after
// the frees is the shim's fixed state (the default policy's tables, the fault feedback's
// records: tens of KiB, varying by a few KiB with the timing of CUPTI's thread), the same
// for 10 000 blocks as for 100 000.
TEST(Limits, ShimHeapPerLiveBlockIsBoundedAndReturned) {
  // Heap growth of the shim (with it, less without it) while `n` blocks live and after
  // they are freed.
  auto measure = [](long n, double* live, double* after) {
    RunResult with = run({kProgram, "footprint", std::to_string(n)},
                         {{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}}, 120);
    RunResult plain = run({kProgram, "footprint", std::to_string(n)}, {{"LD_LIBRARY_PATH", kFakeDir}}, 120);
    ASSERT_EQ(with.status, 0) << with.out << with.err;
    ASSERT_EQ(plain.status, 0) << plain.out << plain.err;
    *live = (number(with.out, "heap_live") - number(with.out, "heap_init")) -
            (number(plain.out, "heap_live") - number(plain.out, "heap_init"));
    *after = (number(with.out, "heap_after") - number(with.out, "heap_init")) -
             (number(plain.out, "heap_after") - number(plain.out, "heap_init"));
  };
  const long n = 100000;
  double live = 0, after = 0, live_small = 0, after_small = 0;
  measure(n, &live, &after);
  measure(n / 10, &live_small, &after_small);
  const double per_block = live / n;
  std::printf("shim heap: %.0f bytes per live block, %.0f bytes left after freeing %ld blocks (%.0f after %ld)\n",
              per_block, after, n, after_small, n / 10);
  EXPECT_LT(per_block, 512.0);
  EXPECT_LT(after, 128.0 * 1024) << "the shim keeps (almost) nothing once its blocks are freed";
  // A byte kept per freed block would be 90 000 bytes more after the larger run.
  EXPECT_LT(after - after_small, 64.0 * 1024) << "what stays grows with the number of blocks freed";
}


// At the default log level a user learns what happened without asking: a size without a
// unit that is surely not bytes, a budget larger than the card, the first allocation the cap
// refuses (naming SPILLWAY_MAX_MANAGED), and one line at exit (SPILLWAY_SUMMARY) — and
// nothing else.
TEST(Limits, DefaultLevelSaysWhatHappenedInOneLineEach) {
  RunResult r = run({kProgram, "fill", "1"},
                    {{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}, {"FAKECUDA_TOTAL_MEMORY", std::to_string(1ull << 30)},
                     {"SPILLWAY_MAX_MANAGED", "3GiB"}, {"SPILLWAY_BUDGET", "2TiB"}, {"SPILLWAY_SUMMARY", "on"},
                     {"SPILLWAY_SUBALLOCATOR", "off"}},  // (blocks of exactly 1 GiB: the figures are round)
                    120);
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(field(r.out, "blocks"), "3") << r.out;
  const std::vector<std::string> clamp = lines_with(r.err, "SPILLWAY_BUDGET asks for 2 TiB, more than its 1 GiB free of 1 GiB");
  EXPECT_EQ(clamp.size(), 1u) << r.err;
  const std::vector<std::string> refused = lines_with(r.err, "refused an allocation of 1 GiB (cuMemAlloc)");
  ASSERT_EQ(refused.size(), 1u) << r.err;
  EXPECT_NE(refused[0].find("cap SPILLWAY_MAX_MANAGED = 3 GiB"), std::string::npos) << refused[0];
  const std::vector<std::string> exit_line = lines_with(r.err, " s, policy learned: peak 3 GiB managed, 2 GiB over the 1 GiB budget");
  ASSERT_EQ(exit_line.size(), 1u) << r.err;
  EXPECT_NE(exit_line[0].find("1 allocations refused by SPILLWAY_MAX_MANAGED = 3 GiB"), std::string::npos) << exit_line[0];
  EXPECT_EQ(lines_with(r.err, "spillway: ").size(), 3u) << "nothing else at the default level:\n" << r.err;

  RunResult bare = run({kProgram, "fill", "1"}, {{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim},
                                                 {"SPILLWAY_MAX_MANAGED", "3GiB"}, {"SPILLWAY_BUDGET", "4"}}, 120);
  ASSERT_EQ(bare.status, 0) << bare.out << bare.err;
  EXPECT_EQ(lines_with(bare.err, "SPILLWAY_BUDGET=4 means 4 bytes (a size without a unit is bytes); did you mean 4GiB or 4MiB?").size(),
            1u) << bare.err;
}

}  // namespace
}  // namespace spillway::test
