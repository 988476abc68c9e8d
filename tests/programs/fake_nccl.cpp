// libnccl-spillway-test.so: stands in for NCCL, whose buffers stay ordinary device memory
// (its file name holds "libnccl", which SPILLWAY_EXCLUDE excludes by default). It exports
// NCCL's own allocation calls (ncclMemAlloc/ncclMemFree, NCCL 2.19's nccl.h; the real ones
// return ncclResult_t, 0 for success) over cuMemAlloc/cuMemFree.
#include <cuda.h>

extern "C" __attribute__((visibility("default"))) __attribute__((noinline)) int ncclMemAlloc(void** ptr, size_t size) {
  CUdeviceptr p = 0;
  CUresult r = cuMemAlloc(&p, size);
  // Work after the call keeps this frame on the stack during cuMemAlloc (no tail call).
  *ptr = r == CUDA_SUCCESS ? reinterpret_cast<void*>(p) : nullptr;
  return r == CUDA_SUCCESS ? 0 : 1;
}

extern "C" __attribute__((visibility("default"))) __attribute__((noinline)) int ncclMemFree(void* ptr) {
  CUresult r = cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
  return r == CUDA_SUCCESS ? 0 : 1;
}
