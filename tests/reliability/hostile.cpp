// hostile MODE [ARGS]: correct driver-API programs that do what an adversarial user does to
// break an interception library. Each must run exactly as it runs without the
// shim. Written with no knowledge of Spillway; exits 0 on success, prints what it checked.
//   reload [library]  a kernel of 8 pointer parameters is launched and its module (or
//                     library) unloaded; a kernel of 1 parameter is loaded until it gets the
//                     same handle, and launched with a 1-entry kernelParams array that ends
//                     at a page boundary, the next page unmapped. Prints "reused=0|1".
//   extra_buffer      a launch through CU_LAUNCH_PARAM_BUFFER_POINTER whose claimed
//                     CU_LAUNCH_PARAM_BUFFER_SIZE (64 KiB) exceeds the buffer (8 bytes before
//                     an unmapped page). Prints "launch=RC".
//   bad_stream        stream-ordered allocations and frees on a destroyed and on a garbage
//                     stream; then the block is freed on a valid stream. Prints the codes.
//   double_free N     N times: two threads free the same block at the same instant. Prints
//                     "both=B none=Z" (iterations in which both, or neither, succeeded).
//   churn N           N short-lived threads, each launching one kernel on a shared block.
//   exit_in_handler USEC  launches of a kernel on 8 of 64 blocks in a loop until SIGALRM
//                     (after USEC µs) exits from its handler with status 3.
//   fork_child        forks before any CUDA call; the child allocates, launches 5 kernels,
//                     frees and exits; the parent waits and never uses CUDA.
//   race_frees T N    T threads, each N times: allocate, launch on it and on a shared block,
//                     free, with a second stream-ordered block. Prints "launches=L".
#include <cuda.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../programs/common.h"

namespace {

// Memory whose last `bytes` end where an unmapped page begins: reading past them faults.
unsigned char* before_guard_page(std::size_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  void* m = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) std::exit(2);
  auto* p = static_cast<unsigned char*>(m);
  if (mprotect(p + page, page, PROT_NONE) != 0) std::exit(2);
  return p + page - bytes;
}

CUfunction load_kernel(const char* image, const char* name) {
  CUmodule m = nullptr;
  CUfunction f = nullptr;
  CHECK(cuModuleLoadData(&m, image));
  CHECK(cuModuleGetFunction(&f, m, name));
  return f;
}

void launch1(CUfunction f, void** params, CUstream s = nullptr) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

int reload(bool library) {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1 << 20));
  auto load = [library](const char* image, const char* name, void** handle) {
    CUfunction f = nullptr;
    if (library) {
      CUlibrary lib = nullptr;
      CHECK(cuLibraryLoadData(&lib, image, nullptr, nullptr, 0, nullptr, nullptr, 0));
      CUkernel k = nullptr;
      CHECK(cuLibraryGetKernel(&k, lib, name));
      f = reinterpret_cast<CUfunction>(k);
      *handle = lib;
    } else {
      CUmodule m = nullptr;
      CHECK(cuModuleLoadData(&m, image));
      CHECK(cuModuleGetFunction(&f, m, name));
      *handle = m;
    }
    return f;
  };
  auto unload = [library](void* handle) {
    if (library) CHECK(cuLibraryUnload(static_cast<CUlibrary>(handle)));
    else CHECK(cuModuleUnload(static_cast<CUmodule>(handle)));
  };
  void* h = nullptr;
  CUfunction wide = load("wide_k(8,8,8,8,8,8,8,8)", "wide_k", &h);
  void* wide_params[8];
  for (void*& q : wide_params) q = &p;
  launch1(wide, wide_params);
  unload(h);
  bool reused = false;
  CUfunction narrow = nullptr;
  for (int i = 0; i < 64 && !reused; ++i) {
    narrow = load("narrow_k(8)", "narrow_k", &h);
    reused = narrow == wide;
    if (!reused) unload(h);
  }
  std::printf("reused=%d\n", reused ? 1 : 0);
  if (!reused) return 0;
  auto** params = reinterpret_cast<void**>(before_guard_page(sizeof(void*)));
  params[0] = &p;
  launch1(narrow, params);  // the driver reads one parameter: so may anyone else
  unload(h);
  CHECK(cuMemFree(p));
  return 0;
}

int extra_buffer() {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1 << 20));
  CUfunction f = load_kernel("one_k(8)", "one_k");
  unsigned char* buffer = before_guard_page(8);
  std::memcpy(buffer, &p, 8);
  size_t claimed = 64 << 10;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &claimed, CU_LAUNCH_PARAM_END};
  CUresult r = cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra);
  std::printf("launch=%d\n", r);
  CHECK(cuMemFree(p));
  return 0;
}

int bad_stream() {
  CUstream dead = nullptr, live = nullptr;
  CHECK(cuStreamCreate(&dead, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&live, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamDestroy(dead));
  CUstream garbage = reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x5a5a5a5a000));
  CUdeviceptr p = 0;
  CUresult alloc_dead = cuMemAllocAsync(&p, 1 << 20, dead);
  CUresult alloc_garbage = cuMemAllocAsync(&p, 1 << 20, garbage);
  CHECK(cuMemAllocAsync(&p, 1 << 20, live));
  CUresult free_dead = cuMemFreeAsync(p, dead);
  CUresult free_garbage = cuMemFreeAsync(p, garbage);
  CUresult free_live = cuMemFreeAsync(p, live);
  CHECK(cuStreamSynchronize(live));
  CHECK(cuStreamDestroy(live));
  std::printf("alloc_dead=%d alloc_garbage=%d free_dead=%d free_garbage=%d free_live=%d\n", alloc_dead, alloc_garbage,
              free_dead, free_garbage, free_live);
  bool ok = alloc_dead == CUDA_ERROR_INVALID_HANDLE && alloc_garbage == CUDA_ERROR_INVALID_HANDLE &&
            free_dead == CUDA_ERROR_INVALID_HANDLE && free_garbage == CUDA_ERROR_INVALID_HANDLE && free_live == CUDA_SUCCESS;
  return ok ? 0 : 1;
}

