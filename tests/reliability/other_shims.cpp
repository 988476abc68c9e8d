// Cases reported against other CUDA interception libraries, each a mode of
// this ordinary driver-API program (no knowledge of Spillway). other_shims_test runs each under
// the real shim and the fake driver, and most also without the shim for comparison.
//   getproc_first      the first CUDA call is cuGetProcAddress asking for cuGetProcAddress;
//                      then entry points at old and new versions, with and without the
//                      per-thread flag; prints "base@version[/ptsz] -> library:symbol"
//   vmm_worker         host-located VMM memory (cuMemCreate with a host location, reserve,
//                      map, unmap, release) from a thread with no current context
//   dlsym_storm T N    T threads x N rounds of dlsym (libcuda names, cuDNN/cuBLAS names,
//                      RTLD_DEFAULT/RTLD_NEXT) racing the shim's initialisation; prints
//                      each name's answer as "name -> library:symbol"
//   capture_ops        a stream-ordered free and a launch inside a stream capture
//   exit_in_flight     exit with asynchronous work (copies, launches, frees) still queued
//   exit_other_thread  exit() from a second thread while the main thread, which allocated and
//                      still holds a block, runs the shim's dlsym hook
//   fork_child         fork() without exec; the child never uses CUDA and exits normally
#include <cuda.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_failures = 0;

#define EXPECT_OK(call)                                                                  \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, (int)r_);     \
      ++g_failures;                                                                      \
    }                                                                                    \
  } while (0)

// "library:symbol" for a function pointer (library = file name without directories).
std::string describe(void* p) {
  if (p == nullptr) return "null";
  Dl_info info{};
  if (dladdr(p, &info) == 0) return "unknown";
  std::string lib = info.dli_fname ? info.dli_fname : "?";
  lib = lib.substr(lib.rfind('/') + 1);
  return lib + ":" + (info.dli_sname ? info.dli_sname : "?");
}

CUcontext init() {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "no context\n");
    std::exit(2);
  }
  return ctx;
}

using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

int getproc_first() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 2;
  auto gpa = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (gpa == nullptr) return 2;
  void* self = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_OK(gpa("cuGetProcAddress", &self, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
  std::printf("cuGetProcAddress@13000 -> %s\n", describe(self).c_str());
  auto lookup = reinterpret_cast<GetProc>(self);
  if (lookup == nullptr) return 2;
  struct Q {
    const char* base;
    int version;
    bool ptsz;
  };
  const Q queries[] = {{"cuGetProcAddress", 11030, false}, {"cuMemAlloc", 2000, false},     {"cuMemAlloc", 3020, false},
                       {"cuMemAlloc", 12000, false},       {"cuMemAlloc", 13000, true},      {"cuMemFree", 2000, false},
                       {"cuMemFree", 3020, false},         {"cuMemAdvise", 8000, false},     {"cuMemAdvise", 12020, false},
                       {"cuMemPrefetchAsync", 8000, false}, {"cuMemPrefetchAsync", 12020, false},
                       {"cuMemAllocAsync", 11020, false},  {"cuMemAllocAsync", 11020, true}, {"cuMemFreeAsync", 11020, true},
                       {"cuMemGetInfo", 2000, false},      {"cuMemGetInfo", 3020, false},    {"cuLaunchKernel", 4000, false},
                       {"cuLaunchKernel", 7000, true},     {"cuMemAllocAsync", 11010, false}};
  for (const Q& q : queries) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st{};
    CUresult r = lookup(q.base, &p, q.version, q.ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
    std::printf("%s@%d%s -> %s r=%d status=%d\n", q.base, q.version, q.ptsz ? "/ptsz" : "", describe(p).c_str(), (int)r,
                (int)st);
  }
  // The lookups work before cuInit; now use what they gave.
  init();
  void* alloc = nullptr;
  EXPECT_OK(lookup("cuMemAlloc", &alloc, 12000, 0, nullptr));
  CUdeviceptr d = 0;
  if (alloc != nullptr) EXPECT_OK(reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(alloc)(&d, 1 << 20));
  unsigned long long managed = 0;
  EXPECT_OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, d));
  std::printf("managed=%llu\n", managed);
  EXPECT_OK(cuMemFree(d));
  return g_failures ? 1 : 0;
}

