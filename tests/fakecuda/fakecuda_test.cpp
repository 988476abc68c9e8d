// Tests of fakecuda, the fake CUDA driver (libcuda.so.1) and runtime (libcudart.so.13)
// that Spillway's GPU-less tests run against. Expected values come from the CUDA 13.0
// headers (cuda.h, cuda_runtime_api.h) and from the fake's documented behaviour (README.md).
#define __CUDA_API_VERSION_INTERNAL 1  // declares the versioned and v1 names too
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <link.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <atomic>
#include <vector>

#include "fakecuda.h"

#ifdef FAKECUDA_HAVE_CUPTI
#include <cupti_activity.h>
#endif

namespace {

const char* const kVars[] = {"FAKECUDA_TOTAL_MEMORY", "FAKECUDA_CONCURRENT_MANAGED_ACCESS", "FAKECUDA_ASYNC",
                             "FAKECUDA_LOG",          "FAKECUDA_FAIL",
                             "FAKECUDA_GPU_MEMORY",   "FAKECUDA_STATS",
                             "FAKECUDA_DEVICES",      "CUDA_VISIBLE_DEVICES"};

void* driver() {
  static void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h;
}

// Must run first in the process (declaration order): nothing has called cuInit yet.
TEST(FakeCudaInit, CallsBeforeCuInitFail) {
  int version = 0;
  EXPECT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, 13000);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, 256), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(&p, 256), CUDA_ERROR_INVALID_CONTEXT);  // no current context yet
}

class FakeCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
    fakecuda_reload_config();
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
    fakecuda_reload_config();
    if (!log_.empty()) unlink(log_.c_str());
  }
  void Configure(const char* var, const char* value) {
    setenv(var, value, 1);
    fakecuda_reload_config();
  }
  void StartLog() {
    log_ = "/tmp/fakecuda_test_" + std::to_string(getpid()) + ".log";
    unlink(log_.c_str());
    Configure("FAKECUDA_LOG", log_.c_str());
  }
  std::vector<std::string> LogLines() {
    std::ifstream in(log_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  size_t FreeBytes() {
    size_t free = 0, total = 0;
    EXPECT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
    return free;
  }
  std::string log_;
};

void* proc(const char* name, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status = nullptr) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st{};
  cuGetProcAddress_v2(name, &fn, version, flags, status ? status : &st);
  return fn;
}

TEST_F(FakeCuda, GetProcAddressPicksTheVersionedSymbol) {
  void* h = driver();
  ASSERT_NE(h, nullptr);
  const cuuint64_t ptsz = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  EXPECT_EQ(proc("cuMemAlloc", 3020, 0), dlsym(h, "cuMemAlloc_v2"));
  EXPECT_EQ(proc("cuMemAlloc", 13000, ptsz), dlsym(h, "cuMemAlloc_v2"));  // no ptsz form: flag ignored
  EXPECT_EQ(proc("cuMemAlloc", 2000, 0), dlsym(h, "cuMemAlloc"));
  EXPECT_NE(dlsym(h, "cuMemAlloc"), dlsym(h, "cuMemAlloc_v2"));
  EXPECT_EQ(proc("cuMemGetInfo", 3010, 0), dlsym(h, "cuMemGetInfo"));
  EXPECT_EQ(proc("cuMemAllocAsync", 11020, 0), dlsym(h, "cuMemAllocAsync"));
  EXPECT_EQ(proc("cuMemAllocAsync", 13000, ptsz), dlsym(h, "cuMemAllocAsync_ptsz"));
  EXPECT_EQ(proc("cuMemPrefetchAsync", 8000, 0), dlsym(h, "cuMemPrefetchAsync"));
  EXPECT_EQ(proc("cuMemPrefetchAsync", 12010, ptsz), dlsym(h, "cuMemPrefetchAsync_ptsz"));
  EXPECT_EQ(proc("cuMemPrefetchAsync", 12020, 0), dlsym(h, "cuMemPrefetchAsync_v2"));
  EXPECT_EQ(proc("cuMemPrefetchAsync", 13000, ptsz), dlsym(h, "cuMemPrefetchAsync_v2_ptsz"));
  EXPECT_EQ(proc("cuMemAdvise", 8000, 0), dlsym(h, "cuMemAdvise"));
  EXPECT_EQ(proc("cuMemAdvise", 12020, 0), dlsym(h, "cuMemAdvise_v2"));
  EXPECT_EQ(proc("cuGetProcAddress", 11030, 0), dlsym(h, "cuGetProcAddress"));
  EXPECT_EQ(proc("cuGetProcAddress", 12000, 0), dlsym(h, "cuGetProcAddress_v2"));
  EXPECT_EQ(proc("cuStreamBeginCapture", 10010, ptsz), dlsym(h, "cuStreamBeginCapture_v2_ptsz"));
  EXPECT_EQ(proc("cuEventElapsedTime", 12080, 0), dlsym(h, "cuEventElapsedTime_v2"));

  CUdriverProcAddressQueryResult status{};
  void* fn = &status;
  EXPECT_EQ(cuGetProcAddress_v2("cuNoSuchCall", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(cuGetProcAddress_v2(nullptr, &fn, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE);
  // The 11.3 ABI resolves the same table.
  EXPECT_EQ(cuGetProcAddress("cuMemFree", &fn, 12000, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, dlsym(h, "cuMemFree_v2"));
}

TEST_F(FakeCuda, PointerAttributesTellTheTruth) {
  CUdeviceptr dev = 0, managed = 0;
  ASSERT_EQ(cuMemAlloc_v2(&dev, 1000), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocManaged(&managed, 5000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(dev % 256, 0u);
  unsigned is_managed = 7, type = 0;
  EXPECT_EQ(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dev + 10), CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 0u);
  EXPECT_EQ(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, managed + 4999), CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 1u);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, managed), CUDA_SUCCESS);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  CUdeviceptr start = 0;
  size_t size = 0;
  int ordinal = -1;
  CUcontext ctx = nullptr, current = nullptr;
  EXPECT_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, managed + 100), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, managed + 100), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dev), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, dev), CUDA_SUCCESS);
  cuCtxGetCurrent(&current);
  EXPECT_EQ(start, managed);
  EXPECT_EQ(size, 5000u);
  EXPECT_EQ(ordinal, 0);
  EXPECT_EQ(ctx, current);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev + 1000), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuPointerGetAttribute(nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dev), CUDA_ERROR_INVALID_VALUE);

  // cuPointerGetAttributes fills every slot; an unknown pointer gets defaults, not an error.
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* data[] = {&is_managed, &type, &size};
  EXPECT_EQ(cuPointerGetAttributes(3, attrs, data, managed), CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 1u);
  EXPECT_EQ(size, 5000u);
  int local = 0;
  EXPECT_EQ(cuPointerGetAttributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(&local)), CUDA_SUCCESS);
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(is_managed, 0u);
  EXPECT_EQ(cuMemFree_v2(dev), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(managed), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(managed), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCuda, DeviceMemoryRunsOutButManagedDoesNot) {
  Configure("FAKECUDA_TOTAL_MEMORY", "1048576");
  size_t free = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 1048576u);
  CUdeviceptr a = 0, b = 0, m = 0, pitched = 0;
  size_t pitch = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 786432), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 262144u);
  EXPECT_EQ(cuMemAlloc_v2(&b, 262145), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAllocAsync(&b, 262145, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAllocPitch_v2(&pitched, &pitch, 1024, 512, 4), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAllocManaged(&m, size_t{1} << 30, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);  // host RAM
  EXPECT_EQ(FreeBytes(), 262144u);
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(m), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 1048576u);
  // Pitch: width rounded up to 512; element size must be 4, 8 or 16.
  EXPECT_EQ(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 3, 3), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemAllocPitch_v2(&pitched, &pitch, 1000, 3, 8), CUDA_SUCCESS);
  EXPECT_EQ(pitch, 1024u);
  EXPECT_EQ(FreeBytes(), 1048576u - 3072u);
  EXPECT_EQ(cuMemFree_v2(pitched), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCuda, FailInjectionCountsSymbolOrBaseName) {
  Configure("FAKECUDA_FAIL", "cuMemAlloc:2,cuMemAllocAsync_ptsz:1,cuStreamCreate:1:801");
  CUdeviceptr p[3] = {};
  EXPECT_EQ(cuMemAlloc_v2(&p[0], 64), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAlloc_v2(&p[1], 64), CUDA_ERROR_OUT_OF_MEMORY);  // 2nd call of base cuMemAlloc
  EXPECT_EQ(cuMemAlloc_v2(&p[1], 64), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAllocAsync(&p[2], 64, nullptr), CUDA_SUCCESS);  // not the named symbol
  CUdeviceptr q = 0;
  EXPECT_EQ(cuMemAllocAsync_ptsz(&q, 64, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  CUstream s = nullptr;
  EXPECT_EQ(cuStreamCreate(&s, 0), CUDA_ERROR_NOT_SUPPORTED);  // explicit code
  EXPECT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  for (CUdeviceptr x : p) EXPECT_EQ(cuMemFree_v2(x), CUDA_SUCCESS);
  Configure("FAKECUDA_FAIL", "cuEventCreate:1");
  CUevent e = nullptr;
  EXPECT_EQ(cuEventCreate(&e, 0), CUDA_ERROR_UNKNOWN);  // non-allocating call
}

TEST_F(FakeCuda, BadEnvironmentValuesWarnAndUseDefaults) {
  setenv("FAKECUDA_TOTAL_MEMORY", "lots", 1);
  setenv("FAKECUDA_FAIL", "cuMemAlloc", 1);
  testing::internal::CaptureStderr();
  fakecuda_reload_config();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("FAKECUDA_TOTAL_MEMORY='lots'"), std::string::npos) << err;
  EXPECT_NE(err.find("FAKECUDA_FAIL='cuMemAlloc'"), std::string::npos) << err;
  size_t free = 0, total = 0;
  EXPECT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 17179869184u);
  int cma = 0;
  Configure("FAKECUDA_CONCURRENT_MANAGED_ACCESS", "0");
  EXPECT_EQ(cuDeviceGetAttribute(&cma, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0), CUDA_SUCCESS);
  EXPECT_EQ(cma, 0);
}

