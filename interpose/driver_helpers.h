// Small helpers every hook file uses: the stream a _ptsz call names, the clock, and the
// driver entry points the shim uses only where the driver has them. Not a public interface.
#pragma once

#include <cuda.h>

#include <chrono>
#include <cstdint>

#include "shim.h"

namespace spillway::interpose {

// The stream a per-thread-default-stream (_ptsz) call names: its own `s`, or for the null
// stream the calling thread's default stream (CUDA Runtime API, "Stream synchronization
// behavior", per-thread default stream).
inline CUstream per_thread(CUstream s) { return s == nullptr ? CU_STREAM_PER_THREAD : s; }

// Nanoseconds on the steady clock (Launch::now_ns, the CUPTI feedback's timestamps).
inline std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// The driver function `name` as of CUDA `version` (e.g. 12030 for 12.3), through the driver's
// own cuGetProcAddress; nullptr where the driver lacks it (an older driver, the fake driver
// of the tests). Call once and keep the answer (a static): each call asks the driver.
template <typename Fn>
Fn optional_driver_fn(const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  ShimCallScope scope;
  if (real().cuGetProcAddress_v2 == nullptr ||
      real().cuGetProcAddress_v2(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace spillway::interpose
