// End-to-end tests: the ordinary CUDA programs of tests/programs run with libspillway.so
// preloaded (LD_PRELOAD) against the fake driver and runtime of tests/fakecuda, and the same
// programs without the shim to show each check can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kPrograms = PROGRAM_DIR;
const std::string kCli = SPILLWAY_CLI;
const std::string kExcludedLib = EXCLUDED_LIB;
const std::string kProbeLib = PRELOAD_PROBE_LIB;

Env fake_env(bool shim, const Env& extra = {}) {
  Env env{{"LD_LIBRARY_PATH", kFakeDir}};
  if (shim) env["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

RunResult program(const std::string& name, std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), kPrograms + "/" + name);
  return run(args, env);
}

nlohmann::json read_report(const std::string& path) {
  std::string text = read_file(path);
  if (text.empty()) return nlohmann::json::object();
  return nlohmann::json::parse(text);
}

// ---- every allocation path ends managed; without the shim the same program gets device memory

class DriverAllocationPath : public ::testing::TestWithParam<const char*> {};

TEST_P(DriverAllocationPath, EndsManagedWithShim) {
  RunResult r = program("alloc_paths", {GetParam(), "--expect-managed=1"}, fake_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "1") << describe(r);
  EXPECT_EQ(r.err, "") << "the shim is silent on success";
}

TEST_P(DriverAllocationPath, StaysDeviceMemoryWithoutShim) {
  RunResult r = program("alloc_paths", {GetParam()}, fake_env(false));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0") << describe(r);
}

INSTANTIATE_TEST_SUITE_P(Paths, DriverAllocationPath,
                         ::testing::Values("cuMemAlloc", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
                                           "default_pool", "dlsym", "getproc3020", "getproc12000", "getproc_self",
                                           "getproc_per_thread"));

class RuntimeAllocationPath : public ::testing::TestWithParam<const char*> {};

TEST_P(RuntimeAllocationPath, EndsManagedWithShim) {
  RunResult r = program("runtime_alloc", {GetParam(), "--expect-managed=1"}, fake_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "1") << describe(r);
  EXPECT_EQ(r.err, "");
}

TEST_P(RuntimeAllocationPath, StaysDeviceMemoryWithoutShim) {
  RunResult r = program("runtime_alloc", {GetParam()}, fake_env(false));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0") << describe(r);
}

INSTANTIATE_TEST_SUITE_P(Paths, RuntimeAllocationPath,
                         ::testing::Values("cudaMalloc", "cudaMallocPitch", "cudaMallocAsync", "entry_point"));

TEST(AllocationPaths, PitchIsAMultipleOf512) {
  RunResult r = program("alloc_paths", {"cuMemAllocPitch"}, fake_env(true));
  ASSERT_EQ(r.status, 0) << describe(r);
  std::string pitch = field(r.out, "pitch");
  ASSERT_FALSE(pitch.empty());
  EXPECT_EQ(std::stoul(pitch) % 512, 0u);
  EXPECT_GE(std::stoul(pitch), 1000u);
  RunResult plain = program("alloc_paths", {"cuMemAllocPitch"}, fake_env(false));
  EXPECT_EQ(field(plain.out, "pitch"), pitch) << "the same pitch the driver gives";
}

TEST(AllocationPaths, CreatedPoolIsPassedThrough) {
  std::string report = temp_dir() + "/r.json";
  RunResult r = program("alloc_paths", {"created_pool", "--expect-managed=0"},
                        fake_env(true, {{"SPILLWAY_REPORT", report}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0");
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["allocations"]["redirected"], 0) << j.dump();
  EXPECT_EQ(j["allocations"]["passed_through"], 1) << j.dump();
}

// ---- versioned lookups: exactly the ABI the driver returns ------------------------------------

TEST(VersionedLookup, ReturnsExactlyTheAbiOfThatVersion) {
  RunResult with = program("proc_versions", {}, fake_env(true));
  ASSERT_EQ(with.status, 0) << describe(with);
  RunResult without = program("proc_versions", {}, fake_env(false));
  ASSERT_EQ(without.status, 0) << describe(without);
  // The driver symbols the shim hooks: from interpose/hooks.def itself, the one list.
  const std::set<std::string> hooked = [] {
    std::set<std::string> names;
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) names.insert(#symbol);
#include "hooks.def"
    return names;
  }();
  auto lines = with.out_lines();
  ASSERT_EQ(lines.size(), without.out_lines().size());
  ASSERT_GE(lines.size(), 15u);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::istringstream w(lines[i]), wo(without.out_lines()[i]);
    std::string lookup, symbol, object, lookup0, symbol0, object0;
    w >> lookup >> symbol >> object;
    wo >> lookup0 >> symbol0 >> object0;
    EXPECT_EQ(lookup, lookup0);
    EXPECT_EQ(symbol, symbol0);
    EXPECT_EQ(object0, "libcuda.so.1") << lines[i];
    EXPECT_EQ(object, hooked.count(symbol) ? "libspillway.so" : "libcuda.so.1") << lines[i];
  }
  EXPECT_EQ(lines_with(with.out, "cuMemAdvise@8000 cuMemAdvise libcuda.so.1").size(), 1u) << with.out;
  EXPECT_EQ(lines_with(with.out, "cuMemAlloc@2000 cuMemAlloc libcuda.so.1").size(), 1u) << with.out;
}

// ---- frees ------------------------------------------------------------------------------------

TEST(Frees, DoubleFreeReturnsTheDriversError) {
  RunResult r = program("free_cases", {"double"}, fake_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "first"), "0");
  EXPECT_EQ(field(r.out, "second"), std::to_string(CUDA_ERROR_INVALID_VALUE_CODE)) << describe(r);
  RunResult plain = program("free_cases", {"double"}, fake_env(false));
  EXPECT_EQ(plain.out, r.out);
}

