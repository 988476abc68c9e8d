// async_free: a kernel writes a stream-ordered allocation, the program frees it with
// cuMemFreeAsync, keeps allocating, and only then synchronizes the stream. Prints
// "A=..." and "synchronized" right before the cuStreamSynchronize.
#include "common.h"

int main() {
  init_context();
  CUmodule mod = nullptr;
  // fakecuda's text image: a kernel named fill_u32(ptr, count, value); a real GPU would need PTX.
  CHECK(cuModuleLoadData(&mod, "fill_u32(8,8,4)"));
  CUfunction fill = nullptr;
  CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t count = (1 << 20) / 4;
  CUdeviceptr a = 0;
  CHECK(cuMemAllocAsync(&a, count * 4, s));
  unsigned value = 42;
  size_t n = count;
  void* params[] = {&a, &n, &value};
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 128, 1, 1, 0, s, params, nullptr));
  CHECK(cuMemFreeAsync(a, s));
  std::printf("A=%#llx\n", (unsigned long long)a);
  for (int i = 0; i < 3; ++i) {  // unrelated work while the stream is still busy
    CUdeviceptr c = 0;
    CHECK(cuMemAlloc(&c, 4096));
    CHECK(cuMemFree(c));
  }
  std::printf("synchronized\n");
  std::fflush(stdout);
  CHECK(cuStreamSynchronize(s));
  CUdeviceptr c = 0;
  CHECK(cuMemAlloc(&c, 4096));
  CHECK(cuMemFree(c));
  CHECK(cuStreamDestroy(s));
  CHECK(cuModuleUnload(mod));
  return 0;
}