int vmm_worker() {
  init();
  std::thread worker([] {
    CUcontext current = reinterpret_cast<CUcontext>(1);
    EXPECT_OK(cuCtxGetCurrent(&current));
    std::printf("worker context %s\n", current == nullptr ? "none" : "set");
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    prop.location.id = 0;
    size_t bytes = 2 << 20;
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = cuMemCreate(&handle, bytes, &prop, 0);
    std::printf("cuMemCreate -> %d\n", (int)r);
    if (r != CUDA_SUCCESS) return;
    CUdeviceptr va = 0;
    std::printf("cuMemAddressReserve -> %d\n", (int)cuMemAddressReserve(&va, bytes, 0, 0, 0));
    std::printf("cuMemMap -> %d\n", (int)cuMemMap(va, bytes, 0, handle, 0));
    std::printf("cuMemUnmap -> %d\n", (int)cuMemUnmap(va, bytes));
    std::printf("cuMemAddressFree -> %d\n", (int)cuMemAddressFree(va, bytes));
    std::printf("cuMemRelease -> %d\n", (int)cuMemRelease(handle));
  });
  worker.join();
  return g_failures ? 1 : 0;
}

int dlsym_storm(int threads, int rounds) {
  const char* names[] = {"cuMemAlloc_v2", "cuGetProcAddress_v2", "cuGetProcAddress", "cuCtxGetCurrent",
                         "cuMemFree_v2",  "cudnnCreate",         "cublasCreate_v2",  "cuInit"};
  std::mutex mutex;
  std::map<std::string, std::set<std::string>> answers;
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ++ready;
      while (ready.load() < threads) {
      }
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
      if (t % 2 == 0) cuInit(0);  // some threads initialise while others look up
      std::map<std::string, std::set<std::string>> mine;
      for (int i = 0; i < rounds; ++i) {
        for (const char* n : names) {
          mine[std::string("handle ") + n].insert(describe(dlsym(lib, n)));
          mine[std::string("default ") + n].insert(describe(dlsym(RTLD_DEFAULT, n)));
          mine[std::string("next ") + n].insert(describe(dlsym(RTLD_NEXT, n)));
        }
      }
      std::lock_guard lock(mutex);
      for (auto& [k, v] : mine) answers[k].insert(v.begin(), v.end());
    });
  }
  for (auto& th : pool) th.join();
  int inconsistent = 0;
  for (const auto& [name, set] : answers) {
    std::string joined;
    for (const auto& s : set) joined += (joined.empty() ? "" : " | ") + s;
    std::printf("%s -> %s\n", name.c_str(), joined.c_str());
    if (set.size() != 1) ++inconsistent;
  }
  return inconsistent ? 1 : 0;
}

int capture_ops() {
  init();
  CUstream s = nullptr;
  EXPECT_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0;
  EXPECT_OK(cuMemAlloc(&a, 1 << 20));
  EXPECT_OK(cuMemAlloc(&b, 1 << 16));
  CUmodule m = nullptr;
  CUfunction fill = nullptr;
  EXPECT_OK(cuModuleLoadData(&m, "fill_u32(8,4,4)"));
  EXPECT_OK(cuModuleGetFunction(&fill, m, "fill_u32"));
  EXPECT_OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_OK(cuMemFreeAsync(a, s));
  unsigned count = (1 << 16) / 4, value = 7;
  void* params[] = {&b, &count, &value};
  EXPECT_OK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  EXPECT_OK(cuStreamIsCapturing(s, &st));
  std::printf("capturing=%d\n", st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? 1 : 0);
  CUgraph graph = nullptr;
  CUresult end = cuStreamEndCapture(s, &graph);
  std::printf("end_capture=%d graph=%d\n", (int)end, graph != nullptr ? 1 : 0);
  EXPECT_OK(cuStreamSynchronize(s));
  EXPECT_OK(cuMemFree(b));
  EXPECT_OK(cuStreamDestroy(s));
  return g_failures || end != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE ? 1 : 0;
}

