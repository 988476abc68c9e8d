// runtime_alloc PATH [--expect-managed=N]: the CUDA runtime's allocation calls.
//   cudaMalloc | cudaMallocPitch | cudaMallocAsync | entry_point   allocate 1 MiB, write it,
//       print "managed=N" (cudaPointerGetAttributes type == cudaMemoryTypeManaged), free it
//   sizes S1 S2 ...   cudaMalloc each size, keeping them; prints "malloc SIZE -> ERR"
//   meminfo           cudaMemGetInfo: "free=F total=T"
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime_check.h"


namespace {

unsigned managed(void* p) {
  cudaPointerAttributes attr{};
  RT_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeManaged;
}

void touch(void* p, size_t bytes) {
  RT_CHECK(cudaMemset(p, 0x5a, bytes));
  unsigned char first = 0, last = 0;
  RT_CHECK(cudaMemcpy(&first, p, 1, cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(&last, static_cast<char*>(p) + bytes - 1, 1, cudaMemcpyDeviceToHost));
  if (first != 0x5a || last != 0x5a) {
    std::fprintf(stderr, "memory does not hold what was written\n");
    std::exit(1);
  }
}

int report(unsigned m, int argc, char** argv) {
  std::printf("managed=%u\n", m);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--expect-managed=", 17) == 0 && std::atoi(argv[i] + 17) != static_cast<int>(m)) {
      std::fprintf(stderr, "expected %s\n", argv[i]);
      return 3;
    }
  }
  return 0;
}

size_t parse_bytes(const char* s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  if (*end == 'G') v <<= 30;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string path = argv[1];
  const size_t kBytes = 1 << 20;
  void* p = nullptr;
  RT_CHECK(cudaSetDevice(0));
  if (path == "cudaMalloc") {
    RT_CHECK(cudaMalloc(&p, kBytes));
    touch(p, kBytes);
    unsigned m = managed(p);
    RT_CHECK(cudaFree(p));
    return report(m, argc, argv);
  }
  if (path == "cudaMallocPitch") {
    size_t pitch = 0;
    RT_CHECK(cudaMallocPitch(&p, &pitch, 1000, 300));
    std::printf("pitch=%zu\n", pitch);
    if (pitch < 1000 || pitch % 512 != 0) return 1;
    touch(p, pitch * 300);
    unsigned m = managed(p);
    RT_CHECK(cudaFree(p));
    return report(m, argc, argv);
  }
  if (path == "cudaMallocAsync") {
    cudaStream_t s = nullptr;
    RT_CHECK(cudaStreamCreate(&s));
    RT_CHECK(cudaMallocAsync(&p, kBytes, s));
    RT_CHECK(cudaStreamSynchronize(s));
    touch(p, kBytes);
    unsigned m = managed(p);
    RT_CHECK(cudaFreeAsync(p, s));
    RT_CHECK(cudaStreamSynchronize(s));
    RT_CHECK(cudaStreamDestroy(s));
    return report(m, argc, argv);
  }
  if (path == "entry_point") {  // as PyTorch fetches driver calls
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    RT_CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &status));
    CUdeviceptr d = 0;
    if (fn == nullptr || reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(fn)(&d, kBytes) != CUDA_SUCCESS) return 1;
    p = reinterpret_cast<void*>(d);
    touch(p, kBytes);
    unsigned m = managed(p);
    RT_CHECK(cudaFree(p));
    return report(m, argc, argv);
  }
  if (path == "meminfo") {  // "free=F total=T" from cudaMemGetInfo
    size_t free = 0, total = 0;
    RT_CHECK(cudaMemGetInfo(&free, &total));
    std::printf("free=%zu total=%zu\n", free, total);
    return 0;
  }
  if (path == "sizes") {
    std::vector<void*> got;
    for (int i = 2; i < argc; ++i) {
      void* q = nullptr;
      cudaError_t e = cudaMalloc(&q, parse_bytes(argv[i]));
      std::printf("malloc %s -> %d\n", argv[i], (int)e);
      if (e == cudaSuccess) got.push_back(q);
    }
    for (void* q : got) RT_CHECK(cudaFree(q));
    return 0;
  }
  return 2;
}
