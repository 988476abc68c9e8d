// Measuring the shim side by side with the driver it wraps, in one process: the fake
// driver's own functions are taken before libspillway.so is loaded (dlopen, local), so a
// "direct" call never passes through the shim; the shim's exports come from its own handle.
// Any failure here ends the benchmark program with one line naming what is missing.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace spillway::bench {

// `name` from `handle`, or exit(1) with a message.
template <typename T>
T must(void* handle, const char* name) {
  void* p = dlsym(handle, name);
  if (p == nullptr) {
    std::fprintf(stderr, "spillway bench: %s not found: %s\n", name, dlerror());
    std::exit(1);
  }
  return reinterpret_cast<T>(p);
}

// Loads libcuda.so.1 (the fake, through LD_LIBRARY_PATH), initialises it and makes the
// primary context current on the calling thread. Returns the driver's handle.
inline void* open_driver() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "spillway bench: cannot load libcuda.so.1 (run with LD_LIBRARY_PATH=build/fakecuda): %s\n",
                 dlerror());
    std::exit(1);
  }
  auto init = must<CUresult (*)(unsigned)>(driver, "cuInit");
  auto retain = must<CUresult (*)(CUcontext*, CUdevice)>(driver, "cuDevicePrimaryCtxRetain");
  auto set_current = must<CUresult (*)(CUcontext)>(driver, "cuCtxSetCurrent");
  CUcontext ctx = nullptr;
  if (init(0) != CUDA_SUCCESS || retain(&ctx, 0) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS) {
    std::fprintf(stderr, "spillway bench: driver initialisation failed\n");
    std::exit(1);
  }
  return driver;
}

// Loads libspillway.so from `path` (after the driver's functions were taken), or from
// SPILLWAY_BENCH_SHIM when it is set: another commit's shim, measured by the same benchmark
// against the same fake driver (bench/README.md's side-by-side tables).
inline void* open_shim(const char* path) {
  if (const char* other = std::getenv("SPILLWAY_BENCH_SHIM"); other != nullptr && *other != '\0') path = other;
  void* shim = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (shim == nullptr) {
    std::fprintf(stderr, "spillway bench: cannot load %s: %s\n", path, dlerror());
    std::exit(1);
  }
  return shim;
}

}  // namespace spillway::bench