int exit_in_flight() {
  init();
  CUstream s = nullptr;
  EXPECT_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUmodule m = nullptr;
  CUfunction fill = nullptr;
  EXPECT_OK(cuModuleLoadData(&m, "fill_u32(8,4,4)"));
  EXPECT_OK(cuModuleGetFunction(&fill, m, "fill_u32"));
  for (int i = 0; i < 64; ++i) {
    CUdeviceptr p = 0;
    EXPECT_OK(cuMemAllocAsync(&p, 4 << 20, s));
    unsigned count = (4 << 20) / 4, value = static_cast<unsigned>(i);
    void* params[] = {&p, &count, &value};
    EXPECT_OK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
    EXPECT_OK(cuMemPrefetchAsync_v2(p, 4 << 20, CUmemLocation{CU_MEM_LOCATION_TYPE_HOST, 0}, 0, s));
    if (i % 2) EXPECT_OK(cuMemFreeAsync(p, s));  // the rest stay allocated
  }
  std::printf("exiting with work queued\n");
  std::fflush(stdout);
  return g_failures ? 1 : 0;  // no synchronize: work and deferred frees still pending
}

int exit_other_thread() {
  init();
  std::atomic<bool> go{false};
  std::thread killer([&] {
    while (!go.load()) {
    }
    std::fflush(stdout);
    std::exit(0);
  });
  killer.detach();
  for (long i = 0; i < 1000; ++i) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 1 << 16) == CUDA_SUCCESS) cuMemFree(p);
  }
  CUdeviceptr live = 0;
  cuMemAlloc(&live, 1 << 20);  // still allocated at exit
  // While the other thread exits, this one keeps running the shim's own paths (its dlsym
  // hook, its substitution table, its locks) — but no longer enters the fake driver, whose
  // globals exit() destroys under its callers (a bug of the fake, docs/reliability.md).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  go.store(true);
  for (;;) {
    if (dlsym(lib, "cuMemAlloc_v2") == nullptr) std::abort();
    dlsym(RTLD_DEFAULT, "cudnnCreate");
  }
}

int fork_child() {
  init();
  CUdeviceptr p = 0;
  EXPECT_OK(cuMemAlloc(&p, 1 << 20));
  unsigned long long pattern = 0x1122334455667788ull, back = 0;
  EXPECT_OK(cuMemcpyHtoD(p, &pattern, sizeof pattern));
  std::fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    // Never touches CUDA; exits normally, running atexit handlers and library destructors.
    std::vector<int> v(1000, 1);
    long sum = 0;
    for (int x : v) sum += x;
    std::printf("child sum=%ld\n", sum);
    std::exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_OK(cuMemcpyDtoH(&back, p, sizeof back));
  EXPECT_OK(cuMemFree(p));
  std::printf("child status=%d parent data=%s\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
              back == pattern ? "intact" : "lost");
  return g_failures || back != pattern || status != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "getproc_first") return getproc_first();
  if (mode == "vmm_worker") return vmm_worker();
  if (mode == "dlsym_storm") return dlsym_storm(argc > 2 ? std::atoi(argv[2]) : 8, argc > 3 ? std::atoi(argv[3]) : 300);
  if (mode == "capture_ops") return capture_ops();
  if (mode == "exit_in_flight") return exit_in_flight();
  if (mode == "exit_other_thread") return exit_other_thread();
  if (mode == "fork_child") return fork_child();
  std::fprintf(stderr, "usage: other_shims MODE\n");
  return 2;
}
