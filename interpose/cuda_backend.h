// CudaBackend: the Engine's Backend over the real driver, through the REAL() pointers. The
// program's streams and contexts and the fences on them: stream_registry.h (with the lock
// order); stream captures and graphs: capture_registry.h.
#pragma once

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "shim.h"
#include "spillway/backend.h"
#include "stream_registry.h"  // the hooks' stream calls

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
  std::uint64_t current_context() override;
  ContextAndDevice current_context_and_device() override;
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override;
  Result free_managed(std::uint64_t addr) override;
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) override;
  // Whether the driver has cuMemPrefetchBatchAsync (resolved at run time; CUDA 13.0) and has
  // not refused a batch yet.
  bool can_batch_prefetches() override;
  // Several ranges in one cuMemPrefetchBatchAsync, ordered as prefetch() orders its calls. A
  // refused batch is returned as the driver's error, logged once at info, and no batch is
  // tried again (can_batch_prefetches() turns false). Without the entry point: one
  // prefetch() per range.
  Result prefetch_batch(const std::uint64_t* addrs, const std::uint64_t* bytes, std::size_t count, Location to,
                        int device) override;
  Result advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int device) override;
  Result capture_status(StreamHandle stream, bool* capturing) override;
  Result record_event(StreamHandle stream, EventHandle* event) override;
  Result event_done(EventHandle event) override;
  void destroy_event(EventHandle event) override;
  Result wait_event(EventHandle event) override;
  bool supports_fences() override { return true; }
  Result record_fence(const std::uint64_t* discard_addr, const std::uint64_t* discard_bytes, std::size_t count,
                      EventHandle* fence) override;
  Result fence_done(EventHandle fence) override;
  Result wait_fence(EventHandle fence) override;
  void release_fence(EventHandle fence) override;
  // (cuEventSynchronize has no timeout: these poll cuEventQuery until `timeout`.)
  Result wait_fence_for(EventHandle fence, std::chrono::milliseconds timeout) override;
  Result wait_event_for(EventHandle event, std::chrono::milliseconds timeout) override;
  bool held_by_capture(std::uint64_t addr, std::uint64_t bytes) override;
  // Fault feedback through CUPTI (cupti_feedback.h): started by the launch hook
  // (start_fault_feedback(), outside the Engine's lock), drained by the Engine.
  bool fault_feedback() override;
  std::size_t take_faults(std::vector<FaultRecord>& out) override;
  std::string fault_feedback_state() override;
  std::string framework_trace_state() override;
  void migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) override;
  void begin_launch(std::uint64_t seq) override;
  void end_launch() override;
  // Starts CUPTI once for the calling thread's device; true when feedback is on.
  bool start_fault_feedback();

  // Whether the calling thread has a current context (cuCtxGetDevice succeeds).
  bool has_current_context();

  // The shim's own streams in `ctx` (record_fence); forgets them when `ctx` is destroyed.
  std::vector<CUstream> own_streams_of(CUcontext ctx);
  void forget_streams_of(CUcontext ctx);

  static constexpr int kMaxDevices = 64;

 private:
  // The shim's own streams, per device: one toward the GPU, one toward the host (created
  // lazily in the first context current on that device that moves data, non-blocking, never
  // destroyed by the shim: the driver may be unloading at exit; a context's destruction takes
  // them). A stream belongs to one context and an event recorded on it must be of that
  // context (Driver API, cuEventRecord), so each device has its own.
  struct OwnStreams {
    std::atomic<CUstream> to_gpu{nullptr};
    std::atomic<CUstream> to_host{nullptr};
    std::atomic<CUcontext> context{nullptr};
  };
  CUstream own_stream(Location to, int device);  // nullptr: none (none can be made now)
  void order_after_evictions(CUstream to_gpu, int device);  // (prefetch(), prefetch_batch())
  std::array<OwnStreams, kMaxDevices> own_;
  std::mutex own_mutex_;  // creating or forgetting them
};

// Set by a launch hook around Engine::launch on the calling thread: the program's stream
// the launch goes to (never a capturing one: the hook does not call the Engine then). While
// it is set, CudaBackend::prefetch orders the shim's streams after the program's work:
//  - the first eviction (toward the host) of the launch makes the host stream wait for an
//    event recorded on the launching stream, and — while no capture is in progress — on
//    every other stream that launched kernels among the last 256 launches (other threads'
//    streams; not the per-thread default stream, which names another stream on each
//    thread), so chunks are not moved away under kernels issued before this launch that may
//    still use them. (Streams destroyed with the context rather than cuStreamDestroy stay
//    registered; like the shim's own streams, they assume the context lives on.);
//  - the first prefetch toward the GPU after evictions (by any thread) makes the GPU stream
//    wait for an event recorded on the host stream, so room is made before data arrives
//    (the budget).
// Kernels planned by other threads but not yet issued are protected by their pins instead
// (Engine::launch_in_flight).
// The launching stream itself never waits for the shim's streams: a kernel that runs before
// its prefetch completes faults and the driver migrates on demand, which is always correct.
// The caller has registered the thread's current context (current_context_and_device).
class LaunchOrderScope {
 public:
  explicit LaunchOrderScope(CUstream launch_stream);
  ~LaunchOrderScope();
  LaunchOrderScope(const LaunchOrderScope&) = delete;
  LaunchOrderScope& operator=(const LaunchOrderScope&) = delete;
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
