// Helpers for the test programs: ordinary CUDA driver-API code with no knowledge of
// Spillway. Each program checks what it can itself, prints a short result on stdout and
// exits non-zero on failure, so the same programs run against the fake driver and a GPU.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    CUresult check_r_ = (call);                                                              \
    if (check_r_ != CUDA_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, (int)check_r_); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

inline CUcontext init_context() {
  CHECK(cuInit(0));
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

// CU_POINTER_ATTRIBUTE_IS_MANAGED, read into a zeroed 8-byte buffer (drivers write a bool
// or an unsigned int).
inline unsigned is_managed(CUdeviceptr p) {
  unsigned long long v = 0;
  CHECK(cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
  return v != 0;
}

// Writes a pattern into [p, p + bytes) and reads the first and last word back.
inline void touch(CUdeviceptr p, size_t bytes, unsigned pattern = 0x5a5a1234u) {
  CHECK(cuMemsetD32(p, pattern, bytes / 4));
  unsigned first = 0, last = 0;
  CHECK(cuMemcpyDtoH(&first, p, 4));
  CHECK(cuMemcpyDtoH(&last, p + (bytes / 4 - 1) * 4, 4));
  if (first != pattern || last != pattern) {
    std::fprintf(stderr, "memory at %#llx does not hold what was written\n", (unsigned long long)p);
    std::exit(1);
  }
}

// Checks that the 32-bit word at p holds `want`; exits 1 saying where, if not.
inline void expect_word(CUdeviceptr p, unsigned want) {
  unsigned got = 0;
  CHECK(cuMemcpyDtoH(&got, p, 4));
  if (got != want) {
    std::fprintf(stderr, "at %#llx: %u, expected %u\n", (unsigned long long)p, got, want);
    std::exit(1);
  }
}

// "--expect-managed=N" among the arguments: -1 if absent.
inline int expected_managed(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--expect-managed=", 17) == 0) return std::atoi(argv[i] + 17);
  }
  return -1;
}

// Prints "managed=N" and checks it against --expect-managed.
inline int report_managed(unsigned managed, int expect) {
  std::printf("managed=%u\n", managed);
  if (expect >= 0 && static_cast<unsigned>(expect) != managed) {
    std::fprintf(stderr, "expected managed=%d\n", expect);
    return 3;
  }
  return 0;
}

// Parses "48M", "4096", "1G" (binary units) for the allocation-size arguments.
inline size_t parse_bytes(const char* s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  if (*end == 'G') v <<= 30;
  return v;
}

// The fake driver's fill kernel (tests/fakecuda: a module image names its kernels and their
// parameter sizes): fill_u32(pointer, count, value) writes `value` to `count` 32-bit words.
inline CUfunction load_fill() {
  CUmodule module = nullptr;
  CHECK(cuModuleLoadData(&module, "fill_u32(8,8,4)"));
  CUfunction f = nullptr;
  CHECK(cuModuleGetFunction(&f, module, "fill_u32"));
  return f;
}

// Fills `bytes` at `p` with `value` on stream `s` (one launch of fill_u32).
inline void fill(CUfunction f, CUstream s, CUdeviceptr p, size_t bytes, unsigned value) {
  unsigned long long count = bytes / 4;
  void* params[] = {&p, &count, &value};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
}
