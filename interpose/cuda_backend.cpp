#include "cuda_backend.h"
#include "capture_registry.h"
#include "stream_registry.h"
#include "cupti_feedback.h"
#include "torch_tracker.h"
#include "spillway/log.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spillway::interpose {
namespace {

Result from_cuda(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return Result{Status::ok, 0};
    case CUDA_ERROR_OUT_OF_MEMORY: return Result{Status::out_of_memory, r};
    case CUDA_ERROR_INVALID_VALUE: return Result{Status::invalid_value, r};
    case CUDA_ERROR_NOT_SUPPORTED: return Result{Status::not_supported, r};
    case CUDA_ERROR_NOT_READY: return Result{Status::not_ready, r};
    default: return Result{Status::error, r};
  }
}

Result missing() { return Result{Status::not_supported, CUDA_ERROR_NOT_INITIALIZED}; }

CUmemLocation location_of(Location where, int device) {
  CUmemLocation loc{};
  if (where == Location::gpu) {
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = device;
  } else {
    loc.type = CU_MEM_LOCATION_TYPE_HOST;
    loc.id = 0;
  }
  return loc;
}

}  // namespace

CUresult to_cuda(const Result& r) {
  if (r.native != 0) return static_cast<CUresult>(r.native);
  switch (r.status) {
    case Status::ok: return CUDA_SUCCESS;
    case Status::out_of_memory: return CUDA_ERROR_OUT_OF_MEMORY;
    case Status::invalid_value: return CUDA_ERROR_INVALID_VALUE;
    case Status::not_supported: return CUDA_ERROR_NOT_SUPPORTED;
    case Status::not_ready: return CUDA_ERROR_NOT_READY;
    case Status::error: return CUDA_ERROR_UNKNOWN;
  }
  return CUDA_ERROR_UNKNOWN;
}

RelaxedCaptureMode::RelaxedCaptureMode() {
  auto fn = real().cuThreadExchangeStreamCaptureMode;
  if (fn != nullptr && fn(&previous_) == CUDA_SUCCESS) swapped_ = true;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (swapped_) real().cuThreadExchangeStreamCaptureMode(&previous_);
}

bool CudaBackend::has_current_context() {
  CUdevice dev = 0;
  ShimCallScope scope;
  return real().cuCtxGetDevice != nullptr && real().cuCtxGetDevice(&dev) == CUDA_SUCCESS;
}

Result CudaBackend::memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) {
  ShimCallScope scope;
  if (real().cuMemGetInfo_v2 == nullptr) return missing();
  size_t f = 0, t = 0;
  CUresult r = real().cuMemGetInfo_v2(&f, &t);
  *free_bytes = f;
  *total_bytes = t;
  return from_cuda(r);
}

std::uint64_t CudaBackend::host_memory_bytes() {
  static const std::uint64_t bytes = read_host_memory_bytes();  // (config.h)
  return bytes;
}

int CudaBackend::current_device() {
  ShimCallScope scope;
  CUdevice dev = 0;
  if (real().cuCtxGetDevice == nullptr || real().cuCtxGetDevice(&dev) != CUDA_SUCCESS) return 0;
  return dev;
}

std::uint64_t CudaBackend::current_context() { return current_context_and_device().context; }

Backend::ContextAndDevice CudaBackend::current_context_and_device() {
  ShimCallScope scope;
  CUcontext ctx = nullptr;
  if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  // (The Engine asks while it allocates in `ctx`: a carved block needs no driver call, so the
  // context is registered here, by note_context, for the fences to cover it.)
  // (No context: current_device()'s answer then, 0. A context whose device the driver did
  // not say: asked again, as current_device() would.)
  const int device = ctx == nullptr ? 0 : note_context(ctx);
  return ContextAndDevice{reinterpret_cast<std::uint64_t>(ctx), device >= 0 ? device : current_device()};
}

