// alloc_paths PATH [--expect-managed=N]: allocates 1 MiB of device memory through one
// allocation path of the driver API, writes and reads it, prints whether the driver says
// it is managed (CU_POINTER_ATTRIBUTE_IS_MANAGED) and frees it.
#include <dlfcn.h>

#include "common.h"

CUresult alloc_async_per_thread(CUdeviceptr* p, size_t bytes, CUstream s);
CUresult free_async_per_thread(CUdeviceptr p, CUstream s);
CUresult sync_per_thread(CUstream s);

namespace {

constexpr size_t kBytes = 1 << 20;
using AllocFn = CUresult (*)(CUdeviceptr*, size_t);
using AllocAsyncFn = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using GetProcFn = decltype(&cuGetProcAddress_v2);

void* lookup(const char* name, int version, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  CHECK(cuGetProcAddress(name, &fn, version, flags, &status));
  if (status != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {
    std::fprintf(stderr, "cuGetProcAddress(%s, %d) found nothing\n", name, version);
    std::exit(1);
  }
  return fn;
}

int finish_sync(CUdeviceptr p, int expect) {
  touch(p, kBytes);
  unsigned m = is_managed(p);
  CHECK(cuMemFree(p));
  return report_managed(m, expect);
}

int finish_async(CUdeviceptr p, CUstream s, int expect) {
  CHECK(cuStreamSynchronize(s));
  touch(p, kBytes);
  unsigned m = is_managed(p);
  CHECK(cuMemFreeAsync(p, s));
  CHECK(cuStreamSynchronize(s));
  return report_managed(m, expect);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: alloc_paths PATH [--expect-managed=N]\n");
    return 2;
  }
  std::string path = argv[1];
  int expect = expected_managed(argc, argv);
  init_context();
  CUdeviceptr p = 0;
  if (path == "cuMemAlloc") {
    CHECK(cuMemAlloc(&p, kBytes));  // cuda.h: cuMemAlloc_v2
    return finish_sync(p, expect);
  }
  if (path == "cuMemAllocPitch") {
    size_t pitch = 0;
    const size_t width = 1000, height = 300;
    CHECK(cuMemAllocPitch(&p, &pitch, width, height, 4));
    std::printf("pitch=%zu\n", pitch);
    if (pitch < width || pitch % 512 != 0) {
      std::fprintf(stderr, "pitch %zu is not a multiple of 512 at least %zu\n", pitch, width);
      return 1;
    }
    CHECK(cuMemsetD32(p, 7, pitch * height / 4));
    unsigned m = is_managed(p);
    CHECK(cuMemFree(p));
    return report_managed(m, expect);
  }
  if (path == "cuMemAllocAsync") {
    CUstream s = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAllocAsync(&p, kBytes, s));
    return finish_async(p, s, expect);
  }
  if (path == "cuMemAllocAsync_ptsz") {
    CHECK(alloc_async_per_thread(&p, kBytes, CU_STREAM_PER_THREAD));
    CHECK(sync_per_thread(CU_STREAM_PER_THREAD));
    touch(p, kBytes);
    unsigned m = is_managed(p);
    CHECK(free_async_per_thread(p, CU_STREAM_PER_THREAD));
    CHECK(sync_per_thread(CU_STREAM_PER_THREAD));
    return report_managed(m, expect);
  }
  if (path == "default_pool") {
    CUmemoryPool pool = nullptr;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0));
    CUstream s = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAllocFromPoolAsync(&p, kBytes, pool, s));
    return finish_async(p, s, expect);
  }
  if (path == "created_pool") {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool = nullptr;
    CHECK(cuMemPoolCreate(&pool, &props));
    CUstream s = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAllocFromPoolAsync(&p, kBytes, pool, s));
    int r = finish_async(p, s, expect);
    CHECK(cuMemPoolDestroy(pool));
    return r;
  }
  if (path == "dlsym") {  // as Triton, Numba and XLA do
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return 1;
    auto alloc = reinterpret_cast<AllocFn>(dlsym(h, "cuMemAlloc_v2"));
    if (alloc == nullptr) return 1;
    CHECK(alloc(&p, kBytes));
    return finish_sync(p, expect);
  }
  if (path == "getproc3020" || path == "getproc12000") {
    int version = path == "getproc3020" ? 3020 : 12000;
    auto alloc = reinterpret_cast<AllocFn>(lookup("cuMemAlloc", version));
    CHECK(alloc(&p, kBytes));
    return finish_sync(p, expect);
  }
  if (path == "getproc_self") {  // the CUDA 13 runtime's bootstrap
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return 1;
    auto boot = reinterpret_cast<GetProcFn>(dlsym(h, "cuGetProcAddress_v2"));
    if (boot == nullptr) return 1;
    void* self = nullptr;
    CUdriverProcAddressQueryResult status{};
    CHECK(boot("cuGetProcAddress", &self, 13000, 0, &status));
    auto gpa = reinterpret_cast<GetProcFn>(self);
    void* fn = nullptr;
    CHECK(gpa("cuMemAlloc", &fn, 13000, 0, &status));
    CHECK(reinterpret_cast<AllocFn>(fn)(&p, kBytes));
    return finish_sync(p, expect);
  }
  if (path == "getproc_per_thread") {
    auto alloc = reinterpret_cast<AllocAsyncFn>(
        lookup("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
    CHECK(alloc(&p, kBytes, CU_STREAM_PER_THREAD));
    return finish_async(p, CU_STREAM_PER_THREAD, expect);
  }
  std::fprintf(stderr, "unknown path %s\n", path.c_str());
  return 2;
}
