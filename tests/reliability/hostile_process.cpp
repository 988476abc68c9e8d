// hostile_process MODE [ARGS]: correct driver-API programs that do to their own threads and
// process image what an adversarial user does (thread cancellation, a late dlopen of the
// shim, exec, a program-chosen memory pool). Written with no knowledge of Spillway; each runs
// exactly as it runs without the shim, exits 0 on success and prints what it checked.
//   cancel_in_hook ROUNDS  each round: a thread launches a kernel on its block in a loop and
//                          is cancelled (pthread_cancel, deferred) after a few hundred µs;
//                          the main thread joins it, then allocates, writes and reads back a
//                          block and launches on it. Prints "cancelled=N".
//   dlopen_late LIB        loads the driver, then dlopen()s LIB and calls its cuMemAlloc_v2,
//                          cuMemFree_v2 and cuMemGetInfo_v2. Prints "alloc=RC free=RC info=RC".
//   exec_child             allocates, launches, frees, then execv()s itself as `exec_after`,
//                          which does the same again. Prints "exec_after=done" (from the new
//                          image).
//   program_pool           creates a pool of its own, makes it the device's current pool
//                          (cuDeviceSetMemPool), then allocates with cuMemAllocAsync: the
//                          block must come from that pool (cuPointerGetAttribute
//                          CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE). Prints "from_pool=0|1".
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "../programs/common.h"

namespace {

void fill(CUfunction f, CUdeviceptr p, size_t bytes, unsigned value) { fill(f, nullptr, p, bytes, value); }

void check_block(CUfunction f, size_t bytes, unsigned value) {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, bytes));
  fill(f, p, bytes, value);
  CHECK(cuCtxSynchronize());
  unsigned first = 0, last = 0;
  CHECK(cuMemcpyDtoH(&first, p, 4));
  CHECK(cuMemcpyDtoH(&last, p + bytes - 4, 4));
  if (first != value || last != value) {
    std::fprintf(stderr, "block at %#llx does not hold %u\n", (unsigned long long)p, value);
    std::exit(1);
  }
  CHECK(cuMemFree(p));
}

struct Launcher {
  CUcontext ctx;
  CUfunction f;
  CUdeviceptr block;
  std::atomic<bool> running{false};
};

void* launch_forever(void* arg) {
  auto* l = static_cast<Launcher*>(arg);
  CHECK(cuCtxSetCurrent(l->ctx));
  for (unsigned i = 0;; ++i) {
    l->running.store(true);
    fill(l->f, l->block, 1 << 20, i);
    pthread_testcancel();
  }
  return nullptr;
}

int cancel_in_hook(int rounds) {
  Launcher l{};
  CHECK(cuCtxGetCurrent(&l.ctx));
  l.f = load_fill();
  CHECK(cuMemAlloc(&l.block, 1 << 20));
  int cancelled = 0;
  for (int i = 0; i < rounds; ++i) {
    l.running.store(false);
    pthread_t t;
    if (pthread_create(&t, nullptr, launch_forever, &l) != 0) return 2;
    while (!l.running.load()) std::this_thread::yield();
    usleep(100 + 37 * (i % 11));
    pthread_cancel(t);
    void* result = nullptr;
    pthread_join(t, &result);
    cancelled += result == PTHREAD_CANCELED;
    check_block(l.f, 3 << 20, 0xc0de0000u + i);  // nothing the cancelled thread held is left held
  }
  CHECK(cuCtxSynchronize());
  CHECK(cuMemFree(l.block));
  std::printf("cancelled=%d\n", cancelled);
  return cancelled == rounds ? 0 : 1;
}

int dlopen_late(const char* lib) {
  void* handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
    return 2;
  }
  using Alloc = CUresult (*)(CUdeviceptr*, size_t);
  using Free = CUresult (*)(CUdeviceptr);
  using Info = CUresult (*)(size_t*, size_t*);
  auto alloc = reinterpret_cast<Alloc>(dlsym(handle, "cuMemAlloc_v2"));
  auto free_fn = reinterpret_cast<Free>(dlsym(handle, "cuMemFree_v2"));
  auto info = reinterpret_cast<Info>(dlsym(handle, "cuMemGetInfo_v2"));
  if (alloc == nullptr || free_fn == nullptr || info == nullptr) return 2;
  CUdeviceptr p = 0;
  CUresult a = alloc(&p, 4 << 20);
  if (a == CUDA_SUCCESS) touch(p, 4 << 20);
  CUresult f = a == CUDA_SUCCESS ? free_fn(p) : CUDA_ERROR_INVALID_VALUE;
  size_t free_bytes = 0, total = 0;
  CUresult n = info(&free_bytes, &total);
  std::printf("alloc=%d free=%d info=%d\n", a, f, n);
  return a == CUDA_SUCCESS && f == CUDA_SUCCESS && n == CUDA_SUCCESS ? 0 : 1;
}

int use_cuda_once(unsigned value) {
  CUfunction f = load_fill();
  check_block(f, 4 << 20, value);
  return 0;
}

int exec_child(const char* self) {
  use_cuda_once(1);
  std::fflush(stdout);
  char* args[] = {const_cast<char*>(self), const_cast<char*>("exec_after"), nullptr};
  execv("/proc/self/exe", args);
  std::perror("execv");
  return 1;
}

int program_pool() {
  CUdevice dev = 0;
  CHECK(cuCtxGetDevice(&dev));
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool pool = nullptr;
  CHECK(cuMemPoolCreate(&pool, &props));
  CHECK(cuDeviceSetMemPool(dev, pool));
  CUdeviceptr p = 0;
  CHECK(cuMemAllocAsync(&p, 4 << 20, nullptr));
  CUmemoryPool from = nullptr;
  CHECK(cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
  CHECK(cuMemFreeAsync(p, nullptr));
  CHECK(cuCtxSynchronize());
  CUmemoryPool def = nullptr;
  CHECK(cuDeviceGetDefaultMemPool(&def, dev));
  CHECK(cuDeviceSetMemPool(dev, def));
  CHECK(cuMemPoolDestroy(pool));
  std::printf("from_pool=%d\n", from == pool);
  return from == pool ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "dlopen_late") {
    // The driver first, as a program that links libcuda would have it; the shim after.
    CHECK(cuInit(0));
    init_context();
    return dlopen_late(argc > 2 ? argv[2] : "libspillway.so");
  }
  init_context();
  if (mode == "cancel_in_hook") return cancel_in_hook(argc > 2 ? std::atoi(argv[2]) : 20);
  if (mode == "exec_child") return exec_child(argv[0]);
  if (mode == "exec_after") {
    use_cuda_once(2);
    std::printf("exec_after=done\n");
    return 0;
  }
  if (mode == "program_pool") return program_pool();
  return 2;
}
