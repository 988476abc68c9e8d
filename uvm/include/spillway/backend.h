// The world the Engine acts on (docs/design.md): the real driver in the shim (CudaBackend,
// interpose/cuda_backend.h), a simulated GPU in the simulator (sim). The Engine and the
// Policies never call CUDA themselves.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "spillway/types.h"

namespace spillway {

class Backend {
 public:
  virtual ~Backend() = default;

  // GPU memory as the device reports it (cuMemGetInfo), in bytes.
  virtual Result memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) = 0;
  // Host RAM in bytes (the base of SPILLWAY_MAX_MANAGED's percentage).
  virtual std::uint64_t host_memory_bytes() = 0;
  // Whether the device can page managed memory on demand
  // (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS). Where it cannot (WSL2, Windows,
  // pre-Pascal GPUs), managed memory cannot overflow and the shim passes allocations through.
  virtual bool concurrent_managed_access() = 0;
  // The device of the calling thread's current context (where allocations land).
  virtual int current_device() = 0;
  // The calling thread's current context (cuCtxGetCurrent), as an opaque non-zero handle; 0
  // when there is none or the Backend has one context only (the simulator). Managed memory
  // belongs to the context it was allocated in: the driver frees it when that context ends
  // (cuCtxDestroy, "Destroys and cleans up all resources associated with the context";
  // cuDevicePrimaryCtxReset, "Destroy all allocations and reset all state on the primary
  // context"; CUDA Driver API, Context Management and Primary Context Management).
  virtual std::uint64_t current_context() { return 0; }
  // Both at once, as current_context() and current_device() answer them: one question to
  // the driver where a Backend can tell a context's device without asking again (a
  // context's device never changes; CUDA Driver API, cuCtxCreate).
  struct ContextAndDevice {
    std::uint64_t context = 0;
    int device = 0;
  };
  virtual ContextAndDevice current_context_and_device() { return ContextAndDevice{current_context(), current_device()}; }

