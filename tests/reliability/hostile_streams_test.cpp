// The stream kinds: memory freed while streams, contexts and captures still hold work
// on it (tests/reliability/hostile_streams.cpp), run under the shim against the fake driver.
// Each program is correct; the shim must never hand out memory that work issued before its
// free may still use, must keep reusing what no such work uses, and must fence by the
// streams that had work, not by every stream ever made.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/hostile_streams";

Env env(const Env& extra = {}) {
  Env e{{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}};
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

RunResult program(std::vector<std::string> args, const Env& e) {
  args.insert(args.begin(), kProgram);
  return run(args, e, 120);
}

// Fences batched (demand: no plan closes one at a free), work pending until synchronised.
const Env kPendingWork{{"FAKECUDA_ASYNC", "1"}, {"SPILLWAY_POLICY", "demand"}};

// Kind 2: cuStreamDestroy returns while the stream's work still runs; a block freed on that
// stream must wait for it, though the stream is gone when the fence is recorded.
TEST(HostileStreams, ABlockFreedOnADestroyedStreamWaitsForItsWork) {
  for (const std::string api : {"driver", "runtime"}) {
    RunResult r = program({"destroyed_stream", api}, env(kPendingWork));
    ASSERT_EQ(r.status, 0) << api << ": " << describe(r);
    EXPECT_FALSE(field(r.out, "reused") == "1" && field(r.out, "pending") == "1")
        << api << ": handed out while the destroyed stream's kernel may write it\n" << describe(r);
    EXPECT_TRUE(field(r.out, "reused") == "1" || field(r.out, "reused_later") == "1")
        << api << ": reused once the work completed\n" << describe(r);
    EXPECT_EQ(r.err, "") << api;
  }
}

// Kind 3: a context that only copied, or only carved a block (no driver call) and used it,
// is fenced like one that launched.
TEST(HostileStreams, AContextThatOnlyCopiedOrCarvedIsFenced) {
  for (const std::string how : {"copy", "carve"}) {
    RunResult r = program({"other_context", how}, env(kPendingWork));
    ASSERT_EQ(r.status, 0) << how << ": " << describe(r);
    EXPECT_FALSE(field(r.out, "reused") == "1" && field(r.out, "pending") == "1")
        << how << ": reused while the other context's work may use it\n" << describe(r);
    EXPECT_TRUE(field(r.out, "reused") == "1" || field(r.out, "reused_later") == "1")
        << how << ": reused once the work completed\n" << describe(r);
    EXPECT_EQ(r.err, "") << how;
  }
}

// Kind 10: a capture left open holds only what its captured work uses, and says so once.
TEST(HostileStreams, AnOpenCaptureHoldsOnlyWhatItsWorkUsesAndSaysSo) {
  for (const std::string kind : {"nonblocking", "blocking"}) {
    RunResult r = program({"open_capture", kind}, env({{"SPILLWAY_POLICY", "demand"}, {"SPILLWAY_MAX_MANAGED", "256MiB"}}));
    ASSERT_EQ(r.status, 0) << kind << ": " << describe(r);
    EXPECT_EQ(field(r.out, "rounds"), "40") << kind << ": reuse stopped while the capture was open\n" << describe(r);
    EXPECT_EQ(field(r.out, "x_reused"), "0") << kind << ": the captured kernel's block was reused\n" << describe(r);
    std::size_t lines = 0;
    for (const std::string& line : split_lines(r.err)) lines += line.find("is held, not reused: a stream capture") != std::string::npos;
    EXPECT_EQ(lines, 1u) << kind << ": one line says why memory is held\n" << describe(r);
  }
}

// Kind 11: a free and its reuse record events on the streams that had work, not on every
// stream ever made (2 000 idle ones here).
TEST(HostileStreams, AFenceCostsByBusyStreamsNotStreamsEverMade) {
  const std::string log = temp_dir() + "/fake.log";
  RunResult r = program({"idle_streams", "2000"}, env({{"FAKECUDA_LOG", log}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "reused"), "1") << describe(r);
  std::size_t markers = 0, records = 0;
  for (const std::string& line : split_lines(read_file(log))) {
    if (line.rfind("cuDriverGetVersion ", 0) == 0) ++markers;
    if (markers == 1 && line.rfind("cuEventRecord ", 0) == 0) ++records;
  }
  ASSERT_EQ(markers, 2u);
  EXPECT_GE(records, 1u) << "the busy stream's work is fenced";
  EXPECT_LE(records, 8u) << "events recorded for one free and its reuse with 2000 idle streams";
  std::printf("cuEventRecord calls for one free + reuse beside 2000 idle streams: %zu\n", records);
}

}  // namespace
}  // namespace spillway::test
