// excluded LIBRARY: dlopens LIBRARY (libspillway_excluded_test.so, as frameworks dlopen
// NCCL), makes one allocation inside it and one in the program itself; prints
// "library=M program=M" (IS_MANAGED of each), then frees both with cuMemFree.
#include <dlfcn.h>

#include "common.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  init_context();
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  auto lib_alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(dlsym(h, "excluded_test_alloc"));
  if (lib_alloc == nullptr) return 1;
  CUdeviceptr lib = 0, own = 0;
  CHECK(lib_alloc(&lib, 1 << 20));
  CHECK(cuMemAlloc(&own, 1 << 20));
  touch(lib, 1 << 20);
  touch(own, 1 << 20);
  std::printf("library=%u program=%u\n", is_managed(lib), is_managed(own));
  CUresult f1 = cuMemFree(lib);
  CUresult f2 = cuMemFree(own);
  std::printf("free_library=%d free_program=%d\n", f1, f2);
  return f1 == CUDA_SUCCESS && f2 == CUDA_SUCCESS ? 0 : 1;
}
