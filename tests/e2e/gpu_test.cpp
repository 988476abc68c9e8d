// GPU tests (ctest label `gpu`): the self-checking programs of tests/programs under the
// preloaded shim against the REAL driver; no LD_LIBRARY_PATH to the fake. Every test skips
// where there is no GPU (no /dev/nvidiactl, or cuInit / cuDeviceGetCount fail in a probe).
// Each run caps managed memory (SPILLWAY_MAX_MANAGED=1GiB) so no test asks a shared GPU for
// more than a little memory. Tests that need FAKECUDA_* features live in e2e_test only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "harness.h"

namespace spillway::test {
namespace {

// The build tree may be copied to the GPU machine under another path: paths inside the build
// directory are taken relative to this program (<build>/bin/gpu_test) when it has moved.
std::string in_build(const std::string& path) {
  static const std::string built = SPILLWAY_BUILD_DIR;
  static const std::string root = [] {
    char exe[4096] = {};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string self = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
    if (self.empty() || self.rfind(built + "/", 0) == 0) return built;
    std::string bin = self.substr(0, self.find_last_of('/'));
    return bin.substr(0, bin.find_last_of('/'));
  }();
  if (path.rfind(built + "/", 0) != 0) return path;
  return root + path.substr(built.size());
}

const std::string kShim = in_build(SPILLWAY_SHIM);
const std::string kPrograms = in_build(PROGRAM_DIR);
const std::string kExcludedLib = in_build(EXCLUDED_LIB);
// Where the real shared runtime (libcudart.so.13) is: SPILLWAY_GPU_TEST_CUDART_DIR, the
// toolkit this was built with, or the usual install paths; "" if none has it.
const std::string& cudart_dir() {
  static const std::string dir = []() -> std::string {
    std::vector<std::string> candidates;
    if (const char* d = std::getenv("SPILLWAY_GPU_TEST_CUDART_DIR")) candidates.push_back(d);
    candidates.insert(candidates.end(), {CUDA_TOOLKIT_LIBRARY_DIR, "/usr/local/cuda/lib64",
                                         "/usr/local/cuda/targets/x86_64-linux/lib"});
    for (const std::string& c : candidates)
      if (!c.empty() && access((c + "/libcudart.so.13").c_str(), F_OK) == 0) return c;
    return "";
  }();
  return dir;
}

// Why there is no usable GPU, or "" if there is one.
const std::string& no_gpu_reason() {
  static const std::string reason = []() -> std::string {
    if (access("/dev/nvidiactl", F_OK) != 0) return "no /dev/nvidiactl";
    RunResult r = run({kPrograms + "/cuda_probe"}, {}, 60);
    if (r.status != 0) return "the CUDA driver does not initialise or has no device (probe exit " + std::to_string(r.status) + ")";
    return "";
  }();
  return reason;
}

#define REQUIRE_GPU()                                      \
  do {                                                     \
    if (!no_gpu_reason().empty()) GTEST_SKIP() << no_gpu_reason(); \
  } while (0)

Env gpu_env(bool shim, const Env& extra = {}) {
  Env env{{"SPILLWAY_MAX_MANAGED", "1GiB"}, {"SPILLWAY_BUDGET", "512MiB"}};
  if (shim) env["LD_PRELOAD"] = kShim;
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

RunResult program(const std::string& name, std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), kPrograms + "/" + name);
  return run(args, env, 240);
}

class GpuDriverAllocationPath : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuDriverAllocationPath, EndsManagedWithShim) {
  REQUIRE_GPU();
  RunResult r = program("alloc_paths", {GetParam(), "--expect-managed=1"}, gpu_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "managed"), "1") << describe(r);
}

TEST_P(GpuDriverAllocationPath, StaysDeviceMemoryWithoutShim) {
  REQUIRE_GPU();
  RunResult r = program("alloc_paths", {GetParam(), "--expect-managed=0"}, gpu_env(false));
  EXPECT_EQ(r.status, 0) << describe(r);
}

INSTANTIATE_TEST_SUITE_P(Paths, GpuDriverAllocationPath,
                         ::testing::Values("cuMemAlloc", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
                                           "default_pool", "dlsym", "getproc3020", "getproc12000", "getproc_self",
                                           "getproc_per_thread"));