TEST_F(FakeCuda, LogWritesOneLinePerCall) {
  StartLog();
  CUdeviceptr p = 0;
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(p + 1), CUDA_ERROR_INVALID_VALUE);
  std::vector<std::string> lines = LogLines();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_TRUE(std::regex_match(lines[0], std::regex("cuMemAlloc_v2 bytesize=4096 dptr=0x[0-9a-f]+ -> 0")))
      << lines[0];
  EXPECT_TRUE(std::regex_match(lines[3], std::regex("cuEventRecord event=0x[0-9a-f]+ stream=0x[0-9a-f]+ capturing=0 -> 0")))
      << lines[3];
  EXPECT_TRUE(std::regex_match(lines[4], std::regex("cuMemFree_v2 dptr=0x[0-9a-f]+ -> 1"))) << lines[4];
  cuEventDestroy_v2(e);
  cuStreamDestroy_v2(s);
  cuMemFree_v2(p);
}

TEST_F(FakeCuda, AsyncModeCompletesWorkOnlyAtSynchronize) {
  Configure("FAKECUDA_ASYNC", "1");
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);  // never recorded
  ASSERT_EQ(cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuEventSynchronize(e), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);

  // A stream-ordered free releases device memory when the stream reaches it.
  size_t before = FreeBytes();
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAllocAsync(&p, 1 << 20, s), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeAsync(p, s), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before - (1 << 20));
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);

  Configure("FAKECUDA_ASYNC", "0");
  ASSERT_EQ(cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);  // synchronous mode: complete when recorded
  cuEventDestroy_v2(e);
  cuStreamDestroy_v2(s);
}

