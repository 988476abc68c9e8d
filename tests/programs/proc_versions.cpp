// proc_versions: asks cuGetProcAddress for entry points at several CUDA versions and checks
// that each answer is exactly the ABI of that version: the same function dlsym gives for
// the versioned symbol name (cuMemAlloc@2000 is the 32-bit v1 cuMemAlloc, @3020 cuMemAlloc_v2;
// cuMemAdvise@8000 is the v1 cuMemAdvise(..., CUdevice), @12020 cuMemAdvise_v2(...,
// CUmemLocation)). Prints "base@version[/ptsz] symbol object" per lookup.
#include <dlfcn.h>

#include "common.h"

namespace {

struct Lookup {
  const char* base;
  int version;
  bool per_thread;
  const char* symbol;  // the exact versioned symbol this must be
};

const Lookup kLookups[] = {
    {"cuMemAlloc", 2000, false, "cuMemAlloc"},
    {"cuMemAlloc", 3020, false, "cuMemAlloc_v2"},
    {"cuMemAlloc", 13000, false, "cuMemAlloc_v2"},
    {"cuMemFree", 2000, false, "cuMemFree"},
    {"cuMemFree", 3020, false, "cuMemFree_v2"},
    {"cuMemGetInfo", 2000, false, "cuMemGetInfo"},
    {"cuMemGetInfo", 3020, false, "cuMemGetInfo_v2"},
    {"cuMemAdvise", 8000, false, "cuMemAdvise"},
    {"cuMemAdvise", 12020, false, "cuMemAdvise_v2"},
    {"cuMemPrefetchAsync", 8000, false, "cuMemPrefetchAsync"},
    {"cuMemPrefetchAsync", 12020, false, "cuMemPrefetchAsync_v2"},
    {"cuMemPrefetchAsync", 12020, true, "cuMemPrefetchAsync_v2_ptsz"},
    {"cuMemAllocAsync", 11020, false, "cuMemAllocAsync"},
    {"cuMemAllocAsync", 11020, true, "cuMemAllocAsync_ptsz"},
    {"cuMemFreeAsync", 11020, true, "cuMemFreeAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 12000, true, "cuMemAllocFromPoolAsync_ptsz"},
    {"cuLaunchKernel", 4000, true, "cuLaunchKernel_ptsz"},
    {"cuGetProcAddress", 11030, false, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, false, "cuGetProcAddress_v2"},
};

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

int main() {
  CHECK(cuInit(0));
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 1;
  int failures = 0;
  for (const Lookup& l : kLookups) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    cuuint64_t flags = l.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    CHECK(cuGetProcAddress(l.base, &fn, l.version, flags, &status));
    void* by_name = dlsym(h, l.symbol);
    Dl_info info{};
    const char* object = dladdr(fn, &info) != 0 && info.dli_fname ? basename_of(info.dli_fname) : "?";
    std::printf("%s@%d%s %s %s\n", l.base, l.version, l.per_thread ? "/ptsz" : "", l.symbol, object);
    if (fn == nullptr || fn != by_name) {
      std::fprintf(stderr, "%s@%d%s is not %s\n", l.base, l.version, l.per_thread ? "/ptsz" : "", l.symbol);
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
