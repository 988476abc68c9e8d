// Compiled with CUDA_API_PER_THREAD_DEFAULT_STREAM: cuda.h maps the stream-ordered calls
// to their per-thread-default-stream symbols (cuMemAllocAsync_ptsz, cuMemFreeAsync_ptsz),
// as nvcc --default-stream per-thread does.
#include <cuda.h>

CUresult alloc_async_per_thread(CUdeviceptr* p, size_t bytes, CUstream s) { return cuMemAllocAsync(p, bytes, s); }
CUresult free_async_per_thread(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
CUresult sync_per_thread(CUstream s) { return cuStreamSynchronize(s); }