TEST(Gpu, CreatedPoolIsPassedThrough) {
  REQUIRE_GPU();
  RunResult r = program("alloc_paths", {"created_pool", "--expect-managed=0"}, gpu_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
}

class GpuRuntimeAllocationPath : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuRuntimeAllocationPath, EndsManagedWithShim) {
  REQUIRE_GPU();
  if (cudart_dir().empty()) GTEST_SKIP() << "no shared libcudart.so.13 found";
  RunResult r = program("runtime_alloc", {GetParam(), "--expect-managed=1"}, gpu_env(true, {{"LD_LIBRARY_PATH", cudart_dir()}}));
  EXPECT_EQ(r.status, 0) << describe(r);
}

INSTANTIATE_TEST_SUITE_P(Paths, GpuRuntimeAllocationPath,
                         ::testing::Values("cudaMalloc", "cudaMallocPitch", "cudaMallocAsync", "entry_point"));

TEST(Gpu, DoubleFreeReturnsAnError) {
  REQUIRE_GPU();
  RunResult with = program("free_cases", {"double"}, gpu_env(true));
  EXPECT_EQ(with.status, 0) << describe(with);
  RunResult without = program("free_cases", {"double"}, gpu_env(false));
  EXPECT_EQ(field(with.out, "second"), field(without.out, "second")) << "the driver's own error";
}

TEST(Gpu, ForeignFreesPassThrough) {
  REQUIRE_GPU();
  for (const char* c : {"host", "unknown"}) {
    RunResult with = program("free_cases", {c}, gpu_env(true));
    RunResult without = program("free_cases", {c}, gpu_env(false));
    EXPECT_EQ(with.status, 0) << describe(with);
    EXPECT_EQ(field(with.out, "first"), field(without.out, "first")) << c;
  }
}

TEST(Gpu, HostCapIsOutOfMemory) {
  REQUIRE_GPU();
  RunResult r = program("mem_limits", {"sizes", "48M", "32M", "8M"}, gpu_env(true, {{"SPILLWAY_MAX_MANAGED", "64MiB"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.out, "alloc 48M -> 0\nalloc 32M -> 2\nalloc 8M -> 0\n") << describe(r);
}

TEST(Gpu, MemGetInfoSurvivesNullArguments) {
  REQUIRE_GPU();
  // The real driver accepts NULL outputs (it fills the others and succeeds); whatever it
  // answers, the shim must answer the same — physical and virtual alike — and not crash.
  RunResult plain = program("mem_limits", {"meminfo"}, gpu_env(false));
  ASSERT_EQ(plain.status, 0) << describe(plain);
  for (const char* mode : {"physical", "virtual"}) {
    RunResult r = program("mem_limits", {"meminfo"}, gpu_env(true, {{"SPILLWAY_REPORT_MEMORY", mode}}));
    EXPECT_EQ(r.status, 0) << describe(r);
    for (const char* f : {"null_both", "null_free", "null_total"}) {
      EXPECT_EQ(field(r.out, f), field(plain.out, f)) << mode << " " << f << "\n" << describe(r);
    }
  }
}

TEST(Gpu, IpcOnManagedBlockFailsWithOneLine) {
  REQUIRE_GPU();
  RunResult r = program("ipc", {"3"}, gpu_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(lines_with(r.out, "ipc=0").size(), 0u) << describe(r);
  EXPECT_EQ(lines_with(r.err, "SPILLWAY_EXCLUDE").size(), 1u) << describe(r);
}

TEST(Gpu, StreamCaptureWithStreamOrderedCalls) {
  REQUIRE_GPU();
  RunResult r = program("capture", {}, gpu_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(lines_with(r.out, "captured").size(), 1u);
  // The graph's own memory is the driver's; a block freed in the capture
  // is not reused before the graph has run.
  RunResult launched = program("capture", {"launch"}, gpu_env(true));
  EXPECT_EQ(launched.status, 0) << describe(launched);
  EXPECT_NE(field(launched.out, "C"), field(launched.out, "A")) << describe(launched);
}

TEST(Gpu, ExcludedLibraryStaysDeviceMemory) {
  REQUIRE_GPU();
  RunResult r = program("excluded", {kExcludedLib}, gpu_env(true, {{"SPILLWAY_EXCLUDE", "libspillway_excluded_test"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "library"), "0") << describe(r);
  EXPECT_EQ(field(r.out, "program"), "1") << describe(r);
}

TEST(Gpu, ManyThreadsAllocatingAndFreeing) {
  REQUIRE_GPU();
  RunResult r = program("threads", {"16", "100000"}, gpu_env(true));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(field(r.out, "failures"), "0");
}

}  // namespace
}  // namespace spillway::test
