// libspillway_excluded_test.so: a library that allocates device memory itself, standing in
// for NCCL (whose buffers must stay IPC-shareable device memory).
#include <cuda.h>

extern "C" __attribute__((visibility("default"))) __attribute__((noinline)) CUresult
excluded_test_alloc(CUdeviceptr* p, size_t bytes) {
  CUresult r = cuMemAlloc(p, bytes);
  // Work after the call keeps this frame on the stack during cuMemAlloc (no tail call).
  if (r != CUDA_SUCCESS) *p = 0;
  return r;
}
