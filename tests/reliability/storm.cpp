// storm LIVE THREADS OPS: LIVE blocks are allocated and tagged up front; then THREADS threads
// each run OPS mixed operations against them at once: allocate+write+read+free a block of their
// own, launch a kernel (fake "fill_u32") on one of their blocks and check its result, replace
// one of the LIVE blocks they own (free, allocate, re-tag), query a random live block's
// attributes (any thread's: readers race writers), and resolve entry points through dlsym on
// the libcuda handle and cuGetProcAddress (must always give the same pointer). Finally every
// LIVE block is checked and freed. Prints "allocs=A frees=F launches=L lookups=Q failures=X";
// exits 0 only with no failure. Written with no knowledge of Spillway.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {
std::atomic<long> g_allocs{0}, g_frees{0}, g_launches{0}, g_lookups{0}, g_failures{0};

void fail(const char* what, long detail) {
  if (g_failures.fetch_add(1) < 10) std::fprintf(stderr, "failure: %s (%ld)\n", what, detail);
}

constexpr size_t kBlock = 4096;

bool tag(CUdeviceptr p, unsigned long long value) {
  return cuMemcpyHtoD(p, &value, sizeof value) == CUDA_SUCCESS;
}
bool has_tag(CUdeviceptr p, unsigned long long value) {
  unsigned long long v = 0;
  return cuMemcpyDtoH(&v, p, sizeof v) == CUDA_SUCCESS && v == value;
}
}  // namespace

int main(int argc, char** argv) {
  long live_n = argc > 1 ? std::atol(argv[1]) : 100000;
  int nthreads = argc > 2 ? std::atoi(argv[2]) : 16;
  long ops = argc > 3 ? std::atol(argv[3]) : 2000;
  if (cuInit(0) != CUDA_SUCCESS) return 2;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return 2;
  CUmodule module = nullptr;
  CUfunction fill = nullptr;
  if (cuModuleLoadData(&module, "fill_u32(8,4,4)") != CUDA_SUCCESS ||
      cuModuleGetFunction(&fill, module, "fill_u32") != CUDA_SUCCESS)
    return 2;
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (libcuda == nullptr) return 2;
  void* alloc_by_dlsym = dlsym(libcuda, "cuMemAlloc_v2");
  void* alloc_by_proc = nullptr;
  if (cuGetProcAddress("cuMemAlloc", &alloc_by_proc, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) != CUDA_SUCCESS)
    return 2;

  // Slot i holds tag (i << 20) | generation; slots with i % nthreads == t belong to thread t.
  std::vector<CUdeviceptr> slot(live_n);
  std::vector<unsigned long long> slot_tag(live_n);
  std::vector<std::atomic<CUdeviceptr>> published(live_n);  // what other threads may query
  for (long i = 0; i < live_n; ++i) {
    if (cuMemAlloc(&slot[i], kBlock) != CUDA_SUCCESS) return 3;
    ++g_allocs;
    slot_tag[i] = static_cast<unsigned long long>(i) << 20;
    if (!tag(slot[i], slot_tag[i])) fail("tag", i);
    published[i].store(slot[i]);
  }

  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) fail("ctx", t);
      unsigned x = 2654435761u * static_cast<unsigned>(t + 1);
      auto next = [&x] { return x = x * 1664525u + 1013904223u; };
      CUdeviceptr mine = 0;
      if (cuMemAlloc(&mine, 1 << 16) != CUDA_SUCCESS) fail("alloc own", t);
      else ++g_allocs;
      for (long op = 0; op < ops; ++op) {
        switch (next() % 5) {
          case 0: {  // a short-lived block
            CUdeviceptr p = 0;
            size_t bytes = 256u << (next() % 8);
            if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) { fail("alloc", op); break; }
            ++g_allocs;
            if (!tag(p, op) || !has_tag(p, op)) fail("short-lived block", op);
            if (cuMemFree(p) != CUDA_SUCCESS) fail("free", op);
            else ++g_frees;
            break;
          }
          case 1: {  // a launch on the thread's own block
            unsigned count = (1 << 16) / 4, value = static_cast<unsigned>(op * 16 + t);
            void* params[] = {&mine, &count, &value};
            unsigned last = 0;
            if (cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS ||
                cuMemcpyDtoH(&last, mine + (1 << 16) - 4, 4) != CUDA_SUCCESS || last != value)
              fail("launch", op);
            ++g_launches;
            break;
          }
          case 2: {  // replace one of the thread's live blocks
            long owned = (live_n - t + nthreads - 1) / nthreads;
            if (owned <= 0) break;
            long i = t + static_cast<long>(next() % owned) * nthreads;
            if (!has_tag(slot[i], slot_tag[i])) fail("live block lost its tag", i);
            CUdeviceptr p = 0;
            if (cuMemAlloc(&p, kBlock) != CUDA_SUCCESS) { fail("realloc", i); break; }
            ++g_allocs;
            slot_tag[i] = (static_cast<unsigned long long>(i) << 20) | ((slot_tag[i] + 1) & 0xfffff);
            if (!tag(p, slot_tag[i])) fail("tag", i);
            CUdeviceptr old = slot[i];
            slot[i] = p;
            published[i].store(p);
            if (cuMemFree(old) != CUDA_SUCCESS) fail("free live", i);
            else ++g_frees;
            break;
          }
          case 3: {  // query any live block (it may be freed by its owner meanwhile)
            long i = static_cast<long>(next() % static_cast<unsigned>(live_n));
            CUdeviceptr p = published[i].load();
            unsigned long long managed = 0;
            CUresult r = cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p);
            if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) fail("pointer attribute", r);
            if (i % nthreads == t && (r != CUDA_SUCCESS || managed > 1)) fail("own pointer attribute", i);
            break;
          }
          case 4: {  // entry points
            void* a = dlsym(libcuda, "cuMemAlloc_v2");
            void* b = nullptr;
            cuGetProcAddress("cuMemAlloc", &b, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
            void* c = dlsym(libcuda, "cudnnCreate");  // a cu* name libcuda does not have
            if (a != alloc_by_dlsym || b != alloc_by_proc || c != nullptr) fail("lookup", op);
            g_lookups += 3;
            break;
          }
        }
      }
      if (mine != 0 && cuMemFree(mine) == CUDA_SUCCESS) ++g_frees;
    });
  }
  for (auto& th : threads) th.join();

  long lost = 0;
  for (long i = 0; i < live_n; ++i) {
    unsigned long long managed = 0;
    if (!has_tag(slot[i], slot_tag[i])) ++lost;
    if (cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, slot[i]) != CUDA_SUCCESS) ++lost;
    if (cuMemFree(slot[i]) != CUDA_SUCCESS) ++lost;
    else ++g_frees;
  }
  if (lost) fail("blocks lost", lost);
  std::printf("allocs=%ld frees=%ld launches=%ld lookups=%ld failures=%ld\n", g_allocs.load(), g_frees.load(),
              g_launches.load(), g_lookups.load(), g_failures.load());
  return g_failures == 0 && g_allocs == g_frees ? 0 : 1;
}