TEST(Frees, HostAllocPointerPassesThroughToTheDriver) {
  std::string log = temp_dir() + "/fake.log";
  RunResult r = program("free_cases", {"host"}, fake_env(true, {{"FAKECUDA_LOG", log}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "first"), std::to_string(CUDA_ERROR_INVALID_VALUE_CODE));
  EXPECT_EQ(field(r.out, "second"), "0");
  std::string host = field(r.out, "host");
  ASSERT_FALSE(host.empty());
  auto frees = lines_with(read_file(log), "cuMemFree_v2 dptr=" + host);
  ASSERT_EQ(frees.size(), 1u) << "the driver itself saw the free";
  EXPECT_NE(frees[0].find("-> 1"), std::string::npos) << frees[0];
}

TEST(Frees, UnknownPointerPassesThroughToTheDriver) {
  std::string log = temp_dir() + "/fake.log";
  RunResult r = program("free_cases", {"unknown"}, fake_env(true, {{"FAKECUDA_LOG", log}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "first"), std::to_string(CUDA_ERROR_INVALID_VALUE_CODE));
  EXPECT_EQ(lines_with(read_file(log), "cuMemFree_v2 dptr=0x1234000 -> 1").size(), 1u);
}

// ---- host cap, oversubscription, memory info ---------------------------------------------------

TEST(HostCap, DriverAllocationPastTheCapIsOutOfMemoryAndSmallerStillWorks) {
  std::string report = temp_dir() + "/r.json";
  RunResult r = program("mem_limits", {"sizes", "48M", "32M", "8M"},
                        fake_env(true, {{"SPILLWAY_MAX_MANAGED", "64MiB"}, {"SPILLWAY_REPORT", report}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "alloc 48M -> 0\nalloc 32M -> 2\nalloc 8M -> 0\n") << "2 = CUDA_ERROR_OUT_OF_MEMORY";
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["allocations"]["refused"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["redirected"], 2) << j.dump();
  EXPECT_EQ(j["bytes"]["max_managed"], 64 << 20) << j.dump();
  RunResult plain = program("mem_limits", {"sizes", "48M", "32M", "8M"}, fake_env(false, {{"SPILLWAY_MAX_MANAGED", "64MiB"}}));
  EXPECT_EQ(plain.out, "alloc 48M -> 0\nalloc 32M -> 0\nalloc 8M -> 0\n");
}

TEST(HostCap, RuntimeAllocationPastTheCapIsCudaErrorMemoryAllocation) {
  RunResult r = program("runtime_alloc", {"sizes", "48M", "32M", "8M"}, fake_env(true, {{"SPILLWAY_MAX_MANAGED", "64MiB"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "malloc 48M -> 0\nmalloc 32M -> 2\nmalloc 8M -> 0\n") << "2 = cudaErrorMemoryAllocation";
}

// A 0-byte cudaMalloc succeeds with NULL without reaching the driver (the
// runtime's answer); that is no allocation the shim missed, and says nothing.
TEST(RuntimeWarnings, ZeroByteRuntimeAllocationIsNoMissedAllocation) {
  RunResult r = program("runtime_alloc", {"sizes", "0", "1M", "0"}, fake_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "malloc 0 -> 0\nmalloc 1M -> 0\nmalloc 0 -> 0\n");
  EXPECT_EQ(r.err, "") << "a false warning (and, being once only, one that would hide a real one)";
}

TEST(HostCap, DriverOutOfMemoryFromManagedAllocationIsPassedOn) {
  // The driver refuses the managed allocation itself: the program gets the driver's code.
  // (The sub-allocator asks twice, a 64 MiB range and then the request's own size: both fail.)
  RunResult r = program("mem_limits", {"sizes", "1M", "1M"},
                        fake_env(true, {{"FAKECUDA_FAIL", "cuMemAllocManaged:1,cuMemAllocManaged:2"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "alloc 1M -> 2\nalloc 1M -> 0\n");
  // Per block, one refusal is the program's.
  RunResult block = program("mem_limits", {"sizes", "1M", "1M"},
                            fake_env(true, {{"FAKECUDA_FAIL", "cuMemAllocManaged:1"}, {"SPILLWAY_SUBALLOCATOR", "off"}}));
  EXPECT_EQ(block.status, 0) << describe(block);
  EXPECT_EQ(block.out, "alloc 1M -> 2\nalloc 1M -> 0\n");
}

TEST(Oversubscription, TwiceTheDeviceMemoryFailsWithoutShimAndWorksWithIt) {
  Env fake{{"FAKECUDA_TOTAL_MEMORY", std::to_string(64 << 20)}};
  RunResult plain = program("mem_limits", {"double_device"}, fake_env(false, fake));
  EXPECT_EQ(plain.status, 2) << describe(plain);
  EXPECT_EQ(field(plain.out, "last"), "2") << "CUDA_ERROR_OUT_OF_MEMORY without the shim";
  RunResult with = program("mem_limits", {"double_device"}, fake_env(true, fake));
  EXPECT_EQ(with.status, 0) << describe(with);
  EXPECT_EQ(field(with.out, "allocated"), std::to_string(128 << 20));
  EXPECT_EQ(with.err, "");
}

TEST(MemGetInfo, ReportsPhysicalMemoryByDefaultAndSurvivesNullArguments) {
  RunResult with = program("mem_limits", {"meminfo"}, fake_env(true, {{"FAKECUDA_TOTAL_MEMORY", "1073741824"}}));
  ASSERT_EQ(with.status, 0) << describe(with);
  RunResult plain = program("mem_limits", {"meminfo"}, fake_env(false, {{"FAKECUDA_TOTAL_MEMORY", "1073741824"}}));
  EXPECT_EQ(with.out, plain.out);
  EXPECT_EQ(field(with.out, "total"), "1073741824");
  EXPECT_EQ(field(with.out, "null_both"), "1");
  EXPECT_EQ(field(with.out, "null_free"), "1");
  EXPECT_EQ(field(with.out, "null_total"), "1");
}

TEST(MemGetInfo, VirtualReportsTheCapAndSurvivesNullArguments) {
  RunResult r = program("mem_limits", {"meminfo"},
                        fake_env(true, {{"SPILLWAY_REPORT_MEMORY", "virtual"}, {"SPILLWAY_MAX_MANAGED", "64MiB"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "total"), std::to_string(64 << 20));
  EXPECT_EQ(field(r.out, "free"), std::to_string(64 << 20));
  EXPECT_EQ(field(r.out, "null_both"), "1");
  EXPECT_EQ(field(r.out, "null_free"), "1");
  EXPECT_EQ(field(r.out, "null_total"), "1");
}

TEST(MemGetInfo, RuntimeReportsPhysicalByDefaultAndTheCapWhenVirtual) {
  Env fake{{"FAKECUDA_TOTAL_MEMORY", "1073741824"}, {"SPILLWAY_MAX_MANAGED", "64MiB"}};
  RunResult physical = program("runtime_alloc", {"meminfo"}, fake_env(true, fake));
  ASSERT_EQ(physical.status, 0) << describe(physical);
  EXPECT_EQ(field(physical.out, "total"), "1073741824");
  fake["SPILLWAY_REPORT_MEMORY"] = "virtual";
  RunResult virt = program("runtime_alloc", {"meminfo"}, fake_env(true, fake));
  ASSERT_EQ(virt.status, 0) << describe(virt);
  EXPECT_EQ(field(virt.out, "total"), std::to_string(64 << 20));
}

// ---- IPC --------------------------------------------------------------------------------------

TEST(Ipc, ManagedBlockReturnsTheErrorAndLogsOneLineNamingSpillwayExclude) {
  RunResult r = program("ipc", {"4"}, fake_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(lines_with(r.out, "ipc=1").size(), 4u) << describe(r);
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("SPILLWAY_EXCLUDE"), std::string::npos) << r.err;
  RunResult plain = program("ipc", {"2"}, fake_env(false));
  EXPECT_EQ(plain.out, "ipc=0\nipc=0\n") << "device memory can be shared";
}

// ---- stream capture and stream-ordered frees -------------------------------------------------

struct CaptureRun {
  RunResult result;
  std::vector<std::string> log;
  std::string stream, a, b, c, d;
};

CaptureRun run_capture(bool shim, const std::string& mode = "", const Env& extra = {}) {
  CaptureRun c;
  std::string log = temp_dir() + "/fake.log";
  // (The per-block path: the driver's own calls show each release. The sub-allocator's
  // captured frees: StreamCapture.SubAllocatedBlockFreedInACaptureIsNotReusedBeforeTheGraphRuns.)
  Env env = fake_env(shim, {{"FAKECUDA_LOG", log}, {"SPILLWAY_SUBALLOCATOR", "off"}});
  for (const auto& [k, v] : extra) env[k] = v;
  c.result = program("capture", mode.empty() ? std::vector<std::string>{} : std::vector<std::string>{mode}, env);
  c.log = split_lines(read_file(log));
  c.stream = field(c.result.out, "stream");
  c.a = field(c.result.out, "A");
  c.b = field(c.result.out, "B");
  c.c = field(c.result.out, "C");
  c.d = field(c.result.out, "D");
  return c;
}

std::string call_name(const std::string& line) { return line.substr(0, line.find(' ')); }

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

std::vector<std::string>::const_iterator first_call(const CaptureRun& c, const std::string& prefix) {
  return std::find_if(c.log.begin(), c.log.end(), [&](auto& l) { return l.rfind(prefix, 0) == 0; });
}

TEST(StreamCapture, ShimIssuesNothingOnACapturingStream) {
  CaptureRun c = run_capture(true);
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  ASSERT_FALSE(c.stream.empty());
  // Queries are allowed; of the program's own captured calls, only those of the graph's own
  // memory B reach the driver (a graph memory node is the driver's); A's free is the shim's.
  for (const std::string& line : c.log) {
    if (line.find("stream=" + c.stream + " capturing=1") == std::string::npos) continue;
    std::string name = call_name(line);
    bool own_memory_node = (name == "cuMemAllocAsync" && line.find("dptr=" + c.b) != std::string::npos) ||
                           (name == "cuMemFreeAsync" && line.find("dptr=" + c.b) != std::string::npos);
    EXPECT_TRUE(name == "cuStreamIsCapturing" || name == "cuStreamGetCaptureInfo_v3" || name == "cuStreamEndCapture" ||
                own_memory_node)
        << line << ": issued on the capturing stream";
  }
  auto begin = first_call(c, "cuStreamBeginCapture_v2");
  auto end = first_call(c, "cuStreamEndCapture");
  ASSERT_TRUE(begin != c.log.end() && end != c.log.end() && begin < end);
  for (auto it = begin; it != end; ++it) {
    std::string name = call_name(*it);
    EXPECT_TRUE(name != "cuMemFree_v2" && name != "cuEventRecord" && name.rfind("cuMemPrefetchAsync", 0) != 0 &&
                name != "cuEventSynchronize" && name != "cuStreamSynchronize" && name != "cuMemAllocManaged")
        << "during capture: " << *it;
  }
}

// An allocation made inside a capture is a graph memory node, the
// driver's for the graph's lifetime; a block freed inside a capture is freed by the graph,
// when it runs. Neither may be reused while a graph exec that uses it can still run.
TEST(StreamCapture, CapturedAllocationIsTheDriversGraphMemory) {
  CaptureRun c = run_capture(true);
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  // A (allocated before the capture) is made managed; B (captured) reaches the driver's own
  // cuMemAllocAsync on the capturing stream, and so does its captured free.
  std::vector<std::string> allocs, managed;
  for (const std::string& l : c.log) {
    if (call_name(l) == "cuMemAllocAsync") allocs.push_back(l);
    if (call_name(l) == "cuMemAllocManaged" && l.find("bytesize=1048576 ") != std::string::npos) managed.push_back(l);
  }
  ASSERT_EQ(allocs.size(), 1u) << join_lines(c.log);
  EXPECT_NE(allocs[0].find("capturing=1"), std::string::npos) << allocs[0];
  EXPECT_NE(allocs[0].find("dptr=" + c.b), std::string::npos) << allocs[0];
  ASSERT_EQ(managed.size(), 1u) << join_lines(c.log);
  EXPECT_NE(managed[0].find("dptr=" + c.a), std::string::npos) << managed[0];
  EXPECT_NE(first_call(c, "cuMemFreeAsync dptr=" + c.b + " "), c.log.end()) << "B's captured free is the driver's";
}

TEST(StreamCapture, BlockFreedInACaptureStaysLiveUntilTheGraphRuns) {
  CaptureRun c = run_capture(true, "launch");
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  ASSERT_FALSE(c.a.empty());
  EXPECT_NE(c.c, c.a) << "A was reused before the graph that frees it ran";
  auto launch = first_call(c, "cuGraphLaunch");
  auto freed = first_call(c, "cuMemFree_v2 dptr=" + c.a + " ");
  ASSERT_NE(launch, c.log.end());
  ASSERT_NE(freed, c.log.end()) << "A is released once the graph has run";
  EXPECT_GT(freed, launch) << *freed;
  EXPECT_NE(freed->find("-> 0"), std::string::npos) << *freed;
}

TEST(StreamCapture, SubAllocatedBlockFreedInACaptureIsNotReusedBeforeTheGraphRuns) {
  for (const char* mode : {"launch", "", "destroy_first"}) {
    std::string report = temp_dir() + "/r.json";
    CaptureRun c = run_capture(true, mode, {{"SPILLWAY_SUBALLOCATOR", "on"}, {"SPILLWAY_REPORT", report}});
    ASSERT_EQ(c.result.status, 0) << describe(c.result);
    ASSERT_FALSE(c.a.empty());
    EXPECT_NE(c.c, c.a) << mode << ": A was reused before the graph that frees it ran";
    EXPECT_EQ(first_call(c, "cuMemFree_v2 dptr=" + c.a + " "), c.log.end()) << "A is carved, never the driver's";
    nlohmann::json j = read_report(report);
    // Launched: A is released by the graph; never launched: A stays live, as with the driver.
    EXPECT_EQ(j["bytes"]["live_blocks"], std::string(mode) == "launch" ? 0 : 1 << 20) << mode << ": " << j.dump();
  }
}

TEST(StreamCapture, BlockFreedInAGraphNeverLaunchedIsNeverFreed) {
  // As with the driver's own free nodes: a graph that never runs frees nothing.
  for (const char* mode : {"", "destroy_first"}) {
    std::string report = temp_dir() + "/r.json";
    CaptureRun c = run_capture(true, mode, {{"SPILLWAY_REPORT", report}});
    ASSERT_EQ(c.result.status, 0) << describe(c.result);
    EXPECT_EQ(first_call(c, "cuMemFree_v2 dptr=" + c.a + " "), c.log.end()) << mode;
    nlohmann::json j = read_report(report);
    EXPECT_EQ(j["bytes"]["managed_now"], 1 << 20) << mode << ": " << j.dump();
  }
}

TEST(StreamCapture, LogShowsTheProgramsCapturedCallsWithoutShim) {
  // Without the shim the program's own stream-ordered calls reach the driver while capturing:
  // the check above would see them.
  CaptureRun c = run_capture(false);
  ASSERT_EQ(c.result.status, 0) << describe(c.result);
  std::set<std::string> on_capturing;
  for (const std::string& line : c.log)
    if (line.find("stream=" + c.stream + " capturing=1") != std::string::npos) on_capturing.insert(call_name(line));
  EXPECT_TRUE(on_capturing.count("cuMemFreeAsync")) << "log parsing found no captured call";
  EXPECT_TRUE(on_capturing.count("cuMemAllocAsync"));
}

// A capture under PyTorch's uncached mode (spillway run's per-tensor default) is said once,
// with the setting to change; without that variable a capture says nothing.
TEST(StreamCapture, CaptureWithPyTorchsCacheOffIsWarnedAboutOnce) {
  CaptureRun warned = run_capture(true, "launch", {{"PYTORCH_NO_CUDA_MEMORY_CACHING", "1"}});
  ASSERT_EQ(warned.result.status, 0) << describe(warned.result);
  ASSERT_EQ(warned.result.err_lines().size(), 1u) << warned.result.err;
  EXPECT_NE(warned.result.err.find("while PYTORCH_NO_CUDA_MEMORY_CACHING is set"), std::string::npos) << warned.result.err;
  EXPECT_NE(warned.result.err.find("--framework-allocator keep"), std::string::npos) << warned.result.err;
  CaptureRun quiet = run_capture(true, "launch");
  ASSERT_EQ(quiet.result.status, 0) << describe(quiet.result);
  EXPECT_EQ(quiet.result.err, "");
}

TEST(StreamOrderedFree, BlockIsNotReleasedBeforeTheStreamIsSynchronized) {
  std::string log = temp_dir() + "/fake.log";
  RunResult r = program("async_free", {},
                        fake_env(true, {{"FAKECUDA_ASYNC", "1"}, {"FAKECUDA_LOG", log}, {"SPILLWAY_SUBALLOCATOR", "off"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  std::string a = field(r.out, "A");
  ASSERT_FALSE(a.empty());
  auto lines = split_lines(read_file(log));
  auto sync = std::find_if(lines.begin(), lines.end(), [](auto& l) { return call_name(l) == "cuStreamSynchronize"; });
  ASSERT_NE(sync, lines.end());
  auto freed = std::find_if(lines.begin(), lines.end(), [&](auto& l) { return l.rfind("cuMemFree_v2 dptr=" + a + " ", 0) == 0; });
  ASSERT_NE(freed, lines.end()) << "released after the stream was synchronized";
  EXPECT_GT(freed, sync) << "released while the kernel writing it could still run: " << *freed;
  auto launch = std::find_if(lines.begin(), lines.end(), [](auto& l) { return call_name(l) == "cuLaunchKernel"; });
  ASSERT_NE(launch, lines.end());
  EXPECT_NE(launch->find("p0=" + a), std::string::npos) << "the kernel wrote the managed block: " << *launch;
}

// A stream-ordered free asks the driver once whether its stream is being captured: the hook's
// answer (which routes a captured free to its graph) is handed to the Engine.
TEST(StreamOrderedFree, AsksTheCaptureStateOnce) {
  std::string log = temp_dir() + "/fake.log";
  RunResult r = program("async_free", {},
                        fake_env(true, {{"FAKECUDA_ASYNC", "1"}, {"FAKECUDA_LOG", log}, {"SPILLWAY_SUBALLOCATOR", "off"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  auto lines = split_lines(read_file(log));
  auto launch = std::find_if(lines.begin(), lines.end(), [](auto& l) { return call_name(l) == "cuLaunchKernel"; });
  ASSERT_NE(launch, lines.end());
  // The free's fence: the first event made with CU_EVENT_DISABLE_TIMING after the launch.
  auto fence = std::find_if(launch, lines.end(), [](auto& l) {
    return call_name(l) == "cuEventCreate" && l.find("flags=2 ") != std::string::npos;
  });
  ASSERT_NE(fence, lines.end()) << "the deferred free records its event";
  auto queries = std::count_if(launch, fence, [](auto& l) {
    return call_name(l) == "cuStreamGetCaptureInfo_v3" || call_name(l) == "cuStreamIsCapturing";
  });
  EXPECT_EQ(queries, 1) << "capture queries between the launch and the free's event";
}

// ---- exclusion ----------------------------------------------------------------------------------

TEST(Exclusion, ExcludedLibrarysAllocationsStayDeviceMemory) {
  std::string report = temp_dir() + "/r.json";
  RunResult r = program("excluded", {kExcludedLib},
                        fake_env(true, {{"SPILLWAY_EXCLUDE", "libspillway_excluded_test"}, {"SPILLWAY_REPORT", report}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "library"), "0") << describe(r);
  EXPECT_EQ(field(r.out, "program"), "1") << describe(r);
  EXPECT_EQ(field(r.out, "free_library"), "0") << "a foreign pointer's free passes through";
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["allocations"]["excluded"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["passed_through"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["redirected"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["frees"], 1) << j.dump();
}

TEST(Exclusion, LibraryNotExcludedIsManaged) {
  RunResult r = program("excluded", {kExcludedLib}, fake_env(true));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "library"), "1");
  EXPECT_EQ(field(r.out, "program"), "1");
}

// ---- many threads ---------------------------------------------------------------------------------

TEST(Threads, SixteenThreadsMillionAllocationsLeaveTheTableConsistent) {
  std::string report = temp_dir() + "/r.json";
  // Sanitized shims are 5-20x slower (TSan: about 110 s for the million on 2 cores): a
  // quarter of the allocations there, the same 16 threads.
  const bool sanitized = std::getenv("SPILLWAY_TEST_PRELOAD_FIRST") != nullptr;
  const long n = sanitized ? 250000 : 1000000;
  RunResult r = program("threads", {"16", std::to_string(n)}, fake_env(true, {{"SPILLWAY_REPORT", report}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "failures"), "0");
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["allocations"]["redirected"], n) << j.dump();
  EXPECT_EQ(j["allocations"]["frees"], n) << j.dump();
  EXPECT_EQ(j["allocations"]["passed_through"], 0) << j.dump();
  EXPECT_EQ(j["bytes"]["live_blocks"], 0) << j.dump();
  // What stays held is the sub-allocator's ranges, nothing else.
  EXPECT_EQ(j["bytes"]["managed_now"], j["suballocator"]["range_bytes"]) << j.dump();
}

// An allocation asks the driver for its context only: the context's device is asked once per
// thread (until a context ends), not once per allocation.
TEST(Threads, AllocationsAskTheContextsDeviceOncePerThread) {
  std::string log = temp_dir() + "/fake.log";
  RunResult r = program("threads", {"2", "400"}, fake_env(true, {{"FAKECUDA_LOG", log}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "failures"), "0");
  auto lines = split_lines(read_file(log));
  const auto allocs = std::count_if(lines.begin(), lines.end(), [](auto& l) { return call_name(l) == "cuCtxGetCurrent"; });
  const auto device_queries = std::count_if(lines.begin(), lines.end(), [](auto& l) { return call_name(l) == "cuCtxGetDevice"; });
  EXPECT_GE(allocs, 400) << "every allocation reads its context";
  EXPECT_LT(device_queries, 40) << "device queries for 400 allocations on 2 threads";
}

// ---- settings, report, log -------------------------------------------------------------------------

TEST(Settings, BadBudgetIsOneLineAndTheProgramRunsWithDeviceMemory) {
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_BUDGET", "lots"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0");
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("SPILLWAY_BUDGET"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'lots'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("24GiB"), std::string::npos) << "names what is accepted: " << r.err;
}

TEST(Settings, BadPolicyIsOneLineAndTheProgramRunsWithDeviceMemory) {
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_POLICY", "magic"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0");
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("SPILLWAY_POLICY"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'magic'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("demand"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("advise"), std::string::npos) << r.err;
}

// Tunables in SPILLWAY_POLICY (prefetch/policy_registry.h): a valid spec runs that policy; an
// unknown key or a value out of range is one line naming the key and what it accepts, and the
// program runs with device memory.
TEST(Settings, PolicyTunablesAreCheckedOnceAndOneLineNamesTheKey) {
  RunResult ok = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_POLICY", "learned:context=4,slack_ns=0"}}));
  EXPECT_EQ(ok.status, 0) << describe(ok);
  EXPECT_EQ(field(ok.out, "managed"), "1");
  EXPECT_EQ(ok.err, "");
  RunResult bad = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_POLICY", "learned:context=0"}}));
  EXPECT_EQ(bad.status, 0) << describe(bad);
  EXPECT_EQ(field(bad.out, "managed"), "0");
  ASSERT_EQ(bad.err_lines().size(), 1u) << bad.err;
  EXPECT_NE(bad.err.find("SPILLWAY_POLICY"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("learned:context: expected a whole number from 1 to 1024"), std::string::npos) << bad.err;
  RunResult key = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_POLICY", "sequential:detph=3"}}));
  EXPECT_EQ(field(key.out, "managed"), "0");
  ASSERT_EQ(key.err_lines().size(), 1u) << key.err;
  EXPECT_NE(key.err.find("unknown key 'detph': policy sequential has depth, max_log"), std::string::npos) << key.err;
}

TEST(Settings, DisablePassesEverythingThrough) {
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_DISABLE", "1"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0");
  EXPECT_EQ(r.err, "");
}

TEST(Settings, NoConcurrentManagedAccessPassesThroughWithOneWarning) {
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"FAKECUDA_CONCURRENT_MANAGED_ACCESS", "0"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "0");
  EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
}

TEST(Report, JsonHasTheCounts) {
  std::string report = temp_dir() + "/r.json";
  RunResult r = program("alloc_paths", {"cuMemAllocAsync"}, fake_env(true, {{"SPILLWAY_REPORT", report}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["policy"], "learned") << "the default policy: " << j.dump();
  EXPECT_EQ(j["allocations"]["redirected"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["frees"], 1) << j.dump();
  EXPECT_EQ(j["allocations"]["frees_deferred"], 1) << j.dump();
  EXPECT_GE(j["bytes"]["peak_managed"], 1 << 20) << j.dump();
  EXPECT_EQ(j["bytes"]["live_blocks"], 0) << j.dump();
  EXPECT_EQ(j["bytes"]["managed_now"], j["suballocator"]["range_bytes"]) << j.dump();
}

TEST(Report, UnwritableReportIsOneErrorLineAndTheProgramSucceeds) {
  std::string report = temp_dir() + "/missing/r.json";
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_REPORT", report}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find(report), std::string::npos) << r.err;
}

// The names of the files in `dir`, sorted.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

TEST(Report, PatternGivesEachRankAndProcessAFileOfItsOwn) {
  const std::string dir = temp_dir();
  const std::string pattern = dir + "/r-%r-%p.json";
  // torchrun sets RANK (global) and LOCAL_RANK (on the node): %r is RANK, else LOCAL_RANK, else 0.
  RunResult a = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_REPORT", pattern}, {"RANK", "3"}, {"LOCAL_RANK", "1"}}));
  RunResult b = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_REPORT", pattern}, {"RANK", "x"}, {"LOCAL_RANK", "1"}}));
  RunResult c = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_REPORT", dir + "/%%r-%r.json"}}));
  for (const RunResult* r : {&a, &b, &c}) {
    ASSERT_EQ(r->status, 0) << describe(*r);
    EXPECT_EQ(r->err, "");
  }
  std::vector<std::string> names = files_in(dir);
  ASSERT_EQ(names.size(), 3u) << ::testing::PrintToString(names);
  EXPECT_EQ(names[0], "%r-0.json");
  std::set<std::string> pids;
  for (std::size_t i = 1; i < 3; ++i) {
    const std::string rank = i == 1 ? "1" : "3";
    const std::string prefix = "r-" + rank + "-";
    ASSERT_TRUE(names[i].starts_with(prefix) && names[i].ends_with(".json")) << names[i];
    const std::string pid = names[i].substr(prefix.size(), names[i].size() - prefix.size() - 5);
    EXPECT_TRUE(all_digits(pid)) << names[i];
    pids.insert(pid);
    EXPECT_EQ(read_report(dir + "/" + names[i])["allocations"]["redirected"], 1) << names[i];
  }
  EXPECT_EQ(pids.size(), 2u) << "two processes, two process ids";
}

TEST(Settings, UnknownPercentSequenceInAnOutputPathIsOneLine) {
  for (const char* variable : {"SPILLWAY_REPORT", "SPILLWAY_TRACE"}) {
    const std::string dir = temp_dir();
    RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{variable, dir + "/out-%d.json"}}));
    EXPECT_EQ(r.status, 0) << describe(r);
    EXPECT_EQ(field(r.out, "managed"), "0");
    ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
    EXPECT_NE(r.err.find(variable), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("%p"), std::string::npos) << "names what is accepted: " << r.err;
    EXPECT_TRUE(files_in(dir).empty());
  }
}

TEST(Log, InfoPrintsTheTableAtExit) {
  RunResult r = program("alloc_paths", {"cuMemAlloc"}, fake_env(true, {{"SPILLWAY_LOG", "info"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  auto redirected = lines_with(r.err, "allocations redirected");
  ASSERT_EQ(redirected.size(), 1u) << r.err;
  EXPECT_NE(redirected[0].find(" 1"), std::string::npos) << redirected[0];
  EXPECT_EQ(lines_with(r.err, "peak managed").size(), 1u) << r.err;
  EXPECT_EQ(lines_with(r.err, "peak over budget").size(), 1u) << r.err;
}

// ---- spillway run ------------------------------------------------------------------------------------

TEST(SpillwayRun, TrueRunsSilentlyAndExitsZero) {
  RunResult r = run({kCli, "run", "--", "/bin/true"}, {});
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST(SpillwayRun, ReturnsTheCommandsExitStatus) {
  RunResult r = run({kCli, "run", "--", "/bin/sh", "-c", "exit 3"}, {});
  EXPECT_EQ(r.status, 3) << describe(r);
  EXPECT_EQ(r.err, "");
  RunResult path = run({kCli, "run", "--", "sh", "-c", "exit 5"}, {});
  EXPECT_EQ(path.status, 5) << "the command is found on PATH: " << describe(path);
}

TEST(SpillwayRun, BadBudgetExitsTwoWithOneLine) {
  RunResult r = run({kCli, "run", "--budget", "nonsense", "--", "/bin/true"}, {});
  EXPECT_EQ(r.status, 2) << describe(r);
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("SPILLWAY_BUDGET"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nonsense"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// The simulator's model parameters and capacities outside the range where the model means
// something (NaN, infinities, 1e-15 GB/s, a slowdown of 1e15, less than one chunk) are
// one-line usage errors (exit 2) naming the option and the accepted range — not numbers
// from overflowed arithmetic.
TEST(SpillwayReplay, OutOfRangeModelParametersAreOneLineErrors) {
  std::string path = temp_dir() + "/t.jsonl";
  std::ofstream(path) << "{\"format\":\"spillway-trace\",\"version\":1,\"source\":\"test\"}\n"
                         "{\"ev\":\"alloc\",\"id\":1,\"bytes\":8388608}\n"
                         "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1000,\"reads\":[1],\"writes\":[]}\n";
  RunResult ok = run({kCli, "replay", path, "--capacity", "4MiB", "--fault-slowdown", "1.5", "--h2d-bandwidth", "12"}, {});
  ASSERT_EQ(ok.status, 0) << describe(ok);
  const std::vector<std::vector<std::string>> bad{
      {"--fault-batch-us", "nan"},  {"--fault-batch-us", "1e300"}, {"--fault-slowdown", "1e15"},
      {"--h2d-bandwidth", "1e-15"}, {"--d2h-bandwidth", "inf"},    {"--density-threshold", "nan"},
      {"--remote-efficiency", "0"}, {"--capacity", "1KiB"},        {"--capacity", "0.0001"}};
  for (const auto& b : bad) {
    std::vector<std::string> argv{kCli, "replay", path};
    if (b[0] != "--capacity") argv.insert(argv.end(), {"--capacity", "4MiB"});
    argv.insert(argv.end(), b.begin(), b.end());
    RunResult r = run(argv, {});
    EXPECT_EQ(r.status, 2) << b[0] << " " << b[1] << "\n" << describe(r);
    ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
    EXPECT_NE(r.err.find(b[0] == "--capacity" ? "capacity" : b[0]), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST(SpillwayRun, PrependsToAnExistingLdPreload) {
  RunResult r = run({kCli, "run", "--", "/bin/sh", "-c", "echo \"$LD_PRELOAD\""}, {{"LD_PRELOAD", kProbeLib}});
  EXPECT_EQ(r.status, 0) << describe(r);
  ASSERT_EQ(r.out_lines().size(), 1u) << r.out;
  std::string line = r.out_lines()[0];
  auto colon = line.find(':');
  ASSERT_NE(colon, std::string::npos) << line;
  EXPECT_EQ(line.substr(colon + 1), kProbeLib);
  EXPECT_EQ(line.substr(0, colon).substr(line.find_last_of('/', colon) + 1), "libspillway.so") << line;
  EXPECT_EQ(line[0], '/') << "an absolute path";
}

// The frameworks' per-tensor modes, unless the user set the variable or
// asked to keep the frameworks' caches.
TEST(SpillwayRun, PutsFrameworksInTheirPerTensorModesUnlessToldToKeepTheirCaches) {
  const std::vector<std::string> show{"/bin/sh", "-c",
                                      "echo \"pt=${PYTORCH_NO_CUDA_MEMORY_CACHING-unset} xla=${XLA_PYTHON_CLIENT_ALLOCATOR-unset} "
                                      "pre=${XLA_PYTHON_CLIENT_PREALLOCATE-unset}\""};
  auto with = [&](std::vector<std::string> options, const Env& env) {
    std::vector<std::string> argv{kCli, "run"};
    argv.insert(argv.end(), options.begin(), options.end());
    argv.push_back("--");
    argv.insert(argv.end(), show.begin(), show.end());
    RunResult r = run(argv, env);
    EXPECT_EQ(r.status, 0) << describe(r);
    return r.out;
  };
  EXPECT_EQ(with({}, {}), "pt=1 xla=platform pre=false\n");
  EXPECT_EQ(with({}, {{"XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"}, {"PYTORCH_NO_CUDA_MEMORY_CACHING", "0"}}),
            "pt=0 xla=bfc pre=false\n")
      << "the user's own values stay";
  EXPECT_EQ(with({"--framework-allocator", "keep"}, {}), "pt=unset xla=unset pre=unset\n");
  EXPECT_EQ(with({}, {{"SPILLWAY_FRAMEWORK_ALLOCATOR", "keep"}}), "pt=unset xla=unset pre=unset\n");
  EXPECT_EQ(with({"--framework-allocator", "per-tensor"}, {{"SPILLWAY_FRAMEWORK_ALLOCATOR", "keep"}}),
            "pt=1 xla=platform pre=false\n")
      << "the option wins over the variable";
  RunResult bad = run({kCli, "run", "--framework-allocator", "lazy", "--", "/bin/true"}, {});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("SPILLWAY_FRAMEWORK_ALLOCATOR"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("per-tensor or keep"), std::string::npos) << bad.err;
}

TEST(SpillwayRun, RunsAProgramWithTheShimAndSettings) {
  std::string report = temp_dir() + "/r.json";
  RunResult r = run({kCli, "run", "--max-managed", "64MiB", "--report", report, "--", kPrograms + "/mem_limits", "sizes",
                     "48M", "32M"},
                    {{"LD_LIBRARY_PATH", kFakeDir}});
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "alloc 48M -> 0\nalloc 32M -> 2\n");
  nlohmann::json j = read_report(report);
  EXPECT_EQ(j["allocations"]["refused"], 1) << j.dump();
}

TEST(SpillwayRun, ARunsReportsReplaceAnEarlierRunsUnderAPattern) {
  const std::string dir = temp_dir();
  for (const char* name : {"r7.json", "r12.json", "rx.json", "r7.json.keep", "r7xjson", "p1.json"}) {
    std::ofstream(dir + "/" + name) << "old";
  }
  RunResult r = run({kCli, "run", "--report", dir + "/r%r.json", "--", kPrograms + "/alloc_paths", "cuMemAlloc"},
                    {{"LD_LIBRARY_PATH", kFakeDir}, {"RANK", "7"}});
  ASSERT_EQ(r.status, 0) << describe(r);
  // The earlier run's r<rank>.json files are gone; other names stay ('.' is no wildcard).
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"p1.json", "r7.json", "r7.json.keep", "r7xjson", "rx.json"}));
  EXPECT_EQ(read_report(dir + "/r7.json")["allocations"]["redirected"], 1);
  EXPECT_EQ(read_file(dir + "/rx.json"), "old");
  // Names with %p are one per process: an earlier run's are kept.
  RunResult p = run({kCli, "run", "--report", dir + "/p%p.json", "--", kPrograms + "/alloc_paths", "cuMemAlloc"},
                    {{"LD_LIBRARY_PATH", kFakeDir}});
  ASSERT_EQ(p.status, 0) << describe(p);
  EXPECT_EQ(read_file(dir + "/p1.json"), "old");
  EXPECT_EQ(files_in(dir).size(), 6u) << ::testing::PrintToString(files_in(dir));
}

// ---- spillway info ------------------------------------------------------------------------------------

TEST(SpillwayInfo, JsonGivesTheDeviceTheBudgetTheCapAndWhereEachSettingCameFrom) {
  RunResult r = run({kCli, "info", "--json", "--budget", "64MiB"},
                    {{"LD_LIBRARY_PATH", kFakeDir}, {"FAKECUDA_TOTAL_MEMORY", std::to_string(256 << 20)},
                     {"SPILLWAY_MAX_MANAGED", "1GiB"}, {"SPILLWAY_LOG", "info"}, {"SPILLWAY_BUDGET", "1GiB"}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["driver"]["found"], true) << j.dump();
  EXPECT_EQ(j["driver"]["cuda"], "13.0");
  EXPECT_EQ(j["shim"], std::filesystem::weakly_canonical(kShim).string());
  ASSERT_EQ(j["devices"].size(), 1u) << j.dump();
  const nlohmann::json& d = j["devices"][0];
  EXPECT_EQ(d["name"], "Fakecuda GPU");
  EXPECT_EQ(d["total_bytes"], 256u << 20);
  EXPECT_EQ(d["free_bytes"], 256u << 20);
  EXPECT_EQ(d["concurrent_managed_access"], true);
  EXPECT_EQ(d["discard_batch"], true) << "the fake has cuMemDiscardBatchAsync";
  EXPECT_EQ(d["prefetch_batch"], true) << "and cuMemPrefetchBatchAsync";
  EXPECT_EQ(d["budget_bytes"], 64u << 20) << "the option, over the variable";
  EXPECT_EQ(j["host"]["managed_cap_bytes"], 1u << 30);
  std::map<std::string, std::pair<std::string, std::string>> settings;
  for (const auto& s : j["settings"]) settings[s["variable"]] = {s["value"], s["source"]};
  EXPECT_EQ(settings["SPILLWAY_BUDGET"], std::make_pair(std::string("64MiB"), std::string("option")));
  EXPECT_EQ(settings["SPILLWAY_MAX_MANAGED"], std::make_pair(std::string("1GiB"), std::string("variable")));
  EXPECT_EQ(settings["SPILLWAY_LOG"], std::make_pair(std::string("info"), std::string("variable")));
  EXPECT_EQ(settings["SPILLWAY_POLICY"], std::make_pair(std::string("learned"), std::string("default")));
  EXPECT_GE(settings.size(), 14u);
  EXPECT_TRUE(j["extents"].get<std::string>().starts_with("per-tensor mode")) << j["extents"];
}

TEST(SpillwayInfo, SaysWhereExtentsComeFromUnderTheFrameworksAllocator) {
  RunResult r = run({kCli, "info", "--json", "--framework-allocator", "keep", "--fault-feedback", "off"},
                    {{"LD_LIBRARY_PATH", kFakeDir}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(nlohmann::json::parse(r.out)["extents"],
            "framework allocator kept: PyTorch's allocator trace where torch 2.2 to 2.15 is loaded (checked at run time), "
            "else the argument scan alone");
}

TEST(SpillwayInfo, TableFitsOneScreenAndSaysWhenTheDeviceCannotBeManaged) {
  RunResult r = run({kCli, "info"}, {{"LD_LIBRARY_PATH", kFakeDir}, {"FAKECUDA_CONCURRENT_MANAGED_ACCESS", "0"}});
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_LE(split_lines(r.out).size(), 40u) << r.out;
  EXPECT_EQ(lines_with(r.out, "device 0").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "Fakecuda GPU").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "concurrent managed access no").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "allocations pass through").size(), 1u) << r.out;
  EXPECT_EQ(lines_with(r.out, "SPILLWAY_POLICY").size(), 1u) << r.out;
}

// The simulator's link profiles: one line in the table; with --links each profile's figures
// with their sources; in the JSON whole.
TEST(SpillwayInfo, LinksGiveEachFigureWithItsSource) {
  RunResult brief = run({kCli, "info"}, {{"LD_LIBRARY_PATH", kFakeDir}});
  ASSERT_EQ(brief.status, 0) << describe(brief);
  EXPECT_EQ(lines_with(brief.out, "link profiles pcie3, pcie4, pcie5, c2c, h200").size(), 1u) << brief.out;
  EXPECT_TRUE(lines_with(brief.out, "the lower bound's rate").empty()) << brief.out;
  RunResult full = run({kCli, "info", "--links"}, {{"LD_LIBRARY_PATH", kFakeDir}});
  ASSERT_EQ(full.status, 0) << describe(full);
  EXPECT_EQ(lines_with(full.out, "the lower bound's rate, the fastest any call moves").size(), 5u) << full.out;
  EXPECT_EQ(lines_with(full.out, "move calls: assumed: no per-call cost").size(), 4u) << full.out;
  ASSERT_EQ(lines_with(full.out, "link h200: H2D 14.30 GB/s, D2H 7.67 GB/s in 2 MiB calls (measured between host and GPU on an H200").size(),
            1u) << full.out;
  EXPECT_EQ(lines_with(full.out, "    H2D 64 KiB 1.33, 2 MiB 14.30").size(), 1u) << full.out;
  RunResult js = run({kCli, "info", "--json"}, {{"LD_LIBRARY_PATH", kFakeDir}});
  ASSERT_EQ(js.status, 0) << describe(js);
  const nlohmann::json links = nlohmann::json::parse(js.out)["links"];
  ASSERT_EQ(links.size(), 5u) << links.dump();
  const nlohmann::json& h200 = links[4];
  EXPECT_EQ(h200["name"], "h200");
  EXPECT_EQ(h200["call_shape"]["h2d"].size(), 6u);
  EXPECT_EQ(h200["call_shape"]["h2d"][1]["bytes"], 2u << 20);
  EXPECT_NEAR(h200["call_shape"]["h2d_batch_share"].get<double>(), 1582.0 / 16 / 111, 1e-9) << "measured batches";
  EXPECT_EQ(links[2]["call_shape"]["h2d_batch_share"].get<double>(), 0.0) << "pcie5: none measured";
  for (const char* what : {"bandwidth", "calls", "fault_batch", "fault_slowdown"}) {
    EXPECT_EQ(h200["sources"][what].get<std::string>().rfind("measured ", 0), 0u) << what << ": " << h200.dump();
    EXPECT_FALSE(links[2]["sources"][what].get<std::string>().empty()) << what;
  }
}

TEST(SpillwayInfo, BadSettingIsOneLineAndStatusTwo) {
  RunResult opt = run({kCli, "info", "--policy", "magic"}, {{"LD_LIBRARY_PATH", kFakeDir}});
  EXPECT_EQ(opt.status, 2) << describe(opt);
  ASSERT_EQ(opt.err_lines().size(), 1u) << opt.err;
  EXPECT_NE(opt.err.find("SPILLWAY_POLICY"), std::string::npos) << opt.err;
  RunResult var = run({kCli, "info"}, {{"LD_LIBRARY_PATH", kFakeDir}, {"SPILLWAY_BUDGET", "lots"}});
  EXPECT_EQ(var.status, 2) << describe(var);
  ASSERT_EQ(var.err_lines().size(), 1u) << var.err;
  EXPECT_NE(var.err.find("SPILLWAY_BUDGET"), std::string::npos) << var.err;
  EXPECT_NE(var.err.find("environment"), std::string::npos) << var.err;
}

TEST(SpillwayInfo, NoDriverIsReportedNotFailed) {
  const std::string empty = temp_dir();
  RunResult r = run({kCli, "info", "--json"}, {{"LD_LIBRARY_PATH", empty}});
  ASSERT_EQ(r.status, 0) << describe(r);
  nlohmann::json j = nlohmann::json::parse(r.out);
  if (j["driver"]["found"] == true) GTEST_SKIP() << "this machine has a driver of its own";
  EXPECT_NE(j["driver"]["error"].get<std::string>().find("libcuda.so.1"), std::string::npos) << j.dump();
  EXPECT_TRUE(j["devices"].empty());
  RunResult text = run({kCli, "info"}, {{"LD_LIBRARY_PATH", empty}});
  EXPECT_EQ(text.status, 0);
  EXPECT_EQ(lines_with(text.out, "driver     none").size(), 1u) << text.out;
}

// ---- programs that never touch CUDA --------------------------------------------------------------------

TEST(NonCuda, EchoBehavesIdentically) {
  RunResult plain = run({"/bin/echo", "hello", "world"}, {});
  RunResult with = run({"/bin/echo", "hello", "world"}, {{"LD_PRELOAD", kShim}});
  EXPECT_EQ(with.status, 0);
  EXPECT_EQ(with.out, plain.out);
  EXPECT_EQ(with.err, "");
}

TEST(NonCuda, DlsymDefaultAndNextBehaveIdentically) {
  RunResult plain = program("no_cuda", {"x"}, {});
  ASSERT_EQ(plain.status, 0) << describe(plain);
  RunResult with = program("no_cuda", {"x"}, {{"LD_PRELOAD", kShim}});
  EXPECT_EQ(with.status, 0) << describe(with);
  EXPECT_EQ(with.out, plain.out);
  EXPECT_EQ(with.err, "");
}

// The same probes in a process that has loaded the driver and the runtime (globally): found,
// with the shim as without it.
TEST(NonCuda, ProbesFindCudaWhereItIsLoaded) {
  const std::string cuda = kFakeDir + "/libcuda.so.1 " + kFakeDir + "/libcudart.so.13";
  RunResult plain = program("no_cuda", {"x"}, {{"LD_PRELOAD", cuda}});
  ASSERT_EQ(plain.status, 0) << describe(plain);
  EXPECT_NE(plain.out.find("probe cudaMalloc default=1 self=1"), std::string::npos) << plain.out;
  RunResult with = program("no_cuda", {"x"}, {{"LD_PRELOAD", kShim + " " + cuda}});
  EXPECT_EQ(with.status, 0) << describe(with);
  EXPECT_EQ(with.out, plain.out);
}

}  // namespace
}  // namespace spillway::test
