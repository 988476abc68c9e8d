// The schedule `spillway replay --calls` writes and `spillway-linkbench --schedule` replays on
// a GPU (bench/workloads/move_schedule.h): every call read back as written, the memory and
// byte limits, the 2 MiB pieces.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "move_schedule.h"

namespace {

constexpr std::uint64_t MiB = 1ull << 20;

std::string replay_calls(const std::string& trace) {
  const std::string path = (std::filesystem::temp_directory_path() / ("calls-" + std::to_string(getpid()) + ".jsonl")).string();
  const std::string cmd = std::string(SPILLWAY_CLI) + " replay " + SPILLWAY_SOURCE_DIR + "/bench/traces/" + trace +
                          " --policy learned --capacity 0.5 --link h200 --calls " + path + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return path;
}

TEST(MoveSchedule, ReadsEveryCallReplayWrites) {
  const std::string path = replay_calls("resnet50-train-b512.jsonl.gz");
  std::ifstream in(path);
  std::uint64_t lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  const move_schedule::Schedule all = move_schedule::read(path.c_str(), ~0ull, ~0ull);
  ASSERT_TRUE(all.error.empty()) << all.error;
  EXPECT_EQ(all.calls.size(), lines);
  EXPECT_EQ(all.skipped, 0u);
  EXPECT_EQ(all.h2d_calls + all.d2h_calls, lines);
  EXPECT_GT(all.charged_ns, 0u);
  EXPECT_GT(all.flat_ns, all.charged_ns) << "h200: long calls are charged less than their chunks as 2 MiB calls";
  // Within 1 GiB of memory, and at most 4 GiB copied: the rest is skipped.
  const move_schedule::Schedule some = move_schedule::read(path.c_str(), 1024 * MiB, 4096 * MiB);
  EXPECT_GT(some.skipped, 0u);
  EXPECT_EQ(some.calls.size() + some.skipped, lines);
  for (const move_schedule::Call& c : some.calls) EXPECT_LE(c.offset + c.bytes, 1024 * MiB);
  EXPECT_LT(some.copied_bytes, 4096 * MiB + 1024 * MiB);
  std::filesystem::remove(path);
}

// A batched prefetch's ranges come back with their batch number, consecutive, toward the GPU
// only, and batch_end() gives the ranges linkbench hands to one cudaMemPrefetchBatchAsync.
TEST(MoveSchedule, ABatchsRangesComeBackTogether) {
  const std::string path = replay_calls("gpt2-xl-infer-b48.jsonl.gz");
  const move_schedule::Schedule s = move_schedule::read(path.c_str(), ~0ull, ~0ull);
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_GT(s.batches, 0u) << "paged decoding fetches ranges apart: batches on h200";
  std::uint64_t batches = 0, last = 0;
  for (std::size_t i = 0, j = 0; i < s.calls.size(); i = j) {
    j = move_schedule::batch_end(s.calls, i);
    if (s.calls[i].batch == 0) {
      EXPECT_EQ(j, i + 1);
      continue;
    }
    ++batches;
    EXPECT_GT(s.calls[i].batch, last) << "numbered in issue order";
    last = s.calls[i].batch;
    EXPECT_GE(j - i, 2u);
    for (std::size_t k = i; k < j; ++k) EXPECT_TRUE(s.calls[k].to_gpu);
  }
  EXPECT_EQ(batches, s.batches);
  // A line written before batches were recorded still reads, as a call of its own.
  move_schedule::Call c;
  ASSERT_TRUE(move_schedule::parse_call("{\"to\": \"gpu\", \"offset\": 0, \"bytes\": 4096, \"copied_chunks\": 1, "
                                        "\"issue_ns\": 0, \"charged_ns\": 5, \"flat_ns\": 5}\n", c));
  EXPECT_EQ(c.batch, 0u);
  EXPECT_FALSE(move_schedule::parse_call("{\"to\": \"cpu\", \"offset\": 0, \"bytes\": 4096, \"copied_chunks\": 1, "
                                         "\"issue_ns\": 0, \"charged_ns\": 5, \"flat_ns\": 5, \"batch\": 3}\n", c))
      << "evictions are never batched";
  std::filesystem::remove(path);
}

TEST(MoveSchedule, ACallSplitsIntoTheChunksItSpans) {
  move_schedule::Call c;
  c.offset = 3 * MiB;
  c.bytes = 5 * MiB;
  const auto pieces = move_schedule::chunk_pieces(c);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0], std::make_pair(3 * MiB, 1 * MiB));
  EXPECT_EQ(pieces[1], std::make_pair(4 * MiB, 2 * MiB));
  EXPECT_EQ(pieces[2], std::make_pair(6 * MiB, 2 * MiB));
}

TEST(MoveSchedule, AnythingElseIsAnErrorNamingTheLine) {
  const std::string path = (std::filesystem::temp_directory_path() / ("bad-" + std::to_string(getpid()) + ".jsonl")).string();
  std::ofstream(path) << "{\"to\": \"gpu\", \"offset\": 0, \"bytes\": 4096, \"copied_chunks\": 1, \"issue_ns\": 0, "
                         "\"charged_ns\": 5, \"flat_ns\": 5}\n{\"to\": \"moon\"}\n";
  const move_schedule::Schedule s = move_schedule::read(path.c_str(), ~0ull, ~0ull);
  EXPECT_EQ(s.error, path + ":2: not a move call of spillway replay --calls");
  EXPECT_EQ(move_schedule::read("/nonexistent/x", 1, 1).error, "cannot open /nonexistent/x");
  // Numbers that wrap, a sign, and anything after the closing brace are refused.
  move_schedule::Call c;
  const std::string tail = ", \"copied_chunks\": 1, \"issue_ns\": 0, \"charged_ns\": 5, \"flat_ns\": 5}";
  EXPECT_TRUE(move_schedule::parse_call(("{\"to\": \"cpu\", \"offset\": 4096, \"bytes\": 4096" + tail + "\n").c_str(), c));
  EXPECT_FALSE(move_schedule::parse_call(("{\"to\": \"gpu\", \"offset\": 18446744073709551615, \"bytes\": 2" + tail).c_str(), c));
  EXPECT_FALSE(move_schedule::parse_call(("{\"to\": \"gpu\", \"offset\": -2097152, \"bytes\": 4194304" + tail).c_str(), c));
  EXPECT_FALSE(move_schedule::parse_call(("{\"to\": \"gpu\", \"offset\": 0, \"bytes\": 4096" + tail + " garbage").c_str(), c));
  std::filesystem::remove(path);
}

}  // namespace
