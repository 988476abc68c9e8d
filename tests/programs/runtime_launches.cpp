// runtime_launches: kernel launches through the CUDA runtime (cudaLaunchKernel,
// cudaLaunchKernelExC and their _ptsz forms), as nvcc-generated host code makes them: `func`
// is the kernel's host stub. The fake runtime ties each stub to one of the fake driver's
// kernels (fakecudart_register_stub, standing for __cudaRegisterFunction); the kernels come
// from a text image loaded through a driver entry point the runtime hands out.
//   runtime_launches [--unresolvable]
// Allocates A (4 MiB), B (6 MiB), C (1 MiB) with cudaMalloc, prints A=, B=, C=, then:
//   1. cudaLaunchKernel(fill_u32, A, n, 5)
//   2. cudaLaunchKernelExC(add_u32, C, A, A, n)              (C = 10)
//   3. cudaLaunchKernel_ptsz(fill_u32, B, n, 3)
//   4. cudaLaunchKernelExC_ptsz(struct_k, {n, B + 2 MiB, 7})  (a pointer inside a by-value struct)
// checks C and B, prints "ok". --unresolvable registers the stubs so that
// cudaGetFuncBySymbol fails for them (the launches still run).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fakecuda.h"
#include "runtime_check.h"

// The per-thread-default-stream forms, as a translation unit compiled with
// --default-stream per-thread calls them.
extern "C" cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                             size_t sharedMem, cudaStream_t stream);
extern "C" cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void** args);


namespace {

struct Pair {
  unsigned long long count;
  void* inner;
  unsigned long long seven;
};

// Host stubs: what nvcc generates for __global__ functions of these signatures.
void fill_u32(unsigned*, unsigned long long, unsigned) {}
void add_u32(unsigned*, const unsigned*, const unsigned*, unsigned long long) {}
void struct_k(Pair) {}

const void* stub(void (*f)(unsigned*, unsigned long long, unsigned)) { return reinterpret_cast<const void*>(f); }

CUfunction kernel(CUmodule m, const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  RT_CHECK(cudaGetDriverEntryPointByVersion("cuModuleGetFunction", &fn, 12000, cudaEnableDefault, &status));
  CUfunction f = nullptr;
  if (!fn || reinterpret_cast<decltype(&cuModuleGetFunction)>(fn)(&f, m, name) != CUDA_SUCCESS) {
    std::fprintf(stderr, "no kernel %s\n", name);
    std::exit(1);
  }
  return f;
}

unsigned word(const void* p) {
  unsigned v = 0;
  RT_CHECK(cudaMemcpy(&v, p, 4, cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bool unresolvable = argc > 1 && std::strcmp(argv[1], "--unresolvable") == 0;
  RT_CHECK(cudaSetDevice(0));
  void* load = nullptr;
  cudaDriverEntryPointQueryResult status{};
  RT_CHECK(cudaGetDriverEntryPointByVersion("cuModuleLoadData", &load, 12000, cudaEnableDefault, &status));
  CUmodule m = nullptr;
  if (!load || reinterpret_cast<decltype(&cuModuleLoadData)>(load)(&m, "fill_u32(8,8,4);add_u32(8,8,8,8);struct_k(24)") !=
                   CUDA_SUCCESS) {
    std::fprintf(stderr, "cannot load the kernels (a fake driver is needed)\n");
    return 1;
  }
  int resolvable = unresolvable ? 0 : 1;
  fakecudart_register_stub(stub(fill_u32), kernel(m, "fill_u32"), resolvable);
  fakecudart_register_stub(reinterpret_cast<const void*>(add_u32), kernel(m, "add_u32"), resolvable);
  fakecudart_register_stub(reinterpret_cast<const void*>(struct_k), kernel(m, "struct_k"), resolvable);

  void *a = nullptr, *b = nullptr, *c = nullptr;
  RT_CHECK(cudaMalloc(&a, 4 << 20));
  RT_CHECK(cudaMalloc(&b, 6 << 20));
  RT_CHECK(cudaMalloc(&c, 1 << 20));
  std::printf("A=%p B=%p C=%p\n", a, b, c);
  unsigned long long n = (1 << 20) / 4;

  unsigned five = 5;
  void* fill_args[] = {&a, &n, &five};
  RT_CHECK(cudaLaunchKernel(stub(fill_u32), dim3(1), dim3(32), fill_args, 0, nullptr));

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  void* add_args[] = {&c, &a, &a, &n};
  RT_CHECK(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(add_u32), add_args));

  unsigned three = 3;
  void* fill_b[] = {&b, &n, &three};
  RT_CHECK(cudaLaunchKernel_ptsz(stub(fill_u32), dim3(1), dim3(32), fill_b, 0, nullptr));

  Pair s{n, static_cast<char*>(b) + (2 << 20), 7};
  void* struct_args[] = {&s};
  RT_CHECK(cudaLaunchKernelExC_ptsz(&config, reinterpret_cast<const void*>(struct_k), struct_args));

  RT_CHECK(cudaDeviceSynchronize());
  if (word(c) != 10 || word(static_cast<char*>(c) + (n - 1) * 4) != 10 || word(b) != 3) {
    std::fprintf(stderr, "wrong data\n");
    return 1;
  }
  RT_CHECK(cudaFree(a));
  RT_CHECK(cudaFree(b));
  RT_CHECK(cudaFree(c));
  std::printf("ok\n");
  return 0;
}