int double_free(int n) {
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  int both = 0, none = 0;
  for (int i = 0; i < n; ++i) {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 64 << 10));
    std::atomic<int> ready{0};
    CUresult r[2];
    auto free_it = [&](int t) {
      cuCtxSetCurrent(ctx);
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      r[t] = cuMemFree(p);
    };
    std::thread a(free_it, 0), b(free_it, 1);
    a.join();
    b.join();
    int ok = (r[0] == CUDA_SUCCESS) + (r[1] == CUDA_SUCCESS);
    both += ok == 2;
    none += ok == 0;
  }
  // The allocator still works and hands out memory nobody holds.
  for (int i = 0; i < 64; ++i) {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 64 << 10));
    touch(p, 64 << 10);
    CHECK(cuMemFree(p));
  }
  std::printf("both=%d none=%d\n", both, none);
  return both == 0 && none == 0 ? 0 : 1;
}

int churn(int n) {
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  CUfunction f = load_kernel("fill_u32(8,8,4)", "fill_u32");
  std::vector<CUdeviceptr> blocks(4);
  for (CUdeviceptr& b : blocks) CHECK(cuMemAlloc(&b, 4 << 20));
  for (int i = 0; i < n; ++i) {
    std::thread t([&, i] {
      CHECK(cuCtxSetCurrent(ctx));
      CUdeviceptr p = blocks[i % blocks.size()];
      unsigned long long count = (4 << 20) / 4;
      unsigned value = static_cast<unsigned>(i);
      void* params[] = {&p, &count, &value};
      launch1(f, params);
    });
    t.join();
  }
  for (CUdeviceptr b : blocks) CHECK(cuMemFree(b));
  std::printf("threads=%d\n", n);
  return 0;
}

CUfunction g_fill = nullptr;

int exit_in_handler(long usec) {
  g_fill = load_kernel("many_k(8,8,8,8,8,8,8,8)", "many_k");
  std::vector<CUdeviceptr> blocks(64);
  for (CUdeviceptr& b : blocks) CHECK(cuMemAlloc(&b, 2 << 20));
  signal(SIGALRM, [](int) { std::exit(3); });
  itimerval t{};
  t.it_value.tv_sec = usec / 1000000;
  t.it_value.tv_usec = usec % 1000000;
  setitimer(ITIMER_REAL, &t, nullptr);
  CUdeviceptr args[8];
  void* params[8];
  for (int j = 0; j < 8; ++j) params[j] = &args[j];
  for (unsigned i = 0;; ++i) {
    for (int j = 0; j < 8; ++j) args[j] = blocks[(i * 8 + j * 5) % blocks.size()];
    cuLaunchKernel(g_fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
  }
}

int fork_child() {
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    init_context();
    CUfunction f = load_kernel("fill_u32(8,8,4)", "fill_u32");
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 1 << 20));
    unsigned long long count = 16;
    for (unsigned i = 0; i < 5; ++i) {
      void* params[] = {&p, &count, &i};
      launch1(f, params);
    }
    CHECK(cuMemFree(p));
    std::exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  std::printf("child=%d\n", static_cast<int>(pid));
  return 0;
}

int race_frees(int nthreads, int n) {
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  CUfunction add = load_kernel("add_u32(8,8,8,8)", "add_u32");
  CUdeviceptr shared = 0;
  CHECK(cuMemAlloc(&shared, 4 << 20));
  std::atomic<long> launches{0};
  auto worker = [&](int t) {
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < n; ++i) {
      CUdeviceptr a = 0, b = 0;
      CHECK(cuMemAlloc(&a, (2 + t % 3) << 20));
      CHECK(cuMemAllocAsync(&b, 1 << 20, s));
      unsigned long long count = 1024;
      CUdeviceptr half = shared + ((i + t) % 2) * (2 << 20);
      void* p1[] = {&a, &half, &b, &count};
      CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s, p1, nullptr));
      CHECK(cuMemFree(a));
      void* p2[] = {&b, &half, &b, &count};
      CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s, p2, nullptr));
      CHECK(cuMemFreeAsync(b, s));
      launches.fetch_add(2);
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy(s));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  CHECK(cuMemFree(shared));
  std::printf("launches=%ld\n", launches.load());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  long arg = argc > 2 ? std::atol(argv[2]) : 0;
  if (mode == "fork_child") return fork_child();
  init_context();
  if (mode == "reload") return reload(argc > 2 && std::string(argv[2]) == "library");
  if (mode == "extra_buffer") return extra_buffer();
  if (mode == "bad_stream") return bad_stream();
  if (mode == "double_free") return double_free(static_cast<int>(arg));
  if (mode == "churn") return churn(static_cast<int>(arg));
  if (mode == "exit_in_handler") return exit_in_handler(arg);
  if (mode == "race_frees") return race_frees(static_cast<int>(arg), argc > 3 ? std::atoi(argv[3]) : 100);
  return 2;
}