TEST_F(FakeCuda, CaptureIsReportedAndLogged) {
  StartLog();
  CUstream s = nullptr;
  CUevent e = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamBeginCapture_v2(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ASSERT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  CUstreamCaptureStatus status{};
  EXPECT_EQ(cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(cuEventRecord(e, s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(cuStreamIsCapturing(s, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  bool seen = false;
  for (const std::string& l : LogLines())
    seen |= l.rfind("cuEventRecord ", 0) == 0 && l.find(" capturing=1 -> 0") != std::string::npos;
  EXPECT_TRUE(seen);

  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  EXPECT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
  EXPECT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  EXPECT_EQ(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
  cuEventDestroy_v2(e);
  cuStreamDestroy_v2(s);
}

TEST_F(FakeCuda, KernelsRunByName) {
  CUmodule mod = nullptr;
  CUfunction fill = nullptr, add = nullptr;
  ASSERT_EQ(cuModuleLoadData(&mod, "fill_u32(8,4,4); add_u32(8,8,8,8)"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&fill, mod, "fill_u32"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&add, mod, "add_u32"), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleGetFunction(&add, mod, "nope"), CUDA_ERROR_NOT_FOUND);
  size_t offset = 0, size = 0;
  ASSERT_EQ(cuFuncGetParamInfo(fill, 2, &offset, &size), CUDA_SUCCESS);
  EXPECT_EQ(offset, 12u);
  EXPECT_EQ(size, 4u);
  EXPECT_EQ(cuFuncGetParamInfo(fill, 3, &offset, &size), CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr a = 0, b = 0;
  ASSERT_EQ(cuMemAllocManaged(&a, 64 * 4, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAlloc_v2(&b, 64 * 4), CUDA_SUCCESS);
  uint32_t count = 64, value = 7;
  void* fill_args[] = {&a, &count, &value};
  ASSERT_EQ(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, nullptr, fill_args, nullptr), CUDA_SUCCESS);
  value = 5;
  fill_args[0] = &b;
  ASSERT_EQ(cuLaunchKernel_ptsz(fill, 1, 1, 1, 64, 1, 1, 0, nullptr, fill_args, nullptr), CUDA_SUCCESS);
  uint64_t n = 64;
  void* add_args[] = {&a, &a, &b, &n};
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  ASSERT_EQ(cuLaunchKernelEx(&config, add, add_args, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uint32_t*>(a)[63], 12u);

  char name[32];
  uint64_t params[4];
  ASSERT_EQ(fakecuda_last_launch(name, sizeof name, params, 4), 4);
  EXPECT_STREQ(name, "add_u32");
  EXPECT_EQ(params[0], a);
  EXPECT_EQ(params[3], 64u);

  count = 65;  // one past the end
  EXPECT_EQ(cuLaunchCooperativeKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, fill_args), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cuModuleUnload(mod), CUDA_SUCCESS);
  cuMemFree_v2(a);
  cuMemFree_v2(b);
}

TEST_F(FakeCuda, HintsAndIpcCheckTheAllocationKind) {
  CUdeviceptr dev = 0, managed = 0;
  ASSERT_EQ(cuMemAlloc_v2(&dev, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  CUmemLocation gpu{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  EXPECT_EQ(cuMemPrefetchAsync_v2(managed, 4096, gpu, 0, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuMemPrefetchAsync_v2(managed, 4097, gpu, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPrefetchAsync_v2(dev, 4096, gpu, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPrefetchAsync(managed, 4096, 0, nullptr), CUDA_SUCCESS);  // v1 ABI
  EXPECT_EQ(cuMemAdvise_v2(managed, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, gpu), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAdvise(dev, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, 0), CUDA_ERROR_INVALID_VALUE);
  CUipcMemHandle handle{};
  EXPECT_EQ(cuIpcGetMemHandle(&handle, managed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuIpcGetMemHandle(&handle, dev), CUDA_SUCCESS);
  EXPECT_EQ(cuIpcGetMemHandle(nullptr, dev), CUDA_ERROR_INVALID_VALUE);

  // VMM: a mapped range is kind "vmm" (device memory, not managed).
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = gpu;
  CUmemGenericAllocationHandle phys = 0;
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemCreate(&phys, 2 << 20, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAddressReserve(&va, 2 << 20, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, 2 << 20, 0, phys, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{gpu, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  EXPECT_EQ(cuMemSetAccess(va, 2 << 20, &access, 1), CUDA_SUCCESS);
  unsigned is_managed = 1, type = 0;
  EXPECT_EQ(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, va + 100), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va), CUDA_SUCCESS);
  EXPECT_EQ(is_managed, 0u);
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  EXPECT_EQ(cuMemUnmap(va, 2 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, 2 << 20), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(phys), CUDA_SUCCESS);
  cuMemFree_v2(dev);
  cuMemFree_v2(managed);
}

TEST_F(FakeCuda, SixteenThreadsAllocateConcurrently) {
  size_t before = FreeBytes();
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      cuCtxSetCurrent(ctx);
      for (int i = 0; i < 200; ++i) {
        CUdeviceptr p = 0;
        CUresult r = (i + t) % 2 ? cuMemAlloc_v2(&p, 4096 + i) : cuMemAllocManaged(&p, 4096 + i, CU_MEM_ATTACH_GLOBAL);
        if (r != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(FreeBytes(), before);
}

// The runtime reaches the driver only through cuGetProcAddress_v2.
TEST_F(FakeCuda, RuntimeUsesGetProcAddress) {
  StartLog();
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(rt, nullptr) << dlerror();
  auto rt_malloc = reinterpret_cast<decltype(&cudaMalloc)>(dlsym(rt, "cudaMalloc"));
  auto rt_malloc_managed = reinterpret_cast<cudaError_t (*)(void**, size_t, unsigned)>(dlsym(rt, "cudaMallocManaged"));
  auto rt_malloc_async_ptsz = reinterpret_cast<decltype(&cudaMallocAsync)>(dlsym(rt, "cudaMallocAsync_ptsz"));
  auto rt_free = reinterpret_cast<decltype(&cudaFree)>(dlsym(rt, "cudaFree"));
  auto rt_attrs = reinterpret_cast<decltype(&cudaPointerGetAttributes)>(dlsym(rt, "cudaPointerGetAttributes"));
  auto rt_last = reinterpret_cast<decltype(&cudaGetLastError)>(dlsym(rt, "cudaGetLastError"));
  auto rt_entry = reinterpret_cast<cudaError_t (*)(const char*, void**, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult*)>(
      dlsym(rt, "cudaGetDriverEntryPointByVersion"));
  ASSERT_TRUE(rt_malloc && rt_malloc_managed && rt_malloc_async_ptsz && rt_free && rt_attrs && rt_last && rt_entry);

  // The runtime does not link libcuda: no DT_NEEDED entry names it.
  link_map* lm = nullptr;
  ASSERT_EQ(dlinfo(rt, RTLD_DI_LINKMAP, &lm), 0);
  const char* strtab = nullptr;
  for (const ElfW(Dyn)* d = lm->l_ld; d->d_tag != DT_NULL; ++d)
    if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(d->d_un.d_ptr);
  ASSERT_NE(strtab, nullptr);
  for (const ElfW(Dyn)* d = lm->l_ld; d->d_tag != DT_NULL; ++d)
    if (d->d_tag == DT_NEEDED) {
      EXPECT_EQ(std::string(strtab + d->d_un.d_val).find("libcuda"), std::string::npos);
    }
  void* dev = nullptr;
  void* managed = nullptr;
  void* async = nullptr;
  ASSERT_EQ(rt_malloc(&dev, 1024), cudaSuccess);
  ASSERT_EQ(rt_malloc_managed(&managed, 1024, cudaMemAttachGlobal), cudaSuccess);
  ASSERT_EQ(rt_malloc_async_ptsz(&async, 1024, nullptr), cudaSuccess);
  cudaPointerAttributes attr{};
  ASSERT_EQ(rt_attrs(&attr, managed), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeManaged);
  ASSERT_EQ(rt_attrs(&attr, dev), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(rt_malloc(&dev, size_t{1} << 62), cudaErrorMemoryAllocation);
  EXPECT_EQ(rt_last(), cudaErrorMemoryAllocation);
  EXPECT_EQ(rt_last(), cudaSuccess);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  EXPECT_EQ(rt_entry("cuMemAlloc", &fn, 12000, cudaEnableDefault, &status), cudaSuccess);
  EXPECT_EQ(fn, dlsym(driver(), "cuMemAlloc_v2"));

  std::vector<std::string> lines = LogLines();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("cuGetProcAddress_v2 symbol=cuGetProcAddress version=13000 flags=0 ", 0), 0u) << lines[0];
  bool ptsz_lookup = false, ptsz_call = false;
  for (const std::string& l : lines) {
    ptsz_lookup |= l.rfind("cuGetProcAddress_v2 symbol=cuMemAllocAsync version=13000 flags=2 ", 0) == 0;
    ptsz_call |= l.rfind("cuMemAllocAsync_ptsz ", 0) == 0;
  }
  EXPECT_TRUE(ptsz_lookup);
  EXPECT_TRUE(ptsz_call);
  rt_free(dev);
  rt_free(managed);
  rt_free(async);
}

// ---- the residency model (FAKECUDA_GPU_MEMORY) ---------------------------------------------

TEST_F(FakeCuda, ResidencyModelIsOffByDefault) {
  fakecuda_residency_stats_t st{};
  st.faults = 99;
  EXPECT_EQ(fakecuda_residency_stats(&st), -1);
  EXPECT_EQ(st.faults, 0u);
  EXPECT_EQ(st.capacity_chunks, 0u);
  CUmodule mod = nullptr;
  CUfunction fill = nullptr;
  ASSERT_EQ(cuModuleLoadData(&mod, "fill_u32(8,8,4)"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&fill, mod, "fill_u32"), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAllocManaged(&a, 2 << 20, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  uint64_t count = 16;
  unsigned value = 1;
  void* args[] = {&a, &count, &value};
  ASSERT_EQ(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_chunk_location(a), -1);
  EXPECT_EQ(fakecuda_residency_stats(&st), -1);
  EXPECT_EQ(st.launches, 0u);
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(mod), CUDA_SUCCESS);

  setenv("FAKECUDA_GPU_MEMORY", "1000", 1);  // less than one chunk
  testing::internal::CaptureStderr();
  fakecuda_reload_config();
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "fakecuda: ignoring bad FAKECUDA_GPU_MEMORY='1000', using no residency model\n");
  EXPECT_EQ(fakecuda_residency_stats(&st), -1);
}

// A GPU of 4 chunks (8 MiB) and 2 MiB managed blocks, each exactly one chunk.
class FakeResidency : public FakeCuda {
 protected:
  void SetUp() override {
    FakeCuda::SetUp();
    Configure("FAKECUDA_GPU_MEMORY", "8388608");
    ASSERT_EQ(cuModuleLoadData(&mod_, "fill_u32(8,8,4);add_u32(8,8,8,8);pair_k(24)"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&fill_, mod_, "fill_u32"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&add_, mod_, "add_u32"), CUDA_SUCCESS);
    ASSERT_EQ(cuModuleGetFunction(&pair_, mod_, "pair_k"), CUDA_SUCCESS);
  }
  void TearDown() override {
    for (CUdeviceptr p : blocks_) cuMemFree_v2(p);
    cuModuleUnload(mod_);
    FakeCuda::TearDown();
  }
  CUdeviceptr Block() {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAllocManaged(&p, 2 << 20, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT_EQ(p % (2 << 20), 0u) << "managed memory starts on a chunk boundary under the model";
    blocks_.push_back(p);
    return p;
  }
  void Fill(CUdeviceptr p) {
    uint64_t count = 16;
    unsigned value = 3;
    void* args[] = {&p, &count, &value};
    ASSERT_EQ(cuLaunchKernel(fill_, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  }
  void Add(CUdeviceptr dst, CUdeviceptr src) {
    uint64_t count = 16;
    void* args[] = {&dst, &src, &src, &count};
    ASSERT_EQ(cuLaunchKernel(add_, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  }
  void Prefetch(CUdeviceptr p, bool to_gpu) {
    CUmemLocation loc{to_gpu ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST, 0};
    ASSERT_EQ(cuMemPrefetchAsync_v2(p, 2 << 20, loc, 0, nullptr), CUDA_SUCCESS);
  }
  fakecuda_residency_stats_t Stats() {
    fakecuda_residency_stats_t st{};
    EXPECT_EQ(fakecuda_residency_stats(&st), 0);
    return st;
  }
  CUmodule mod_ = nullptr;
  CUfunction fill_ = nullptr, add_ = nullptr, pair_ = nullptr;
  std::vector<CUdeviceptr> blocks_;
};

TEST_F(FakeResidency, FreshFirstTouchPopulatesWithoutAFault) {
  CUdeviceptr a = Block();
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_FRESH);
  Fill(a);
  EXPECT_EQ(fakecuda_chunk_location(a + (1 << 20)), FAKECUDA_CHUNK_GPU);
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.capacity_chunks, 4u);
  EXPECT_EQ(st.launches, 1u);
  EXPECT_EQ(st.populated, 1u);
  EXPECT_EQ(st.faults, 0u);
  EXPECT_EQ(st.resident_chunks, 1u);
  Fill(a);  // resident: nothing happens
  EXPECT_EQ(Stats().faults, 0u);
  // Memory the model does not cover: device allocations, host pointers, plain values.
  CUdeviceptr dev = 0;
  ASSERT_EQ(cuMemAlloc_v2(&dev, 2 << 20), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_chunk_location(dev), -1);
  Fill(dev);
  EXPECT_EQ(Stats().resident_chunks, 1u);
  EXPECT_EQ(cuMemFree_v2(dev), CUDA_SUCCESS);
}

TEST_F(FakeResidency, FaultOnFirstUseAfterEviction) {
  CUdeviceptr a = Block();
  Fill(a);
  Prefetch(a, false);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_CPU);
  EXPECT_EQ(Stats().prefetched_out, 1u);
  EXPECT_EQ(Stats().resident_chunks, 0u);
  Fill(a);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_GPU);
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.faults, 1u);
  EXPECT_EQ(st.populated, 1u);
  EXPECT_EQ(st.driver_evictions, 0u);
}

TEST_F(FakeResidency, NoFaultAfterPrefetch) {
  CUdeviceptr a = Block(), b = Block();
  Prefetch(a, false);  // fresh: populated on the CPU, no migration
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_CPU);
  EXPECT_EQ(Stats().prefetched_out, 0u);
  Prefetch(a, true);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_GPU);
  Fill(a);  // right after its prefetch: no fault, but late
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.prefetched_in, 1u);
  EXPECT_EQ(st.faults, 0u);
  EXPECT_EQ(st.late_prefetches, 1u);
  Prefetch(a, false);
  Prefetch(a, true);
  Fill(b);  // a kernel between the prefetch and the use: on time
  Fill(a);
  st = Stats();
  EXPECT_EQ(st.prefetched_in, 2u);
  EXPECT_EQ(st.faults, 0u);
  EXPECT_EQ(st.late_prefetches, 1u);
  // A prefetch on a capturing stream is not executed.
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0};
  EXPECT_EQ(cuMemPrefetchAsync_v2(a, 2 << 20, host, 0, s), CUDA_SUCCESS);
  CUgraph g = nullptr;
  ASSERT_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_GPU);
  cuGraphDestroy(g);
  cuStreamDestroy_v2(s);
}

TEST_F(FakeResidency, TheOldestMigratedChunkIsEvicted) {
  CUdeviceptr b[5];
  for (CUdeviceptr& p : b) p = Block();
  for (int i = 0; i < 4; ++i) Fill(b[i]);  // migration order 0, 1, 2, 3
  Fill(b[0]);                              // an access does not reorder
  Fill(b[4]);                              // full: the oldest migrated (b0) goes
  EXPECT_EQ(fakecuda_chunk_location(b[0]), FAKECUDA_CHUNK_CPU);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(fakecuda_chunk_location(b[i]), FAKECUDA_CHUNK_GPU) << i;
  EXPECT_EQ(Stats().driver_evictions, 1u);
  // b0 faults back in; the oldest (b1) is in use by the same launch, so b2 goes.
  Add(b[1], b[0]);
  EXPECT_EQ(fakecuda_chunk_location(b[2]), FAKECUDA_CHUNK_CPU);
  EXPECT_EQ(fakecuda_chunk_location(b[0]), FAKECUDA_CHUNK_GPU);
  EXPECT_EQ(fakecuda_chunk_location(b[1]), FAKECUDA_CHUNK_GPU);
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.faults, 1u);
  EXPECT_EQ(st.driver_evictions, 2u);
  EXPECT_EQ(st.resident_chunks, 4u);
  // A prefetch onto a full GPU evicts too.
  Prefetch(b[2], true);
  EXPECT_EQ(fakecuda_chunk_location(b[1]), FAKECUDA_CHUNK_CPU);
  EXPECT_EQ(Stats().driver_evictions, 3u);
}

TEST_F(FakeResidency, PreferredLocationCpuAndAccessedByGpuReadRemotely) {
  CUdeviceptr a = Block(), fresh = Block();
  Fill(a);
  Prefetch(a, false);
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0}, gpu{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  for (CUdeviceptr p : {a, fresh}) {
    ASSERT_EQ(cuMemAdvise_v2(p, 2 << 20, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host), CUDA_SUCCESS);
    ASSERT_EQ(cuMemAdvise_v2(p, 2 << 20, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu), CUDA_SUCCESS);
  }
  Fill(a);  // read over the link: no fault, no migration
  Fill(fresh);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_CPU);
  EXPECT_EQ(fakecuda_chunk_location(fresh), FAKECUDA_CHUNK_CPU);  // populated where it is preferred
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.remote_accesses, 2u);
  EXPECT_EQ(st.faults, 0u);
  EXPECT_EQ(st.populated, 2u);
  Prefetch(a, true);  // a prefetch still migrates
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_GPU);
  ASSERT_EQ(cuMemAdvise_v2(fresh, 2 << 20, CU_MEM_ADVISE_UNSET_ACCESSED_BY, gpu), CUDA_SUCCESS);
  Fill(fresh);  // no mapping any more: a fault
  st = Stats();
  EXPECT_EQ(st.faults, 1u);
  EXPECT_EQ(st.remote_accesses, 2u);
}

TEST_F(FakeResidency, PointersInsideByValueStructsTouchTheirBlocks) {
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAllocManaged(&a, 6 << 20, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  blocks_.push_back(a);
  struct {
    uint64_t count;
    CUdeviceptr inner;  // into the middle: the whole allocation is touched
    uint64_t seven;
  } s{1, a + (3 << 20), 7};
  void* args[] = {&s};
  ASSERT_EQ(cuLaunchKernel(pair_, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fakecuda_chunk_location(a + (uint64_t(i) << 21)), FAKECUDA_CHUNK_GPU) << i;
  fakecuda_residency_stats_t st = Stats();
  EXPECT_EQ(st.populated, 3u);
  EXPECT_EQ(st.resident_chunks, 3u);
  // A freed allocation leaves the GPU without a migration; its chunks come back fresh.
  ASSERT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  blocks_.clear();
  st = Stats();
  EXPECT_EQ(st.resident_chunks, 0u);
  EXPECT_EQ(st.prefetched_out + st.driver_evictions, 0u);
}

// ---- the runtime's kernel launches --------------------------------------------------------------

TEST_F(FakeCuda, RuntimeLaunchesRegisteredStubs) {
  StartLog();
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(rt, nullptr) << dlerror();
  auto rt_launch = reinterpret_cast<decltype(&cudaLaunchKernel)>(dlsym(rt, "cudaLaunchKernel"));
  auto rt_launch_ptsz = reinterpret_cast<decltype(&cudaLaunchKernel)>(dlsym(rt, "cudaLaunchKernel_ptsz"));
  auto rt_launch_ex = reinterpret_cast<decltype(&cudaLaunchKernelExC)>(dlsym(rt, "cudaLaunchKernelExC"));
  auto rt_get = reinterpret_cast<decltype(&cudaGetFuncBySymbol)>(dlsym(rt, "cudaGetFuncBySymbol"));
  auto rt_register = reinterpret_cast<decltype(&fakecudart_register_stub)>(dlsym(rt, "fakecudart_register_stub"));
  ASSERT_TRUE(rt_launch && rt_launch_ptsz && rt_launch_ex && rt_get && rt_register);
  CUmodule mod = nullptr;
  CUfunction fill = nullptr;
  ASSERT_EQ(cuModuleLoadData(&mod, "fill_u32(8,8,4)"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&fill, mod, "fill_u32"), CUDA_SUCCESS);
  static const char stub = 0, hidden = 0, unknown = 0;
  ASSERT_EQ(rt_register(&stub, fill, 1), 0);
  ASSERT_EQ(rt_register(&hidden, fill, 0), 0);
  cudaFunction_t f = nullptr;
  EXPECT_EQ(rt_get(&f, &stub), cudaSuccess);
  EXPECT_EQ(f, fill);
  EXPECT_EQ(rt_get(&f, &hidden), cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(rt_get(&f, &unknown), cudaErrorInvalidDeviceFunction);

  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 64 * 4), CUDA_SUCCESS);
  uint64_t count = 64;
  unsigned value = 9;
  void* args[] = {&a, &count, &value};
  EXPECT_EQ(rt_launch(&stub, dim3(1), dim3(64), args, 0, nullptr), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<unsigned*>(a)[63], 9u);
  value = 10;
  EXPECT_EQ(rt_launch_ptsz(&hidden, dim3(1), dim3(64), args, 0, nullptr), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<unsigned*>(a)[0], 10u);
  value = 11;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(2);
  config.blockDim = dim3(32);
  EXPECT_EQ(rt_launch_ex(&config, &stub, args), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<unsigned*>(a)[5], 11u);
  EXPECT_EQ(rt_launch(&unknown, dim3(1), dim3(1), args, 0, nullptr), cudaErrorInvalidDeviceFunction);
  EXPECT_EQ(rt_launch_ex(nullptr, &stub, args), cudaErrorInvalidValue);
  ASSERT_EQ(rt_register(&stub, nullptr, 1), 0);  // removed
  EXPECT_EQ(rt_launch(&stub, dim3(1), dim3(1), args, 0, nullptr), cudaErrorInvalidDeviceFunction);

  std::vector<std::string> launches;
  for (const std::string& l : LogLines())
    if (l.rfind("cuLaunchKernel", 0) == 0) launches.push_back(l.substr(0, l.find(' ')));
  EXPECT_EQ(launches, (std::vector<std::string>{"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx"}));
  cuMemFree_v2(a);
  cuModuleUnload(mod);
}

// ---- several devices (FAKECUDA_DEVICES, CUDA_VISIBLE_DEVICES) --------------------------------

// Two devices; the test starts on device 0's primary context (FakeCuda::SetUp).
class FakeMultiDevice : public FakeCuda {
 protected:
  void SetUp() override {
    FakeCuda::SetUp();
    Configure("FAKECUDA_DEVICES", "2");
    for (int d = 0; d < 2; ++d) ASSERT_EQ(cuDevicePrimaryCtxRetain(&primary_[d], d), CUDA_SUCCESS);
    ASSERT_NE(primary_[0], primary_[1]);
    ASSERT_EQ(cuCtxSetCurrent(primary_[0]), CUDA_SUCCESS);
  }
  void On(int d) { ASSERT_EQ(cuCtxSetCurrent(primary_[d]), CUDA_SUCCESS); }
  int Device() {
    CUdevice d = -1;
    EXPECT_EQ(cuCtxGetDevice(&d), CUDA_SUCCESS);
    return d;
  }
  template <class T>
  T Attr(CUpointer_attribute a, CUdeviceptr p) {
    T v{};
    EXPECT_EQ(cuPointerGetAttribute(&v, a, p), CUDA_SUCCESS);
    return v;
  }
  CUcontext primary_[2] = {};
};

TEST_F(FakeMultiDevice, DevicesHaveTheirOwnIdentity) {
  int count = 0;
  ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 2);
  CUdevice dev = -1;
  EXPECT_EQ(cuDeviceGet(&dev, 1), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  EXPECT_EQ(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  char name[64];
  EXPECT_EQ(cuDeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
  EXPECT_STREQ(name, "Fakecuda GPU");
  EXPECT_EQ(cuDeviceGetName(name, sizeof name, 2), CUDA_ERROR_INVALID_DEVICE);
  CUuuid u0{}, u1{};
  EXPECT_EQ(cuDeviceGetUuid_v2(&u0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGetUuid(&u1, 1), CUDA_SUCCESS);
  EXPECT_NE(std::memcmp(u0.bytes, u1.bytes, sizeof u0.bytes), 0);
  char bus[2][16];
  EXPECT_EQ(cuDeviceGetPCIBusId(bus[0], sizeof bus[0], 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGetPCIBusId(bus[1], sizeof bus[1], 1), CUDA_SUCCESS);
  EXPECT_STREQ(bus[0], "0000:00:00.0");
  EXPECT_STREQ(bus[1], "0000:01:00.0");
  EXPECT_EQ(cuDeviceGetByPCIBusId(&dev, "0000:01:00.0"), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  EXPECT_EQ(cuDeviceGetByPCIBusId(&dev, "00:00.0"), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cuDeviceGetByPCIBusId(&dev, "0000:07:00.0"), CUDA_ERROR_INVALID_DEVICE);
  int value = -1;
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
  EXPECT_EQ(value, 1);
  EXPECT_EQ(cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1), CUDA_SUCCESS);
  EXPECT_EQ(value, 132);
  size_t total = 0;
  EXPECT_EQ(cuDeviceTotalMem_v2(&total, 1), CUDA_SUCCESS);
  EXPECT_EQ(total, 17179869184u);
  EXPECT_EQ(fakecuda_device_physical(1), 1);
  EXPECT_EQ(fakecuda_device_physical(2), -1);
  // The lookups of the calls added for several devices.
  EXPECT_EQ(proc("cuCtxCreate", 12050, 0), dlsym(driver(), "cuCtxCreate_v4"));
  EXPECT_EQ(proc("cuCtxCreate", 3020, 0), dlsym(driver(), "cuCtxCreate_v2"));
  EXPECT_EQ(proc("cuCtxGetDevice", 13000, 0), dlsym(driver(), "cuCtxGetDevice_v2"));
  EXPECT_EQ(proc("cuCtxGetDevice", 12000, 0), dlsym(driver(), "cuCtxGetDevice"));
  EXPECT_EQ(proc("cuStreamGetCtx", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            dlsym(driver(), "cuStreamGetCtx_v2_ptsz"));
  EXPECT_EQ(proc("cuDevicePrimaryCtxSetFlags", 13000, 0), dlsym(driver(), "cuDevicePrimaryCtxSetFlags_v2"));
  EXPECT_EQ(proc("cuDeviceGetUuid", 13000, 0), dlsym(driver(), "cuDeviceGetUuid_v2"));
}

TEST_F(FakeMultiDevice, EachDeviceCountsItsOwnMemory) {
  Configure("FAKECUDA_TOTAL_MEMORY", "1048576");
  CUdeviceptr a = 0, b = 0, c = 0;
  ASSERT_EQ(cuMemAlloc_v2(&a, 786432), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 262144u);
  On(1);
  EXPECT_EQ(Device(), 1);
  size_t free = 0, total = 0;
  ASSERT_EQ(cuMemGetInfo_v2(&free, &total), CUDA_SUCCESS);
  EXPECT_EQ(total, 1048576u);
  EXPECT_EQ(free, 1048576u);  // device 0's allocation is not on device 1
  ASSERT_EQ(cuMemAlloc_v2(&b, 1048576), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 0u);
  EXPECT_EQ(cuMemAlloc_v2(&c, 256), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(cuMemAllocAsync(&c, 256, nullptr), CUDA_ERROR_OUT_OF_MEMORY);  // device 1's default pool
  // A VMM handle counts against its location's device, whatever is current.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemGenericAllocationHandle phys = 0;
  ASSERT_EQ(cuMemCreate(&phys, 131072, &prop, 0), CUDA_SUCCESS);
  prop.location.id = 2;
  CUmemGenericAllocationHandle bad = 0;
  EXPECT_EQ(cuMemCreate(&bad, 4096, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  CUdeviceptr va = 0;
  ASSERT_EQ(cuMemAddressReserve(&va, 131072, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemMap(va, 131072, 0, phys, 0), CUDA_SUCCESS);
  EXPECT_EQ(Attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va), 0);  // the handle's device
  EXPECT_EQ(cuMemFree_v2(b), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 1048576u);
  On(0);
  EXPECT_EQ(FreeBytes(), 131072u);
  // Pools: each device's default pool gives that device's memory.
  CUmemoryPool p0 = nullptr, p1 = nullptr;
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&p0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuDeviceGetDefaultMemPool(&p1, 1), CUDA_SUCCESS);
  EXPECT_NE(p0, p1);
  EXPECT_EQ(cuMemPoolDestroy(p1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemAllocFromPoolAsync(&c, 524288, p1, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 131072u);
  EXPECT_EQ(Attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, c), 1);
  EXPECT_EQ(Attr<CUmemoryPool>(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, c), p1);
  On(1);
  EXPECT_EQ(FreeBytes(), 524288u);
  EXPECT_EQ(cuMemFreeAsync(c, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 1048576u);
  On(0);
  EXPECT_EQ(cuMemUnmap(va, 131072), CUDA_SUCCESS);
  EXPECT_EQ(cuMemAddressFree(va, 131072), CUDA_SUCCESS);
  EXPECT_EQ(cuMemRelease(phys), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), 1048576u);
}

TEST_F(FakeMultiDevice, PointerAttributesNameTheAllocatingContext) {
  CUdeviceptr d0 = 0, d1 = 0, m1 = 0;
  ASSERT_EQ(cuMemAlloc_v2(&d0, 4096), CUDA_SUCCESS);
  On(1);
  ASSERT_EQ(cuMemAlloc_v2(&d1, 4096), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocManaged(&m1, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  On(0);  // whatever is current now
  EXPECT_EQ(Attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d0), 0);
  EXPECT_EQ(Attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d1 + 100), 1);
  EXPECT_EQ(Attr<int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, m1), 1);
  EXPECT_EQ(Attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, d0), primary_[0]);
  EXPECT_EQ(Attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, d1), primary_[1]);
  EXPECT_EQ(Attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, m1), primary_[1]);
  int ordinal = 7;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* data[] = {&ordinal};
  int local = 0;
  EXPECT_EQ(cuPointerGetAttributes(1, attrs, data, reinterpret_cast<CUdeviceptr>(&local)), CUDA_SUCCESS);
  EXPECT_EQ(ordinal, -2);  // unknown pointer
  for (CUdeviceptr p : {d0, d1, m1}) EXPECT_EQ(cuMemFree_v2(p), CUDA_SUCCESS);
}

TEST_F(FakeMultiDevice, CreatedContextsArePushedAndDestroyedWithTheirMemory) {
  Configure("FAKECUDA_TOTAL_MEMORY", "1048576");
  CUcontext ctx = nullptr, top = nullptr;
  ASSERT_EQ(cuCtxCreate_v4(&ctx, nullptr, 0, 1), CUDA_SUCCESS);
  EXPECT_NE(ctx, primary_[1]);
  ASSERT_EQ(cuCtxGetCurrent(&top), CUDA_SUCCESS);
  EXPECT_EQ(top, ctx);
  EXPECT_EQ(Device(), 1);
  CUdevice dev = -1;
  EXPECT_EQ(cuCtxGetDevice_v2(&dev, primary_[0]), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);
  EXPECT_EQ(cuCtxGetDevice_v2(&dev, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  CUdeviceptr p = 0;
  ASSERT_EQ(cuMemAlloc_v2(&p, 1048576), CUDA_SUCCESS);
  EXPECT_EQ(Attr<CUcontext>(CU_POINTER_ATTRIBUTE_CONTEXT, p), ctx);
  ASSERT_EQ(cuCtxPopCurrent_v2(&top), CUDA_SUCCESS);
  EXPECT_EQ(top, ctx);
  EXPECT_EQ(Device(), 0);  // the primary context under it again
  On(1);
  EXPECT_EQ(FreeBytes(), 0u);  // the created context's memory is device 1's
  On(0);
  EXPECT_EQ(cuCtxDestroy_v2(primary_[0]), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
  EXPECT_EQ(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_ERROR_INVALID_VALUE);
  On(1);
  EXPECT_EQ(FreeBytes(), 1048576u);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuCtxDestroy_v2(ctx), CUDA_ERROR_INVALID_CONTEXT);
  // A context destroyed while current below the top stays on the stack, unusable.
  CUcontext other = nullptr;
  ASSERT_EQ(cuCtxCreate_v2(&other, CU_CTX_SCHED_SPIN, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent_v2(other), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy_v2(other), CUDA_SUCCESS);  // pops the top one only
  EXPECT_EQ(cuMemAlloc_v2(&p, 256), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ASSERT_EQ(cuCtxPopCurrent_v2(&top), CUDA_SUCCESS);
  EXPECT_EQ(top, other);
  EXPECT_EQ(Device(), 1);
  EXPECT_EQ(cuCtxCreate_v2(&other, 0, 2), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuCtxCreate_v3(&other, nullptr, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeMultiDevice, PrimaryContextStateIsPerDevice) {
  unsigned flags = 9;
  int active = 9;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags(1, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);  // v1
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags_v2(1, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxSetFlags_v2(1, 0x1000), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags, unsigned{CU_CTX_SCHED_BLOCKING_SYNC});
  EXPECT_EQ(active, 0);
  EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(flags, 0u);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cuDevicePrimaryCtxGetState(2, &flags, &active), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDevicePrimaryCtxReset_v2(1), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxReset_v2(2), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(FakeMultiDevice, EachContextHasItsOwnStreamsAndEvents) {
  Configure("FAKECUDA_ASYNC", "1");
  CUstream s0 = nullptr, s1 = nullptr;
  CUevent e0 = nullptr, e1 = nullptr;
  ASSERT_EQ(cuStreamCreate(&s0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&e0, 0), CUDA_SUCCESS);
  On(1);
  ASSERT_EQ(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&e1, 0), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuStreamGetCtx(s0, &ctx), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary_[0]);
  EXPECT_EQ(cuStreamGetCtx(nullptr, &ctx), CUDA_SUCCESS);  // the current context's
  EXPECT_EQ(ctx, primary_[1]);
  CUgreenCtx green = reinterpret_cast<CUgreenCtx>(&ctx);
  EXPECT_EQ(cuStreamGetCtx_v2(CU_STREAM_LEGACY, &ctx, &green), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary_[1]);
  EXPECT_EQ(green, nullptr);
  CUdevice dev = -1;
  EXPECT_EQ(cuStreamGetDevice(s0, &dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 0);

  // An event records only on a stream of its own context; waiting across is legal.
  EXPECT_EQ(cuEventRecord(e0, nullptr), CUDA_ERROR_INVALID_HANDLE);  // device 1's legacy stream
  EXPECT_EQ(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(cuEventRecord(e0, s0), CUDA_SUCCESS);  // its own stream, from another current context
  ASSERT_EQ(cuEventRecord(e1, nullptr), CUDA_SUCCESS);
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime_v2(&ms, e0, e1), CUDA_ERROR_INVALID_HANDLE);  // different devices

  // cuCtxSynchronize completes the current context's streams only.
  EXPECT_EQ(cuEventQuery(e0), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuEventQuery(e1), CUDA_ERROR_NOT_READY);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e1), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e0), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(s0), CUDA_ERROR_NOT_READY);

  // ... and the work they wait for: a wait on device 0's event orders device 1's later work
  // after it, so completing device 1's streams completes that event first (not what device 0
  // queued after it).
  EXPECT_EQ(cuStreamWaitEvent(s1, e0, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamWaitEvent(nullptr, e0, 0), CUDA_SUCCESS);
  On(0);
  CUevent later = nullptr;
  ASSERT_EQ(cuEventCreate(&later, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(later, s0), CUDA_SUCCESS);
  On(1);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e0), CUDA_SUCCESS) << "device 1's streams waited for it";
  EXPECT_EQ(cuEventQuery(later), CUDA_ERROR_NOT_READY) << "recorded after the event waited for";
  On(0);
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_SUCCESS);  // device 0's legacy stream: nothing on it
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(later), CUDA_SUCCESS);
  ASSERT_EQ(cuEventDestroy_v2(later), CUDA_SUCCESS);

  // A launch goes to a stream of the current context only.
  CUmodule mod = nullptr;
  CUfunction fill = nullptr;
  ASSERT_EQ(cuModuleLoadData(&mod, "fill_u32(8,8,4)"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&fill, mod, "fill_u32"), CUDA_SUCCESS);
  CUdeviceptr a = 0;
  ASSERT_EQ(cuMemAllocManaged(&a, 64, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  uint64_t count = 16;
  unsigned value = 1;
  void* args[] = {&a, &count, &value};
  EXPECT_EQ(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s1, args, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s0, args, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s1), CUDA_SUCCESS);  // synchronizing another context's stream is fine
  EXPECT_EQ(cuMemFree_v2(a), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(mod), CUDA_SUCCESS);
  for (CUevent e : {e0, e1}) EXPECT_EQ(cuEventDestroy_v2(e), CUDA_SUCCESS);
  for (CUstream s : {s0, s1}) EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

TEST_F(FakeCuda, VisibleDevicesAreRenumberedAndTheListEndsAtABadEntry) {
  setenv("FAKECUDA_DEVICES", "4", 1);
  struct Case {
    const char* value;
    std::vector<int> physical;
  } cases[] = {
      {"2,0", {2, 0}}, {"3,1,7,0", {3, 1}}, {"1,1,0", {1}}, {"1,x,0", {1}}, {" 2 ,3", {2, 3}},
      {"-1", {}},      {"", {}},            {"0,", {0}},    {"GPU-fa4ecda0", {}},
  };
  for (const Case& c : cases) {
    setenv("CUDA_VISIBLE_DEVICES", c.value, 1);
    fakecuda_reload_config();
    int count = -1;
    ASSERT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS) << c.value;
    EXPECT_EQ(count, static_cast<int>(c.physical.size())) << c.value;
    for (int d = 0; d < count && d < static_cast<int>(c.physical.size()); ++d) {
      EXPECT_EQ(fakecuda_device_physical(d), c.physical[d]) << c.value << " device " << d;
      CUuuid u{};
      ASSERT_EQ(cuDeviceGetUuid_v2(&u, d), CUDA_SUCCESS);
      EXPECT_EQ(u.bytes[15], c.physical[d]) << "the identity follows the physical device";
      int bus = -1;
      EXPECT_EQ(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d), CUDA_SUCCESS);
      EXPECT_EQ(bus, c.physical[d]);
    }
    EXPECT_EQ(fakecuda_device_physical(count), -1);
    CUdevice dev = 0;
    EXPECT_EQ(cuDeviceGet(&dev, count), CUDA_ERROR_INVALID_DEVICE) << c.value;
    EXPECT_EQ(cuInit(0), count ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE) << c.value;
  }
  // No device: no context to make current either.
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_INVALID_DEVICE);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAlloc_v2(&p, 256), CUDA_ERROR_CONTEXT_IS_DESTROYED);  // device 0's primary is gone
  unsetenv("CUDA_VISIBLE_DEVICES");
  fakecuda_reload_config();
  int count = 0;
  EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, 4);
  // FAKECUDA_DEVICES: 1..8.
  for (const char* bad : {"0", "9", "two"}) {
    setenv("FAKECUDA_DEVICES", bad, 1);
    testing::internal::CaptureStderr();
    fakecuda_reload_config();
    EXPECT_EQ(testing::internal::GetCapturedStderr(),
              "fakecuda: ignoring bad FAKECUDA_DEVICES='" + std::string(bad) + "', using 1\n");
    EXPECT_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    EXPECT_EQ(count, 1);
  }
}

TEST_F(FakeMultiDevice, AReloadResetsContextsAndDevices) {
  CUcontext ctx = nullptr;
  CUstream s1 = nullptr;
  On(1);
  ASSERT_EQ(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate_v2(&ctx, 0, 0), CUDA_SUCCESS);
  Configure("FAKECUDA_ASYNC", "0");  // any reload: created contexts go, retains are dropped
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);
  unsigned flags = 0;
  int active = 1;
  ASSERT_EQ(cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
  EXPECT_EQ(active, 0);
  EXPECT_EQ(cuStreamSynchronize(s1), CUDA_SUCCESS);  // device 1 is still there, and its stream
  Configure("FAKECUDA_DEVICES", "1");  // device 1 goes, with its primary context's streams
  EXPECT_EQ(cuCtxSetCurrent(primary_[1]), CUDA_ERROR_INVALID_CONTEXT);
  On(0);
  EXPECT_EQ(cuStreamSynchronize(s1), CUDA_ERROR_INVALID_HANDLE);
  CUcontext again = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), CUDA_SUCCESS);
  EXPECT_EQ(again, primary_[0]);  // primary handles never change
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(FakeMultiDevice, RuntimeSetDeviceSwitchesPrimaryContexts) {
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(rt, nullptr) << dlerror();
  auto set = reinterpret_cast<decltype(&cudaSetDevice)>(dlsym(rt, "cudaSetDevice"));
  auto get = reinterpret_cast<decltype(&cudaGetDevice)>(dlsym(rt, "cudaGetDevice"));
  auto count = reinterpret_cast<decltype(&cudaGetDeviceCount)>(dlsym(rt, "cudaGetDeviceCount"));
  auto rt_malloc = reinterpret_cast<decltype(&cudaMalloc)>(dlsym(rt, "cudaMalloc"));
  auto rt_free = reinterpret_cast<decltype(&cudaFree)>(dlsym(rt, "cudaFree"));
  auto rt_attrs = reinterpret_cast<decltype(&cudaPointerGetAttributes)>(dlsym(rt, "cudaPointerGetAttributes"));
  auto rt_last = reinterpret_cast<decltype(&cudaGetLastError)>(dlsym(rt, "cudaGetLastError"));
  ASSERT_TRUE(set && get && count && rt_malloc && rt_free && rt_attrs && rt_last);
  int n = 0, d = -1;
  EXPECT_EQ(count(&n), cudaSuccess);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(get(&d), cudaSuccess);
  EXPECT_EQ(d, 0);
  ASSERT_EQ(set(1), cudaSuccess);
  EXPECT_EQ(get(&d), cudaSuccess);
  EXPECT_EQ(d, 1);
  CUcontext ctx = nullptr;
  EXPECT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  EXPECT_EQ(ctx, primary_[1]);
  void* p = nullptr;
  ASSERT_EQ(rt_malloc(&p, 4096), cudaSuccess);
  cudaPointerAttributes attr{};
  ASSERT_EQ(rt_attrs(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.device, 1);
  EXPECT_EQ(set(2), cudaErrorInvalidDevice);
  EXPECT_EQ(set(-1), cudaErrorInvalidDevice);
  EXPECT_EQ(rt_last(), cudaErrorInvalidDevice);
  EXPECT_EQ(get(&d), cudaSuccess);
  EXPECT_EQ(d, 1);  // unchanged
  On(0);  // the driver API's current context is the runtime's current device
  EXPECT_EQ(get(&d), cudaSuccess);
  EXPECT_EQ(d, 0);
  ASSERT_EQ(set(0), cudaSuccess);
  EXPECT_EQ(rt_free(p), cudaSuccess);
}

// A GPU of 4 chunks (8 MiB) on each of two devices.
class FakeMultiResidency : public FakeResidency {
 protected:
  void SetUp() override {
    FakeResidency::SetUp();
    Configure("FAKECUDA_DEVICES", "2");  // (a reload: the model starts afresh with two GPUs)
    for (int d = 0; d < 2; ++d) ASSERT_EQ(cuDevicePrimaryCtxRetain(&primary_[d], d), CUDA_SUCCESS);
    On(0);
  }
  void On(int d) { ASSERT_EQ(cuCtxSetCurrent(primary_[d]), CUDA_SUCCESS); }
  void PrefetchTo(CUdeviceptr p, int device) {
    CUmemLocation loc{device < 0 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE, device < 0 ? 0 : device};
    ASSERT_EQ(cuMemPrefetchAsync_v2(p, 2 << 20, loc, 0, nullptr), CUDA_SUCCESS);
  }
  fakecuda_residency_stats_t On_(int d) {
    fakecuda_residency_stats_t st{};
    EXPECT_EQ(fakecuda_device_residency_stats(d, &st), 0);
    return st;
  }
  CUcontext primary_[2] = {};
};

TEST_F(FakeMultiResidency, APrefetchedChunkMigratesToTheLaunchingDevice) {
  CUdeviceptr a = Block();
  EXPECT_EQ(fakecuda_chunk_device(a), FAKECUDA_DEVICE_FRESH);
  PrefetchTo(a, -1);  // populated on the CPU
  EXPECT_EQ(fakecuda_chunk_device(a), FAKECUDA_DEVICE_CPU);
  PrefetchTo(a, 1);  // issued from device 0, to device 1
  EXPECT_EQ(fakecuda_chunk_device(a), 1);
  EXPECT_EQ(fakecuda_chunk_location(a), FAKECUDA_CHUNK_GPU);
  EXPECT_EQ(On_(1).prefetched_in, 1u);
  EXPECT_EQ(On_(1).resident_chunks, 1u);
  EXPECT_EQ(On_(0).prefetched_in, 0u);
  Fill(a);  // on device 0: a fault there, the chunk comes over from device 1
  EXPECT_EQ(fakecuda_chunk_device(a), 0);
  fakecuda_residency_stats_t d0 = On_(0), d1 = On_(1);
  EXPECT_EQ(d0.faults, 1u);
  EXPECT_EQ(d0.from_peer, 1u);
  EXPECT_EQ(d0.launches, 1u);
  EXPECT_EQ(d0.resident_chunks, 1u);
  EXPECT_EQ(d1.resident_chunks, 0u);
  EXPECT_EQ(d1.launches, 0u);
  EXPECT_EQ(d1.driver_evictions + d1.prefetched_out, 0u);  // a move, not an eviction
  // Prefetching it back to device 1 is a peer prefetch there; a launch on device 1 right after
  // it is late, on device 1's own count.
  PrefetchTo(a, 1);
  On(1);
  Fill(a);
  d1 = On_(1);
  EXPECT_EQ(d1.prefetched_in, 2u);
  EXPECT_EQ(d1.from_peer, 1u);
  EXPECT_EQ(d1.late_prefetches, 1u);
  EXPECT_EQ(d1.faults, 0u);
  // Toward the host: counted on the GPU it leaves.
  On(0);
  PrefetchTo(a, -1);
  EXPECT_EQ(On_(1).prefetched_out, 1u);
  EXPECT_EQ(On_(0).prefetched_out, 0u);
  fakecuda_residency_stats_t sum = Stats();
  EXPECT_EQ(sum.capacity_chunks, 8u);
  EXPECT_EQ(sum.faults, 1u);
  EXPECT_EQ(sum.prefetched_in, 2u);
  EXPECT_EQ(sum.launches, 2u);
  EXPECT_EQ(sum.from_peer, 2u);
  EXPECT_EQ(sum.populated, 1u);
  fakecuda_residency_stats_t none{};
  none.faults = 5;
  EXPECT_EQ(fakecuda_device_residency_stats(2, &none), -1);
  EXPECT_EQ(none.faults, 0u);
  CUmemLocation bad{CU_MEM_LOCATION_TYPE_DEVICE, 2};
  EXPECT_EQ(cuMemPrefetchAsync_v2(a, 2 << 20, bad, 0, nullptr), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(FakeMultiResidency, EachGpuHasItsOwnCapacity) {
  CUdeviceptr b[9];
  for (CUdeviceptr& p : b) p = Block();
  On(1);
  for (int i = 0; i < 4; ++i) Fill(b[i]);
  On(0);
  for (int i = 4; i < 8; ++i) Fill(b[i]);
  EXPECT_EQ(On_(0).resident_chunks, 4u);
  EXPECT_EQ(On_(1).resident_chunks, 4u);
  EXPECT_EQ(Stats().driver_evictions, 0u);
  Fill(b[8]);  // device 0 is full: its oldest (b4) goes, device 1 keeps its own
  EXPECT_EQ(fakecuda_chunk_device(b[4]), FAKECUDA_DEVICE_CPU);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(fakecuda_chunk_device(b[i]), 1) << i;
  EXPECT_EQ(On_(0).driver_evictions, 1u);
  EXPECT_EQ(On_(1).driver_evictions, 0u);
  // A chunk coming from device 1 onto the full device 0 evicts there too.
  Fill(b[0]);
  EXPECT_EQ(fakecuda_chunk_device(b[0]), 0);
  EXPECT_EQ(fakecuda_chunk_device(b[5]), FAKECUDA_DEVICE_CPU);
  EXPECT_EQ(On_(0).driver_evictions, 2u);
  EXPECT_EQ(On_(1).resident_chunks, 3u);
  EXPECT_EQ(Stats().resident_chunks, 7u);
  // Advice names a device: preferred location CPU + accessed by device 1 reads remotely on
  // device 1 only.
  CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0}, gpu1{CU_MEM_LOCATION_TYPE_DEVICE, 1};
  ASSERT_EQ(cuMemAdvise_v2(b[4], 2 << 20, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAdvise_v2(b[4], 2 << 20, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu1), CUDA_SUCCESS);
  On(1);
  Fill(b[4]);
  EXPECT_EQ(fakecuda_chunk_device(b[4]), FAKECUDA_DEVICE_CPU);
  EXPECT_EQ(On_(1).remote_accesses, 1u);
  On(0);
  Fill(b[4]);  // device 0 has no such mapping: a fault
  EXPECT_EQ(fakecuda_chunk_device(b[4]), 0);
  EXPECT_EQ(On_(0).remote_accesses, 0u);
}

// FAKECUDA_STATS from child processes: the sums under the old keys plus "devices"; two
// processes that each see one device (CUDA_VISIBLE_DEVICES=0 and =1) report different
// physical devices.
TEST_F(FakeCuda, StatsNameEachDeviceAndItsPhysicalOrdinal) {
  std::string base = "/tmp/fakecuda_test_stats_" + std::to_string(getpid());
  auto run = [&](const char* visible, const std::string& path, bool launch) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("FAKECUDA_DEVICES", "2", 1);
      setenv("FAKECUDA_GPU_MEMORY", "8388608", 1);
      setenv("FAKECUDA_STATS", path.c_str(), 1);
      if (visible) setenv("CUDA_VISIBLE_DEVICES", visible, 1);
      fakecuda_reload_config();  // (this process reads the configuration: it writes the stats)
      CUcontext ctx = nullptr;
      CUmodule mod = nullptr;
      CUfunction fill = nullptr;
      CUdeviceptr a = 0;
      int last = visible ? 0 : 1;
      bool ok = cuDevicePrimaryCtxRetain(&ctx, last) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
                cuModuleLoadData(&mod, "fill_u32(8,8,4)") == CUDA_SUCCESS &&
                cuModuleGetFunction(&fill, mod, "fill_u32") == CUDA_SUCCESS &&
                cuMemAllocManaged(&a, 2 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS;
      uint64_t count = 16;
      unsigned value = 1;
      void* args[] = {&a, &count, &value};
      CUmemLocation host{CU_MEM_LOCATION_TYPE_HOST, 0};
      if (ok && launch)
        ok = cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr) == CUDA_SUCCESS &&
             cuMemPrefetchAsync_v2(a, 2 << 20, host, 0, nullptr) == CUDA_SUCCESS &&
             cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr) == CUDA_SUCCESS;
      std::exit(ok ? 0 : 3);  // exit(), not _exit(): the report is written at exit
    }
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    unlink(path.c_str());
    return text.str();
  };
  std::string both = run(nullptr, base + "-both.json", true);
  EXPECT_EQ(both.rfind("{\"gpu_memory\":16777216,\"capacity_chunks\":8,\"resident_chunks\":1,\"launches\":2,"
                       "\"faults\":1,\"populated\":1,\"prefetched_in\":0,\"prefetched_out\":1,",
                       0),
            0u)
      << both;
  EXPECT_NE(both.find(",\"devices\":[{\"device\":0,\"physical\":0,\"gpu_memory\":8388608,\"capacity_chunks\":4,"
                      "\"resident_chunks\":0,\"launches\":0,"),
            std::string::npos)
      << both;
  EXPECT_NE(both.find("{\"device\":1,\"physical\":1,\"gpu_memory\":8388608,\"capacity_chunks\":4,"
                      "\"resident_chunks\":1,\"launches\":2,\"faults\":1,\"populated\":1,\"prefetched_in\":0,"
                      "\"prefetched_out\":1,\"driver_evictions\":0,\"late_prefetches\":0,\"remote_accesses\":0,"
                      "\"discarded\":0,\"read_mostly_drops\":0,\"collapses\":0,\"from_peer\":0,\"resident_bytes\":2097152}]}\n"),
            std::string::npos)
      << both;
  std::string first = run("0", base + "-0.json", false), second = run("1", base + "-1.json", false);
  EXPECT_NE(first.find("\"devices\":[{\"device\":0,\"physical\":0,"), std::string::npos) << first;
  EXPECT_NE(second.find("\"devices\":[{\"device\":0,\"physical\":1,"), std::string::npos) << second;
  EXPECT_EQ(second.find("\"device\":1"), std::string::npos) << second;  // one device visible
}

#ifdef FAKECUDA_HAVE_CUPTI
// The fake CUPTI's records name the devices involved: the kernel's deviceId, a page fault's
// srcId (the faulting GPU), a transfer's srcId and dstId (the CPU is 0); GPU to GPU is DTOD.
std::vector<unsigned char>& cupti_records() {
  static std::vector<unsigned char> r;
  return r;
}
void CUPTIAPI cupti_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 1 << 16;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}
void CUPTIAPI cupti_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  cupti_records().insert(cupti_records().end(), buffer, buffer + valid);
  std::free(buffer);
}

TEST_F(FakeMultiResidency, CuptiRecordsCarryTheirDevices) {
  void* h = dlopen(FAKECUDA_DIR "/cupti/libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto reg = reinterpret_cast<decltype(&cuptiActivityRegisterCallbacks)>(dlsym(h, "cuptiActivityRegisterCallbacks"));
  auto enable = reinterpret_cast<decltype(&cuptiActivityEnable)>(dlsym(h, "cuptiActivityEnable"));
  auto disable = reinterpret_cast<decltype(&cuptiActivityDisable)>(dlsym(h, "cuptiActivityDisable"));
  auto configure = reinterpret_cast<decltype(&cuptiActivityConfigureUnifiedMemoryCounter)>(
      dlsym(h, "cuptiActivityConfigureUnifiedMemoryCounter"));
  auto flush = reinterpret_cast<decltype(&cuptiActivityFlushAll)>(dlsym(h, "cuptiActivityFlushAll"));
  auto next = reinterpret_cast<decltype(&cuptiActivityGetNextRecord)>(dlsym(h, "cuptiActivityGetNextRecord"));
  ASSERT_TRUE(reg && enable && disable && configure && flush && next);
  CUpti_ActivityUnifiedMemoryCounterConfig config[4] = {};
  const CUpti_ActivityUnifiedMemoryCounterKind kinds[4] = {
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT, CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH,
      CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD};
  for (int i = 0; i < 4; ++i) {
    config[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_ALL_DEVICES;
    config[i].kind = kinds[i];
    config[i].enable = 1;
  }
  ASSERT_EQ(configure(config, 4), CUPTI_SUCCESS);
  ASSERT_EQ(reg(cupti_requested, cupti_completed), CUPTI_SUCCESS);
  ASSERT_EQ(enable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER), CUPTI_SUCCESS);
  ASSERT_EQ(enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), CUPTI_SUCCESS);
  cupti_records().clear();

  CUdeviceptr a = Block();
  PrefetchTo(a, -1);  // fresh: populated on the CPU, nothing moves
  PrefetchTo(a, 1);   // CPU -> device 1
  Fill(a);            // on device 0: fault, device 1 -> device 0
  On(1);
  Fill(a);            // on device 1: fault, device 0 -> device 1
  PrefetchTo(a, -1);  // device 1 -> CPU
  ASSERT_EQ(flush(0), CUPTI_SUCCESS);
  disable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
  disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  fakecuda_set_activity_sink(nullptr);

  std::vector<std::string> seen;
  CUpti_Activity* r = nullptr;
  uint8_t* buf = cupti_records().data();
  while (!cupti_records().empty() && next(buf, cupti_records().size(), &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      seen.push_back("kernel " + std::to_string(reinterpret_cast<CUpti_ActivityKernel10*>(r)->deviceId));
    } else if (r->kind == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) {
      auto* u = reinterpret_cast<CUpti_ActivityUnifiedMemoryCounter3*>(r);
      EXPECT_EQ(u->address, a);
      const char* name = u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT       ? "fault"
                         : u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD ? "htod"
                         : u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH ? "dtoh"
                         : u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD ? "dtod"
                                                                                                               : "?";
      std::string line = std::string(name) + " " + std::to_string(u->srcId);
      if (u->counterKind != CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT)
        line += ">" + std::to_string(u->dstId);
      seen.push_back(line);
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"htod 0>1", "fault 0", "dtod 1>0", "kernel 0", "fault 1", "dtod 0>1",
                                            "kernel 1", "dtoh 1>0"}));
}
#endif  // FAKECUDA_HAVE_CUPTI

}  // namespace
