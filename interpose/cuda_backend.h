// CudaBackend: the Engine's Backend over the real driver, through the REAL() pointers.
#pragma once

#include <atomic>

#include "shim.h"
#include "spillway/backend.h"

namespace spillway::interpose {

// Thread-safe. Every call runs inside a ShimCallScope; calls that CUDA forbids during a
// global-mode stream capture on another thread (allocation, free, event queries) run under
// cuThreadExchangeStreamCaptureMode(RELAXED) when they stem from stream-ordered calls.
class CudaBackend final : public Backend {
 public:
  Result memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override;
  std::uint64_t host_memory_bytes() override;
  bool concurrent_managed_access() override;
  int current_device() override;
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override;
  Result free_managed(std::uint64_t addr) override;
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) override;
  Result advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int device) override;
  bool is_capturing(StreamHandle stream) override;
  Result record_event(StreamHandle stream, EventHandle* event) override;
  Result event_done(EventHandle event) override;
  void destroy_event(EventHandle event) override;
  Result wait_event(EventHandle event) override;

  // Whether the calling thread has a current context (cuCtxGetDevice succeeds).
  bool has_current_context();

 private:
  CUstream prefetch_stream();
  std::atomic<CUstream> prefetch_stream_{nullptr};
};

CudaBackend& backend_instance();

// Switches the calling thread to relaxed stream-capture mode for its lifetime, so the
// shim's own calls cannot invalidate a capture in progress (CUDA Programming Guide,
// "Cross-stream Dependencies and Events" / cuThreadExchangeStreamCaptureMode).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  CUstreamCaptureMode previous_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool swapped_ = false;
};

}  // namespace spillway::interpose
