// RT_CHECK(call): runs a CUDA runtime call; on an error prints "FILE:LINE: call failed: N
// name" and exits 1. For the test programs that use the runtime API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define RT_CHECK(call)                                                                        \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__, #call, (int)e_,   \
                   cudaGetErrorString(e_));                                                   \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
