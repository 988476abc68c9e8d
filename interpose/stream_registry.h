// The program's streams and contexts as the shim sees them, and the fences recorded on them
// (CudaBackend::record_fence). Not a public interface.
//
// A fence must cover all work the GPU may still do on a range before the shim reuses it, so
// the registry knows: the contexts the program allocated or launched in (the legacy default
// stream is per context: CUDA Programming Guide, "Default Stream"), every stream it created
// and whether work was issued to it since its last fence event, the tails of work that can no
// longer be fenced on its own stream (a destroyed stream's: its work still runs, cuStreamDestroy;
// work issued before a capture began), the captures that keep a legacy stream from use, and
// the streams that launched kernels lately (an eviction orders itself after their work).
//
// Lock order (take them in this order, never the other way):
//   1. the registry lock: lock_launch_streams(), held by the capture-begin hooks across the
//      real call, by a fence while it records, by an eviction while it orders itself after
//      the recent launching streams;
//   2. CudaBackend's own-streams lock (forget_context -> CudaBackend::forget_streams_of), and
//      before it CudaBackend's evictions lock (a prefetch toward the GPU asks for the host
//      stream, own_stream), which is never taken with the registry lock held;
//   3. the capture registry's lock (capture_registry.h: begun under the capture-begin hooks);
//   4. the contexts lock, then the fence-events lock (leaves);
//   5. the ordering-events pool (cuda_backend.cpp; a leaf).
#pragma once

#include <cuda.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace spillway::interpose {

// ---- the hooks' calls (each thread-safe) --------------------------------------------------

// The program destroys `stream`: evictions stop ordering themselves after it, fences stop
// recording on it, and an event recorded after its work so far is included in every fence
// until it completes (a destroyed stream's work still runs: cuStreamDestroy, CUDA Driver
// API). Call before the real cuStreamDestroy.
void forget_launch_stream(CUstream stream);
// The program created `stream` with `flags` (cuStreamCreate, cuStreamCreateWithPriority): a
// non-blocking one is fenced on its own (CudaBackend::record_fence), a blocking one while a
// capture keeps its context's legacy stream from use.
void note_stream_created(CUstream stream, unsigned flags);
// Work was issued to `stream` in the current context (a launch, a copy, a memset; call after
// the driver accepted it): the context is fenced from now on, and the stream at the next
// fence. A fence records an event only on the streams that had work since their last one.
void note_stream_work(CUstream stream);
// The same, when the calling thread's current context was registered earlier in this hook
// call (the launch hooks ask Backend::current_context_and_device before the launch, and a
// launch in a context cannot change the thread's context; a thread with none then asks
// note_stream_work instead): no second cuCtxGetCurrent.
void note_stream_work_in_noted_context(CUstream stream);
// Stream capture (the capture-begin hooks, holding lock_launch_streams()): before the real
// call, events after the work issued so far to `stream` and, for a blocking stream, to its
// context's legacy stream join every fence until they complete (neither may be used while the
// capture runs); after a successful call, the capture is registered until
// note_capture_ended(stream) (cuStreamEndCapture, whatever its result).
void note_capture_beginning_locked(CUstream stream);
void note_capture_begun_locked(CUstream stream);
void note_capture_ended(CUstream stream);
// The program is about to destroy `ctx` (cuCtxDestroy, cuDevicePrimaryCtxReset) or has just
// released a primary context for the last time: fences stop recording in it, and the shim's
// streams and events there are forgotten (only its own: other contexts on its device keep
// theirs).
void forget_context(CUcontext ctx);
// The registry lock (lock order, 1).
std::unique_lock<std::mutex> lock_launch_streams();

// ---- CudaBackend's calls ------------------------------------------------------------------

// Registers the calling thread's current context (a thread-local cache makes a repeat cheap).
void note_current_context();
// The same for `ctx`, the calling thread's current context as just read (nullptr: nothing):
// CudaBackend::current_context, which the Engine asks while it allocates, so a context
// allocated in (a carved block makes no driver call) is fenced from then on (docs/multi-gpu.md).
// Returns its device (cuCtxGetDevice, asked once per context and thread until a context is
// forgotten), -1 when the driver does not say or ctx is nullptr.
int note_context(CUcontext ctx);
// A kernel is being launched on `stream` (LaunchOrderScope; the caller has registered the
// current context, CudaBackend::current_context_and_device): it is one of the recent
// launching streams an eviction orders itself after.
void note_launch_stream(CUstream stream);
// Calls `order(waiter, s)` for each stream that launched within the last few hundred
// launches, but `except`, unless a capture is in progress anywhere (an event recorded on a
// capturing stream would make `waiter` join its capture). Under the registry lock: no capture
// begins and no registered stream is destroyed meanwhile.
void order_after_recent_launches(CUstream waiter, CUstream except, bool (*order)(CUstream waiter, CUstream after));

// One recorded fence event, shared by the fences that include it and by what it stands for
// (a stream's last fence event, a destroyed stream's tail), back to the registry's pool when
// the last holder lets go (unless its context was forgotten meanwhile: its events went with
// it). `done`: seen complete (it stays so: it is never recorded again while held).
struct FenceEvent {
  FenceEvent(CUcontext c, CUevent e) : ctx(c), event(e) {}
  ~FenceEvent();
  FenceEvent(const FenceEvent&) = delete;
  FenceEvent& operator=(const FenceEvent&) = delete;
  const CUcontext ctx;
  const CUevent event;
  std::atomic<bool> done{false};
};
using FenceEventPtr = std::shared_ptr<FenceEvent>;

// A fence (Backend::record_fence): the events it waits for, all complete once it is.
struct FenceRecord {
  std::vector<FenceEventPtr> events;
};

// An event recorded on `stream` of the current context `ctx` now; null (and *r the error)
// when none could be.
FenceEventPtr record_on(CUcontext ctx, CUstream stream, CUresult* r);
// Adds to `rec` every registered context's work, `current` (the current context) first: each
// context's legacy stream (or, while a capture keeps it from use, its blocking streams one by
// one), its streams with work since their last fence, the shim's own streams there, and the
// tails. A context no longer active is skipped; any other failure is returned (the fence is
// tried again later: a live context's work is never left out). Takes the registry lock.
CUresult fence_all(CUcontext current, FenceRecord& rec);
// The fence events pooled for `ctx`, forgotten (its events are destroyed with it).
void forget_fence_events(CUcontext ctx);

}  // namespace spillway::interpose