bool CudaBackend::concurrent_managed_access() {
  ShimCallScope scope;
  if (real().cuDeviceGetAttribute == nullptr) return false;
  int value = 0;
  CUresult r = real().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, current_device());
  return r == CUDA_SUCCESS && value != 0;
}

Result CudaBackend::allocate_managed(std::uint64_t bytes, std::uint64_t* addr) {
  ShimCallScope scope;
  note_current_context();  // (its work may use the range: fences record there)
  CUdeviceptr p = 0;
  CUresult r = real().cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
  *addr = p;
  return from_cuda(r);
}

Result CudaBackend::free_managed(std::uint64_t addr) {
  ShimCallScope scope;
  return from_cuda(real().cuMemFree_v2(static_cast<CUdeviceptr>(addr)));
}

namespace {

struct LaunchOrder {
  CUstream launch_stream = nullptr;
  bool host_ordered = false;    // the host stream waits for the launching streams' work
};
thread_local LaunchOrder* t_order = nullptr;


// Evictions issued since the GPU stream last waited for the host stream. The shim's
// prefetches are enqueued under its mutex (enqueueing is quick: the copies are
// asynchronous), so that a prefetch toward the GPU is enqueued either before an eviction or
// after a wait that covers it, whichever threads issue them.
// Per device: the shim's host stream is that device's (CudaBackend::own_stream).
std::mutex g_evicted_mutex;
std::array<bool, CudaBackend::kMaxDevices> g_evicted{};  // guarded by g_evicted_mutex

// Events used only for ordering (record + cuStreamWaitEvent; re-recording is legal once the
// wait is enqueued, and the wait keeps the recorded work, so an event can go to another
// thread at once). Each thread takes two from a process-wide pool when it first orders, and
// gives them back when it exits; so a program that runs thousands of short-lived threads
// makes as many events as it has threads at once, not one pair per thread. Never destroyed:
// the driver may be unloading at exit.
// A fixed array: giving events back allocates nothing (a thread may exit inside exit()
// called from a signal handler). Past its size, events are kept by their thread's slot and
// lost with it (never in practice: it holds two per thread alive at once).
constexpr std::size_t kEventPool = 512;
std::mutex g_event_pool_mutex;
std::array<CUevent, kEventPool> g_event_pool{};  // guarded by g_event_pool_mutex
std::size_t g_event_pool_size = 0;               // guarded by g_event_pool_mutex

struct ThreadOrderEvents {
  CUevent events[2] = {nullptr, nullptr};
  bool gone = false;  // given back: a later thread-exit destructor that launches orders nothing
  ~ThreadOrderEvents() {
    gone = true;
    // (try_lock: exit() from a signal handler runs this on a thread that may hold the lock.)
    std::unique_lock lock(g_event_pool_mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;
    for (CUevent& e : events) {
      if (e != nullptr && g_event_pool_size < kEventPool) g_event_pool[g_event_pool_size++] = e;
      e = nullptr;
    }
  }
};
thread_local ThreadOrderEvents t_order_events;

CUevent order_event(int i) {
  if (t_order_events.gone) return nullptr;
  CUevent& slot = t_order_events.events[i];
  if (slot != nullptr) return slot;
  {
    std::lock_guard lock(g_event_pool_mutex);
    if (g_event_pool_size > 0) {
      slot = g_event_pool[--g_event_pool_size];
      return slot;
    }
  }
  CUevent e = nullptr;
  if (real().cuEventCreate != nullptr && real().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) slot = e;
  return slot;
}

// `waiter` waits for the work issued to `after` so far; false when it could not be ordered
// (the thread's ordering events belong to the context they were made in: on another
// context's stream the record fails, and that move goes unordered — never wrong for managed
// memory, only slower; docs/multi-gpu.md).
bool order_after(CUstream waiter, CUstream after, int slot) {
  if (real().cuEventRecord == nullptr || real().cuStreamWaitEvent == nullptr) return false;
  CUevent e = order_event(slot);
  if (e == nullptr) return false;
  return real().cuEventRecord(e, after) == CUDA_SUCCESS && real().cuStreamWaitEvent(waiter, e, 0) == CUDA_SUCCESS;
}

}  // namespace

LaunchOrderScope::LaunchOrderScope(CUstream launch_stream) {
  static thread_local LaunchOrder order;
  order = LaunchOrder{launch_stream, false};
  t_order = &order;
  note_launch_stream(launch_stream);
}

LaunchOrderScope::~LaunchOrderScope() { t_order = nullptr; }


namespace {

// A CUDA 13.0 entry point of the driver, through its own cuGetProcAddress; null where the
// driver has none. (The shim does not hook these: it only calls them.)
void* driver_entry_13(const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (real().cuGetProcAddress_v2 == nullptr ||
      real().cuGetProcAddress_v2(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
      status != CU_GET_PROC_ADDRESS_SUCCESS) {
    return nullptr;
  }
  return p;
}

using DiscardBatchFn = CUresult (*)(CUdeviceptr*, size_t*, size_t, unsigned long long, CUstream);

// cuMemDiscardBatchAsync (CUDA 13.0), resolved once.
DiscardBatchFn discard_batch() {
  static const auto fn = reinterpret_cast<DiscardBatchFn>(driver_entry_13("cuMemDiscardBatchAsync"));
  return fn;
}

}  // namespace


Result CudaBackend::record_fence(const std::uint64_t* discard_addr, const std::uint64_t* discard_bytes, std::size_t count,
                                 EventHandle* fence) {
  ShimCallScope scope;
  if (real().cuEventRecord == nullptr || real().cuEventQuery == nullptr || real().cuStreamWaitEvent == nullptr ||
      real().cuCtxGetCurrent == nullptr) {
    return missing();
  }
  RelaxedCaptureMode relaxed;
  CUcontext current = nullptr;
  if (CUresult r = real().cuCtxGetCurrent(&current); r != CUDA_SUCCESS || current == nullptr) {
    return from_cuda(r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_CONTEXT);
  }
  note_current_context();
  auto record = std::make_unique<FenceRecord>();
  // (Under the registry's lock: no capture begins and no registered stream is destroyed
  // meanwhile. A capture in progress keeps only what it holds from being fenced: its own
  // stream, and the legacy stream of its context; their earlier work is a tail.)
  if (CUresult r = fence_all(current, *record); r != CUDA_SUCCESS) return from_cuda(r);
  const int device = current_device();
  CUstream to_host = own_stream(Location::cpu, device);
  DiscardBatchFn discard = count > 0 && to_host != nullptr ? discard_batch() : nullptr;
  if (discard != nullptr) {
    // The host stream waits for all of it (an event of another context may be waited for:
    // cuStreamWaitEvent), discards, and the fence is its event after that.
    for (const FenceEventPtr& e : record->events) real().cuStreamWaitEvent(to_host, e->event, 0);
    std::vector<CUdeviceptr> ptrs(discard_addr, discard_addr + count);
    std::vector<size_t> sizes(discard_bytes, discard_bytes + count);
    if (discard(ptrs.data(), sizes.data(), count, 0, to_host) == CUDA_SUCCESS) {
      {
        // The next prefetch toward the GPU waits for the host stream, hence for this discard:
        // the room the plan counts is then free on the device too (Engine::carry_out).
        std::lock_guard lock(g_evicted_mutex);
        if (device >= 0 && device < kMaxDevices) g_evicted[static_cast<std::size_t>(device)] = true;
      }
      CUresult r = CUDA_SUCCESS;
      FenceEventPtr after = record_on(current, to_host, &r);
      if (after == nullptr) return from_cuda(r);
      record->events.assign(1, std::move(after));
    }
  }
  *fence = reinterpret_cast<EventHandle>(record.release());
  return Result{};
}

Result CudaBackend::fence_done(EventHandle fence) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  auto* record = reinterpret_cast<FenceRecord*>(fence);
  while (!record->events.empty()) {
    FenceEvent& e = *record->events.back();
    // An event that cannot be queried: a destroyed context's (its work is gone with it), or a
    // driver error. Either way the other events still decide.
    if (!e.done && real().cuEventQuery(e.event) == CUDA_ERROR_NOT_READY) return Result{Status::not_ready, CUDA_ERROR_NOT_READY};
    e.done = true;
    record->events.pop_back();
  }
  return Result{};
}

Result CudaBackend::wait_fence(EventHandle fence) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  auto* record = reinterpret_cast<FenceRecord*>(fence);
  for (const FenceEventPtr& e : record->events) {
    if (!e->done) real().cuEventSynchronize(e->event);  // (an error: a destroyed context's event, as in fence_done)
    e->done = true;
  }
  return Result{};
}

