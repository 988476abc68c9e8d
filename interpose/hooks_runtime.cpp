// Hook bodies for the shared CUDA runtime (libcudart.so) rows of hooks.def.
//
// The runtime reaches the driver through cuGetProcAddress, which the shim already answers,
// so each runtime hook calls the real runtime function (keeping its context set-up, error
// state and stream semantics) and only marks the allocation's family; the driver hook it
// leads to does the redirecting. If a runtime allocation ever succeeds without reaching a
// driver hook, the shim says so once: that would be an allocation path it does not see.
#include <atomic>

#include "shim.h"
#include "spillway/log.h"

namespace spillway::hook {

using interpose::real;

namespace {

// An allocation of 0 bytes succeeds with a NULL pointer without reaching the driver (the
// runtime's documented answer): nothing was allocated, nothing to say. The warning is given
// once per API, so one API's warning never hides another's.
enum class RuntimeApi { malloc, pitch, async, count };
cudaError_t checked(cudaError_t r, void** ptr, const interpose::RuntimeAllocScope& scope, RuntimeApi api) {
  static std::atomic<bool> warned[static_cast<int>(RuntimeApi::count)] = {};
  static constexpr const char* kNames[] = {"cudaMalloc", "cudaMallocPitch", "cudaMallocAsync"};
  if (r != cudaSuccess || ptr == nullptr || *ptr == nullptr || scope.driver_hook_ran()) return r;
  if (!warned[static_cast<int>(api)].exchange(true)) {
    log(LogLevel::warn, "{} allocated without reaching the driver through the shim; that memory stays device memory",
        kNames[static_cast<int>(api)]);
  }
  return r;
}

void substitute_out(cudaError_t r, void** fn) {
  if (r == cudaSuccess && fn != nullptr) *fn = interpose::substitute(*fn);
}

}  // namespace

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  interpose::RuntimeAllocScope scope(AllocKind::runtime);
  return checked(real().cudaMalloc(devPtr, size), devPtr, scope, RuntimeApi::malloc);
}

cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  interpose::RuntimeAllocScope scope(AllocKind::runtime_pitch);
  return checked(real().cudaMallocPitch(devPtr, pitch, width, height), devPtr, scope, RuntimeApi::pitch);
}

cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  interpose::RuntimeAllocScope scope(AllocKind::runtime_async);
  return checked(real().cudaMallocAsync(devPtr, size, hStream), devPtr, scope, RuntimeApi::async);
}

cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  interpose::RuntimeAllocScope scope(AllocKind::runtime_async);
  return checked(real().cudaMallocAsync_ptsz(devPtr, size, hStream), devPtr, scope, RuntimeApi::async);
}

cudaError_t cudaFree(void* devPtr) { return real().cudaFree(devPtr); }

cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) { return real().cudaFreeAsync(devPtr, hStream); }

cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  return real().cudaFreeAsync_ptsz(devPtr, hStream);
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) { return real().cudaMemGetInfo(free, total); }

// PyTorch fetches driver calls (its VMM allocator's cuMemCreate/cuMemMap, ...) this way.
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    cudaDriverEntryPointQueryResult* driverStatus) {
  interpose::ensure_driver();
  cudaError_t r = real().cudaGetDriverEntryPoint(symbol, funcPtr, flags, driverStatus);
  substitute_out(r, funcPtr);
  return r;
}

cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                         cudaDriverEntryPointQueryResult* driverStatus) {
  interpose::ensure_driver();
  cudaError_t r = real().cudaGetDriverEntryPoint_ptsz(symbol, funcPtr, flags, driverStatus);
  substitute_out(r, funcPtr);
  return r;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult* driverStatus) {
  interpose::ensure_driver();
  cudaError_t r = real().cudaGetDriverEntryPointByVersion(symbol, funcPtr, cudaVersion, flags, driverStatus);
  substitute_out(r, funcPtr);
  return r;
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                  unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* driverStatus) {
  interpose::ensure_driver();
  cudaError_t r = real().cudaGetDriverEntryPointByVersion_ptsz(symbol, funcPtr, cudaVersion, flags, driverStatus);
  substitute_out(r, funcPtr);
  return r;
}

}  // namespace spillway::hook