  // Allocates `bytes` of managed memory attached globally (cuMemAllocManaged with
  // CU_MEM_ATTACH_GLOBAL); stores its address in *addr. Status::out_of_memory when the
  // driver is out of memory.
  virtual Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) = 0;
  // Releases a managed block (cuMemFree). Not stream-ordered: callers wait first.
  virtual Result free_managed(std::uint64_t addr) = 0;
  // Whether the blocks allocate_managed returns are carved from ranges that other blocks
  // share, each range a whole number of 2 MiB chunks inside one managed allocation: the
  // simulator's `spillway` view, which places them as the shim's sub-allocator does
  // (Block::in_shared_range). Not for the real driver: each of its allocations is its own.
  virtual bool blocks_share_ranges() { return false; }
  // Whether `a` and `b` lie in one managed allocation, so that one prefetch may span them
  // (cuMemPrefetchAsync takes a range inside one allocation: CUDA Driver API, "Unified
  // Addressing"). Only asked of a Backend whose blocks share ranges; the simulator's `spillway`
  // view answers with its ranges. Default: no (each block is its own allocation).
  virtual bool same_managed_allocation(std::uint64_t a, std::uint64_t b) {
    (void)a, (void)b;
    return false;
  }

  // Moves [addr, addr+bytes) to `to` on the Backend's own copy stream for that direction
  // (cuMemPrefetchAsync). Asynchronous.
  virtual Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) = 0;
  // Whether prefetch_batch() moves several ranges in one driver call now (the Engine then
  // gathers a plan's fetches; else it issues them one by one). Default: no.
  virtual bool can_batch_prefetches() { return false; }
  // Moves each [addrs[i], addrs[i] + bytes[i]), i < count, to `to` on the same stream as
  // prefetch(), in one driver call (cuMemPrefetchBatchAsync, CUDA 13.0: "the batch as a
  // whole executes in stream order but operations within a batch are not guaranteed to
  // execute in any specific order", CUDA Driver API, "Unified Addressing"), so the ranges must
  // not overlap. Each range lies in one managed allocation, as for prefetch(). Asynchronous.
  // A failure means the batch was refused as a whole: the caller issues the ranges again one
  // by one (a prefetch changes where bytes are, never what they hold, so a part the refused
  // batch may have moved is only moved again). Default: one prefetch() per range, in order,
  // the first failure returned.
  virtual Result prefetch_batch(const std::uint64_t* addrs, const std::uint64_t* bytes, std::size_t count, Location to,
                                int device) {
    Result first{};
    for (std::size_t i = 0; i < count; ++i) {
      Result r = prefetch(addrs[i], bytes[i], to, device);
      if (first.ok() && !r.ok()) first = r;
    }
    return first;
  }
  // Sets or clears advice on [addr, addr+bytes) (cuMemAdvise).
  virtual Result advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int device) = 0;

  // Stream ordering for deferred frees. capture_status: sets *capturing to whether `stream`
  // is being captured into a graph (then nothing may be issued on it; an invalidated capture
  // counts until it ends); an error (a destroyed or unknown stream: the driver's own code in
  // Result::native) leaves *capturing unset and says nothing about the stream's state.
  // record_event: an event that completes when the work issued to `stream` so far
  // completes. event_done: true once it has; Status::not_ready while pending.
  // destroy_event: releases it.
  virtual Result capture_status(StreamHandle stream, bool* capturing) = 0;
  virtual Result record_event(StreamHandle stream, EventHandle* event) = 0;
  virtual Result event_done(EventHandle event) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  // Blocks until `event` completes (used when memory is short and at exit).
  virtual Result wait_event(EventHandle event) = 0;

  // Fences, for the Engine's sub-allocator (sub_allocator.h): a freed range is
  // reused only once every piece of work issued before its free has completed, and the free
  // itself never waits for the device.
  // supports_fences: whether record_fence() can work here (without it the Engine gives each
  // allocation a managed block of its own).
  // record_fence: an ordering point after all the work the program has issued to the devices
  // so far, on every stream (CudaBackend: in every context the program allocated or launched
  // in, an event on its legacy default stream, which follows every blocking stream of that
  // context, and on each non-blocking stream the program created there; CUDA Programming
  // Guide, "Default Stream" and "Implicit Synchronization"). The `count`
  // ranges at `discard` ([addr, addr + bytes), whole dead chunks no work may use any more)
  // are discarded once that work has completed (cuMemDiscardBatchAsync, CUDA 13, where the
  // driver has it: the driver then neither writes them back nor fetches them), and the fence
  // completes after the discards. Status::not_ready: no fence can be recorded now (a stream
  // capture is in progress: the legacy stream may not be used then); try again later.
  // Any other error: none was recorded.
  // fence_done: ok once complete, Status::not_ready while pending; wait_fence blocks until
  // it completes; release_fence frees it (done or not). Thread-safe.
  virtual bool supports_fences() { return false; }
  virtual Result record_fence(const std::uint64_t* discard_addr, const std::uint64_t* discard_bytes, std::size_t count,
                              EventHandle* fence) {
    (void)discard_addr, (void)discard_bytes, (void)count, (void)fence;
    return Result{Status::not_supported, 0};
  }
  virtual Result fence_done(EventHandle fence) { return event_done(fence); }
  virtual Result wait_fence(EventHandle fence) { return wait_event(fence); }
  virtual void release_fence(EventHandle fence) { destroy_event(fence); }
  // wait_fence_for / wait_event_for: as wait_fence / wait_event, giving up after `timeout`
  // (then Status::not_ready): work that never ends (a persistent kernel) must not hold the
  // caller for ever. The defaults wait without bound (Backends whose work always ends).
  virtual Result wait_fence_for(EventHandle fence, std::chrono::milliseconds timeout) {
    (void)timeout;
    return wait_fence(fence);
  }
  virtual Result wait_event_for(EventHandle event, std::chrono::milliseconds timeout) {
    (void)timeout;
    return wait_event(event);
  }
  // held_by_capture: whether [addr, addr + bytes) may still be used by work captured into a
  // CUDA graph by a stream capture in progress (the graph may run it later, whatever fence
  // completes now); a freed range there stays parked until that is no longer so. A capture
  // holds no other range: fences keep working on the streams it does not use. Thread-safe;
  // false by default.
  virtual bool held_by_capture(std::uint64_t addr, std::uint64_t bytes) {
    (void)addr, (void)bytes;
    return false;
  }

  // Fault feedback: the GPU page faults the device took, attributed to
  // launches (CudaBackend: CUPTI's unified-memory activity, interpose/cupti_feedback.h;
  // SimBackend: the chunks each simulated kernel faulted on). fault_feedback: whether records
  // can come now (it may turn false later, e.g. when another CUPTI client takes CUPTI over).
  // take_faults: appends the records that arrived since the last call to `out` and returns
  // how many; never blocks on the device. fault_feedback_state: one word or phrase for the
  // exit report ("cupti", "simulator", "off: <why>"). Thread-safe.
  virtual bool fault_feedback() { return false; }
  virtual std::size_t take_faults(std::vector<FaultRecord>& out) { (void)out; return 0; }
  virtual std::string fault_feedback_state() { return "off: not supported by this backend"; }
  // Whether a framework's allocator reports its tensors to the Engine (Engine::follow_segment
  // and note_tensor_*; the shim: PyTorch's allocator trace, interpose/torch_tracker.h): "off:
  // <why>" when it does not.
  virtual std::string framework_trace_state() { return "off: not supported by this backend"; }
  // Bytes the driver migrated toward the GPU and toward the host since the feedback began, as
  // it reports them (CUPTI: BYTES_TRANSFER_HTOD / _DTOH counters; 0 without feedback).
  virtual void migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) { *to_gpu = 0, *to_host = 0; }
  // The shim's launch hook brackets the kernel's issue with these so that the Backend can
  // attribute the faults the kernel takes to Launch::seq `seq` (CUPTI: an external
  // correlation id pushed on the calling thread). Thread-safe; no-ops by default.
  virtual void begin_launch(std::uint64_t seq) { (void)seq; }
  virtual void end_launch() {}
};

}  // namespace spillway
