// The context and pointer kinds (tests/reliability/hostile_contexts.cpp), run under the
// shim against the fake driver. Managed memory belongs to the context it was allocated in and
// goes when that context ends: the shim must never let one context's end take another's
// memory, must release exactly the ended context's blocks, and must answer pointer and
// memory queries as the driver would have without it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kProgram = RELIABILITY_PROGRAM_DIR "/hostile_contexts";

Env env(const Env& extra = {}, bool shim = true) {
  Env e{{"LD_LIBRARY_PATH", kFakeDir}};
  if (shim) e["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) e[k] = v;
  return e;
}

RunResult program(std::vector<std::string> args, const Env& e) {
  args.insert(args.begin(), kProgram);
  return run(args, e, 120);
}

nlohmann::json report_of(const std::string& path, const RunResult& r) {
  const std::string text = read_file(path);
  EXPECT_FALSE(text.empty()) << describe(r);
  return text.empty() ? nlohmann::json::object() : nlohmann::json::parse(text);
}

// Kind 1: a created context allocates first (on a shim with one set of ranges, the range the
// primary context's blocks are then carved from is the created context's), and is destroyed;
// 39 more come and go, each leaving 1 MiB it never frees. The primary context's data stays,
// and the report holds only what the program holds.
TEST(HostileContexts, ADestroyedContextTakesOnlyItsOwnMemory) {
  const std::string report = temp_dir() + "/r.json";
  RunResult r = program({"created", "40"}, env({{"SPILLWAY_REPORT", report}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "primary_ok"), "1") << "the primary context's blocks lost their data\n" << describe(r);
  EXPECT_EQ(field(r.out, "later_ok"), "1") << describe(r);
  nlohmann::json j = report_of(report, r);
  EXPECT_EQ(std::to_string(j["bytes"]["live_blocks"].get<long long>()), field(r.out, "held"))
      << "the destroyed contexts' blocks are still counted\n" << j.dump(2);
  EXPECT_LE(j["suballocator"]["ranges"].get<int>(), 2) << "the destroyed contexts' ranges are still held\n" << j.dump(2);
  EXPECT_EQ(r.err, "");
}

// Kind 1, primary contexts: a reset or the last release frees the primary context's memory
// and nobody else's; the primary context works again afterwards.
TEST(HostileContexts, APrimaryContextsResetOrLastReleaseTakesOnlyItsOwnMemory) {
  for (const std::string how : {"reset", "release"}) {
    const std::string report = temp_dir() + "/r-" + how + ".json";
    RunResult r = program({how}, env({{"SPILLWAY_REPORT", report}}));
    ASSERT_EQ(r.status, 0) << how << ": " << describe(r);
    EXPECT_EQ(field(r.out, "other_ok"), "1") << how << ": the created context's block lost its data\n" << describe(r);
    EXPECT_EQ(field(r.out, "after_ok"), "1") << how << ": " << describe(r);
    nlohmann::json j = report_of(report, r);
    EXPECT_EQ(std::to_string(j["bytes"]["live_blocks"].get<long long>()), field(r.out, "held"))
        << how << ": the primary context's old block is still counted\n" << j.dump(2);
    EXPECT_EQ(r.err, "") << how;
  }
}

// The fake driver itself frees a primary context's memory at its end (as the driver does),
// so the checks above mean something: without the shim the same programs pass.
TEST(HostileContexts, TheProgramsPassWithoutTheShim) {
  for (const std::string how : {"reset", "release"}) {
    RunResult r = program({how}, env({}, false));
    ASSERT_EQ(r.status, 0) << how << ": " << describe(r);
    EXPECT_EQ(field(r.out, "other_ok"), "1") << how;
    EXPECT_EQ(field(r.out, "after_ok"), "1") << how;
  }
  RunResult r = program({"created", "40"}, env({}, false));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "primary_ok"), "1");
}

// Kind 7: a block allocated on the second device says so, and names that device's context,
// to every query frameworks place tensors with.
TEST(HostileContexts, ABlockOnTheSecondDeviceReportsThatDevice) {
  RunResult r = program({"devices"}, env({{"FAKECUDA_DEVICES", "2"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "ordinal"), "1") << describe(r);
  EXPECT_EQ(field(r.out, "ordinals"), "1") << describe(r);
  EXPECT_EQ(field(r.out, "runtime_device"), "1") << describe(r);
  EXPECT_EQ(field(r.out, "context_ok"), "1") << describe(r);
}

// Kind 8: every pointer query on freed memory answers exactly as the driver answers it
// without the shim (where the memory is freed for real), attribute by attribute.
TEST(HostileContexts, PointerQueriesOnFreedMemoryAnswerAsTheDriver) {
  RunResult plain = program({"freed"}, env({}, false));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  RunResult shim = program({"freed"}, env());
  ASSERT_EQ(shim.status, 0) << describe(shim);
  EXPECT_EQ(shim.out, plain.out) << "with the shim:\n" << shim.out << "without:\n" << plain.out;
  EXPECT_NE(plain.out.find("range=500"), std::string::npos) << "CUDA_ERROR_NOT_FOUND: " << plain.out;
}

// Kind 9: under SPILLWAY_REPORT_MEMORY=virtual, memory the program frees comes back to
// cuMemGetInfo's free figure (the sub-allocator keeps its ranges, but their room is free).
TEST(HostileContexts, FreedMemoryComesBackToTheVirtualFreeFigure) {
  RunResult r = program({"meminfo"}, env({{"SPILLWAY_REPORT_MEMORY", "virtual"}, {"SPILLWAY_MAX_MANAGED", "1GiB"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  const long free0 = std::stol(field(r.out, "free0")), free1 = std::stol(field(r.out, "free1"));
  const long free2 = std::stol(field(r.out, "free2")), free3 = std::stol(field(r.out, "free3"));
  EXPECT_EQ(free0, 1024) << r.out;
  EXPECT_LE(free1, free0 - 256) << r.out;
  EXPECT_GE(free2, free0 - 16) << "freed memory did not come back: " << r.out;  // (ranges' 2 MiB alignment slack)
  EXPECT_LE(free3, free0 - 256) << r.out;
  EXPECT_GE(free3, free1 - 16) << r.out;
}

}  // namespace
}  // namespace spillway::test