namespace {
// Polls `done` (sleeping 50 µs, doubling up to 10 ms) until it is not not_ready or `timeout`
// has passed.
template <typename Done>
Result poll_until(std::chrono::milliseconds timeout, Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto pause = std::chrono::microseconds(50);; pause = std::min(2 * pause, std::chrono::microseconds(10000))) {
    Result r = done();
    if (r.status != Status::not_ready || std::chrono::steady_clock::now() >= deadline) return r;
    std::this_thread::sleep_for(pause);
  }
}
}  // namespace

Result CudaBackend::wait_fence_for(EventHandle fence, std::chrono::milliseconds timeout) {
  return poll_until(timeout, [&] { return fence_done(fence); });
}

Result CudaBackend::wait_event_for(EventHandle event, std::chrono::milliseconds timeout) {
  return poll_until(timeout, [&] { return event_done(event); });
}

bool CudaBackend::held_by_capture(std::uint64_t addr, std::uint64_t bytes) {
  return capture_registry().used_by_capture(addr, bytes);
}

void CudaBackend::release_fence(EventHandle fence) {
  delete reinterpret_cast<FenceRecord*>(fence);  // (its events go back to the pool with their last holder)
}

CUstream CudaBackend::own_stream(Location to, int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  OwnStreams& own = own_[static_cast<std::size_t>(device)];
  std::atomic<CUstream>& slot = to == Location::gpu ? own.to_gpu : own.to_host;
  CUcontext ctx = nullptr;
  if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return nullptr;
  // (Only the context they were made in may use them: another context on the same device gets
  // none, and its moves are refused, counted in the report.)
  if (CUcontext made_in = own.context.load(std::memory_order_acquire); made_in != nullptr && made_in != ctx) return nullptr;
  CUstream s = slot.load(std::memory_order_acquire);
  if (s != nullptr || real().cuStreamCreate == nullptr) return s;
  if (current_device() != device) return nullptr;  // (made in a context of that device only)
  std::lock_guard lock(own_mutex_);
  if ((s = slot.load(std::memory_order_acquire)) != nullptr) return s;
  // Both of a device's streams belong to one context: the first one current there.
  if (CUcontext was = own.context.load(std::memory_order_acquire); was != nullptr && was != ctx) return nullptr;
  CUstream created = nullptr;
  if (real().cuStreamCreate(&created, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return nullptr;
  own.context.store(ctx, std::memory_order_release);
  slot.store(created, std::memory_order_release);
  return created;
}

std::vector<CUstream> CudaBackend::own_streams_of(CUcontext ctx) {
  std::vector<CUstream> out;
  for (OwnStreams& own : own_) {
    if (own.context.load(std::memory_order_acquire) != ctx) continue;
    for (std::atomic<CUstream>* slot : {&own.to_gpu, &own.to_host}) {
      if (CUstream s = slot->load(std::memory_order_acquire)) out.push_back(s);
    }
  }
  return out;
}

void CudaBackend::forget_streams_of(CUcontext ctx) {
  std::lock_guard lock(own_mutex_);
  for (OwnStreams& own : own_) {
    if (own.context.load(std::memory_order_acquire) != ctx) continue;
    own.to_gpu.store(nullptr, std::memory_order_release);  // (destroyed with their context)
    own.to_host.store(nullptr, std::memory_order_release);
    own.context.store(nullptr, std::memory_order_release);
  }
  forget_fence_events(ctx);
}

Result CudaBackend::prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) {
  ShimCallScope scope;
  if (real().cuMemPrefetchAsync_v2 == nullptr) return missing();
  RelaxedCaptureMode relaxed;
  // (`device`'s own streams, for either direction: the Engine issues a device's moves while
  // it is current — its launches, its allocations.)
  CUstream stream = own_stream(to, device);
  if (stream == nullptr) return missing();
  if (to == Location::cpu) {
    const auto own_slot = static_cast<std::size_t>(device);
    if (LaunchOrder* o = t_order; o != nullptr && !o->host_ordered) {
      order_after(stream, o->launch_stream, 0);
      // Other streams' recent work too, unless a capture is in progress anywhere
      // (stream_registry.h).
      order_after_recent_launches(stream, o->launch_stream, [](CUstream waiter, CUstream after) {
        return order_after(waiter, after, 0);
      });
      o->host_ordered = true;
    }
    std::lock_guard lock(g_evicted_mutex);
    g_evicted[own_slot] = true;
    return from_cuda(real().cuMemPrefetchAsync_v2(addr, bytes, location_of(to, device), 0, stream));
  }
  std::lock_guard lock(g_evicted_mutex);
  order_after_evictions(stream, device);
  return from_cuda(real().cuMemPrefetchAsync_v2(addr, bytes, location_of(to, device), 0, stream));
}

// With g_evicted_mutex held: the GPU stream `stream` of `device` waits for its host stream
// when evictions or discards were issued there since the last prefetch toward the GPU.
void CudaBackend::order_after_evictions(CUstream stream, int device) {
  const auto own_slot = static_cast<std::size_t>(device);
  if (g_evicted[own_slot]) {
    CUstream host = own_stream(Location::cpu, device);
    // (Still owed to the next prefetch if it could not be ordered now.)
    if (host != nullptr && order_after(stream, host, 1)) g_evicted[own_slot] = false;
  }
}

namespace {

using PrefetchBatchFn = CUresult (*)(CUdeviceptr*, size_t*, size_t, CUmemLocation*, size_t*, size_t, unsigned long long,
                                     CUstream);

// cuMemPrefetchBatchAsync (CUDA 13.0), resolved once (driver_entry_13).
PrefetchBatchFn prefetch_batch_entry() {
  static const auto fn = reinterpret_cast<PrefetchBatchFn>(driver_entry_13("cuMemPrefetchBatchAsync"));
  return fn;
}

std::atomic<bool> g_prefetch_batch_refused{false};  // the driver refused a batch once: range by range since

}  // namespace

bool CudaBackend::can_batch_prefetches() {
  return !g_prefetch_batch_refused.load(std::memory_order_relaxed) && prefetch_batch_entry() != nullptr;
}

Result CudaBackend::prefetch_batch(const std::uint64_t* addrs, const std::uint64_t* bytes, std::size_t count, Location to,
                                   int device) {
  // (Toward the host one by one: prefetch() orders evictions after the program's work.)
  PrefetchBatchFn batch = to == Location::gpu ? prefetch_batch_entry() : nullptr;
  if (batch == nullptr) return Backend::prefetch_batch(addrs, bytes, count, to, device);
  CUresult r = CUDA_SUCCESS;
  {
    ShimCallScope scope;
    RelaxedCaptureMode relaxed;
    CUstream stream = own_stream(to, device);
    if (stream == nullptr) return missing();
    std::vector<CUdeviceptr> ptrs(addrs, addrs + count);
    std::vector<size_t> sizes(bytes, bytes + count);
    CUmemLocation where = location_of(to, device);
    size_t first = 0;  // (one location, from the batch's first range on)
    std::lock_guard lock(g_evicted_mutex);
    order_after_evictions(stream, device);
    r = batch(ptrs.data(), sizes.data(), count, &where, &first, 1, 0, stream);
  }
  if (r == CUDA_SUCCESS) return {};
  // Refused: no batch from now on (the Engine issues these ranges one by one).
  if (!g_prefetch_batch_refused.exchange(true)) {
    log(LogLevel::info, "cuMemPrefetchBatchAsync refused a batch of {} ranges (CUresult {}): prefetching range by range", count,
        static_cast<int>(r));
  }
  return from_cuda(r);
}

Result CudaBackend::advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int device) {
  ShimCallScope scope;
  if (real().cuMemAdvise_v2 == nullptr) return missing();
  CUmem_advise a = CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
  switch (advice) {
    case Advice::preferred_location: a = CU_MEM_ADVISE_SET_PREFERRED_LOCATION; break;
    case Advice::unset_preferred_location: a = CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION; break;
    case Advice::accessed_by: a = CU_MEM_ADVISE_SET_ACCESSED_BY; break;
    case Advice::unset_accessed_by: a = CU_MEM_ADVISE_UNSET_ACCESSED_BY; break;
    case Advice::read_mostly: a = CU_MEM_ADVISE_SET_READ_MOSTLY; break;
    case Advice::unset_read_mostly: a = CU_MEM_ADVISE_UNSET_READ_MOSTLY; break;
  }
  return from_cuda(real().cuMemAdvise_v2(addr, bytes, a, location_of(where, device)));
}

