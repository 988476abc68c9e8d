// limits MODE: the limits that keep the host alive. Ordinary driver code.
//   fill GIB      allocates GIB-GiB blocks (never touched) until the driver (or the shim)
//                 refuses; prints "blocks=N bytes=B refused=CODE", frees them all
//   footprint N   heap in use by the process (mallinfo2) after init, with N 4 KiB blocks
//                 live, and after freeing them: "heap_init=A heap_live=B heap_after=C"
#include <cuda.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return 2;
  std::vector<CUdeviceptr> blocks;
  if (mode == "fill") {
    size_t step = static_cast<size_t>(argc > 2 ? std::atol(argv[2]) : 1) << 30;
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < 4096; ++i) {
      CUdeviceptr p = 0;
      r = cuMemAlloc(&p, step);
      if (r != CUDA_SUCCESS) break;
      blocks.push_back(p);
    }
    std::printf("blocks=%zu bytes=%zu refused=%d\n", blocks.size(), blocks.size() * step, static_cast<int>(r));
    int bad = 0;
    for (CUdeviceptr p : blocks) bad += cuMemFree(p) != CUDA_SUCCESS;
    return bad ? 1 : 0;
  }
  if (mode == "footprint") {
    long n = argc > 2 ? std::atol(argv[2]) : 100000;
    blocks.reserve(n);
    CUdeviceptr warm = 0;
    if (cuMemAlloc(&warm, 4096) != CUDA_SUCCESS || cuMemFree(warm) != CUDA_SUCCESS) return 1;
    size_t init = mallinfo2().uordblks;
    for (long i = 0; i < n; ++i) {
      CUdeviceptr p = 0;
      if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS) return 1;
      blocks.push_back(p);
    }
    size_t live = mallinfo2().uordblks;
    for (CUdeviceptr p : blocks) {
      if (cuMemFree(p) != CUDA_SUCCESS) return 1;
    }
    size_t after = mallinfo2().uordblks;
    std::printf("heap_init=%zu heap_live=%zu heap_after=%zu\n", init, live, after);
    return 0;
  }
  return 2;
}
