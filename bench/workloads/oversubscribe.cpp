// spillway-oversubscribe: a plain driver-API program, written with no knowledge of
// Spillway, that allocates more device memory than the GPU has, fills every block on the
// GPU (cuMemsetD32) and reads samples back. Without Spillway it stops at the first
// CUDA_ERROR_OUT_OF_MEMORY; under `spillway run` every block is managed memory and the
// program completes.
//
//   spillway-oversubscribe [--total BYTES] [--block BYTES] [--passes N]
// Defaults: total = twice the GPU's memory, at most 12 GiB; block = 64 MiB; passes = 0.
// --passes N then runs N passes over the blocks in order, each a kernel (fill_u32) per
// block writing the pass's value, as a training loop walks its layers: a pattern a
// prefetching policy can learn. The kernel is PTX for sm_75, JIT-compiled by the driver for
// any GPU CUDA 13 supports; on the fake driver of tests/fakecuda, whose modules are text
// descriptions, the same kernel is loaded by its description.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fill_ptx.h"

namespace {

#define CHECK(call)                                                                    \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* name_ = nullptr;                                                     \
      cuGetErrorName(r_, &name_);                                                      \
      std::fprintf(stderr, "oversubscribe: %s failed: %s\n", #call, name_ ? name_ : "?"); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

unsigned long long parse_bytes(const char* text) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  std::string unit = end ? end : "";
  double f = unit.empty() || unit == "B" ? 1 : unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0 : unit == "GiB" ? 1073741824.0 : -1;
  if (v <= 0 || f < 0) {
    std::fprintf(stderr, "oversubscribe: cannot read size '%s' (use e.g. 512MiB, 2GiB)\n", text);
    std::exit(2);
  }
  return static_cast<unsigned long long>(v * f);
}

double gib(unsigned long long b) { return static_cast<double>(b) / (1ull << 30); }

const char* kFakeImage = "fill_u32(8,8,4)";  // tests/fakecuda's module description

}  // namespace

int main(int argc, char** argv) {
  unsigned long long total = 0, block = 64ull << 20;
  long passes = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--total") && i + 1 < argc) total = parse_bytes(argv[++i]);
    else if (!std::strcmp(argv[i], "--block") && i + 1 < argc) block = parse_bytes(argv[++i]);
    else if (!std::strcmp(argv[i], "--passes") && i + 1 < argc && (passes = std::strtol(argv[i + 1], nullptr, 10)) >= 0) ++i;
    else {
      std::fprintf(stderr, "usage: %s [--total BYTES] [--block BYTES] [--passes N]\n", argv[0]);
      return 2;
    }
  }
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  size_t free_b = 0, total_b = 0;
  CHECK(cuMemGetInfo(&free_b, &total_b));
  if (total == 0) total = std::min<unsigned long long>(2ull * total_b, 12ull << 30);
  std::printf("GPU memory %.2f GiB (%.2f GiB free); allocating %.2f GiB in %.0f MiB blocks\n", gib(total_b), gib(free_b),
              gib(total), block / 1048576.0);

  std::vector<CUdeviceptr> blocks;
  unsigned long long done = 0;
  int managed = 0;
  while (done < total) {
    unsigned long long n = std::min(block, total - done);
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, n);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      cuGetErrorName(r, &name);
      std::printf("cuMemAlloc failed after %.2f of %.2f GiB: %s\n", gib(done), gib(total), name ? name : "?");
      for (CUdeviceptr b : blocks) cuMemFree(b);
      return 1;
    }
    unsigned int is_managed = 0;
    if (cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS && is_managed) ++managed;
    CHECK(cuMemsetD32(p, static_cast<unsigned int>(blocks.size() + 1), n / 4));
    blocks.push_back(p);
    done += n;
  }
  CHECK(cuCtxSynchronize());
  // The passes: block i holds (i + 1) + 1000 * pass after pass `pass`.
  if (passes > 0) {
    CUmodule module = nullptr;
    const std::string ptx = spillway::bench::fill_u32_module("sm_75");
    CUresult loaded = cuModuleLoadData(&module, ptx.c_str());
    if (loaded != CUDA_SUCCESS && cuModuleLoadData(&module, kFakeImage) != CUDA_SUCCESS) {
      const char* name = nullptr;
      cuGetErrorName(loaded, &name);
      std::fprintf(stderr, "oversubscribe: the driver cannot load the fill_u32 kernel (PTX for sm_75): %s\n",
                   name ? name : "?");
      return 1;
    }
    CUfunction fill = nullptr;
    CHECK(cuModuleGetFunction(&fill, module, "fill_u32"));
    for (long pass = 1; pass <= passes; ++pass) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        CUdeviceptr p = blocks[i];
        unsigned long long count = std::min(block, total - i * block) / 4;
        unsigned value = static_cast<unsigned>(i + 1 + 1000 * pass);
        void* params[] = {&p, &count, &value};
        CHECK(cuLaunchKernel(fill, 1024, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
      }
    }
    CHECK(cuCtxSynchronize());
    std::printf("%ld passes of %zu kernels, one per block\n", passes, blocks.size());
  }
  // Read back the first and the last word of every block.
  for (size_t i = 0; i < blocks.size(); ++i) {
    unsigned long long n = std::min(block, total - i * block);
    unsigned int first = 0, last = 0;
    CHECK(cuMemcpyDtoH(&first, blocks[i], 4));
    CHECK(cuMemcpyDtoH(&last, blocks[i] + n / 4 * 4 - 4, 4));
    const unsigned want = static_cast<unsigned>(i + 1 + 1000 * passes);
    if (first != want || last != want) {
      std::printf("block %zu holds %u/%u, expected %u: data lost\n", i, first, last, want);
      return 1;
    }
  }
  for (CUdeviceptr b : blocks) CHECK(cuMemFree(b));
  std::printf("OK: %.2f GiB (%.1fx the GPU's memory) in %zu blocks, %d of them managed; every block verified\n", gib(total),
              static_cast<double>(total) / static_cast<double>(total_b), blocks.size(), managed);
  return 0;
}