Result CudaBackend::capture_status(StreamHandle stream, bool* capturing) {
  const std::optional<CUresult> r = stream_is_capturing(reinterpret_cast<CUstream>(stream), capturing);
  if (!r) return missing();
  return *r == CUDA_SUCCESS ? Result{} : from_cuda(*r);
}

Result CudaBackend::record_event(StreamHandle stream, EventHandle* event) {
  ShimCallScope scope;
  if (real().cuEventCreate == nullptr || real().cuEventRecord == nullptr) return missing();
  RelaxedCaptureMode relaxed;
  CUevent e = nullptr;
  CUresult r = real().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return from_cuda(r);
  r = real().cuEventRecord(e, reinterpret_cast<CUstream>(stream));
  if (r != CUDA_SUCCESS) {
    real().cuEventDestroy_v2(e);
    return from_cuda(r);
  }
  *event = reinterpret_cast<EventHandle>(e);
  return Result{};
}

Result CudaBackend::event_done(EventHandle event) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  return from_cuda(real().cuEventQuery(reinterpret_cast<CUevent>(event)));
}

Result CudaBackend::wait_event(EventHandle event) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  return from_cuda(real().cuEventSynchronize(reinterpret_cast<CUevent>(event)));
}

void CudaBackend::destroy_event(EventHandle event) {
  ShimCallScope scope;
  if (real().cuEventDestroy_v2 != nullptr) real().cuEventDestroy_v2(reinterpret_cast<CUevent>(event));
}

bool CudaBackend::fault_feedback() { return CuptiFeedback::active(); }
std::size_t CudaBackend::take_faults(std::vector<FaultRecord>& out) { return CuptiFeedback::take(out); }
std::string CudaBackend::fault_feedback_state() { return CuptiFeedback::state(); }

std::string CudaBackend::framework_trace_state() { return torch_tracker_state(); }
void CudaBackend::migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) { CuptiFeedback::migrated_bytes(to_gpu, to_host); }
// CUPTI may call the driver itself: as the shim's own calls, those pass the hooks by.
void CudaBackend::begin_launch(std::uint64_t seq) {
  ShimCallScope scope;
  CuptiFeedback::begin_launch(seq);
}
void CudaBackend::end_launch() {
  ShimCallScope scope;
  CuptiFeedback::end_launch();
}
bool CudaBackend::start_fault_feedback() {
  if (CuptiFeedback::tried()) return CuptiFeedback::active();  // (the launch path: one load)
  const int device = current_device();
  ShimCallScope scope;
  return CuptiFeedback::start(device);
}

}  // namespace spillway::interpose
