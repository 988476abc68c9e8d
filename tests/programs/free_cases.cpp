// free_cases CASE: frees that are not a plain free of a live device allocation.
//   double     cuMemAlloc, cuMemFree, cuMemFree again: the second free must fail
//   host       cuMemFree on a cuMemHostAlloc pointer (an error), then cuMemFreeHost
//   unknown    cuMemFree on an address nobody allocated
// Prints "first=RC second=RC" (the CUresults).
#include "common.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string c = argv[1];
  init_context();
  if (c == "double") {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 1 << 20));
    CUresult first = cuMemFree(p);
    CUresult second = cuMemFree(p);
    std::printf("first=%d second=%d\n", first, second);
    return first == CUDA_SUCCESS && second != CUDA_SUCCESS ? 0 : 1;
  }
  if (c == "host") {
    void* h = nullptr;
    CHECK(cuMemHostAlloc(&h, 1 << 20, 0));
    std::printf("host=%p\n", h);
    CUresult first = cuMemFree(reinterpret_cast<CUdeviceptr>(h));
    CUresult second = cuMemFreeHost(h);
    std::printf("first=%d second=%d\n", first, second);
    return first != CUDA_SUCCESS && second == CUDA_SUCCESS ? 0 : 1;
  }
  if (c == "unknown") {
    CUresult first = cuMemFree(0x1234000);
    std::printf("first=%d\n", first);
    return first != CUDA_SUCCESS ? 0 : 1;
  }
  return 2;
}
