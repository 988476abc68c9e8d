#include "cuda_backend.h"
#include "cupti_feedback.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
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

void note_current_context();

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

std::uint64_t CudaBackend::current_context() {
  ShimCallScope scope;
  CUcontext ctx = nullptr;
  if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return 0;
  return reinterpret_cast<std::uint64_t>(ctx);
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

// Streams that launched kernels lately (any thread), with the launch count at their last
// launch: an eviction waits for their work too. A few slots: programs launch on few streams.
constexpr std::size_t kStreamSlots = 8;
constexpr std::uint64_t kRecentLaunches = 256;
std::mutex g_streams_mutex;
std::array<std::pair<CUstream, std::uint64_t>, kStreamSlots> g_streams{};  // guarded by g_streams_mutex
std::uint64_t g_launches = 0;                                               // guarded by g_streams_mutex

// The contexts the program allocated or launched in (CudaBackend::record_fence records on
// each: the legacy default stream of one context does not follow another's work; CUDA
// Programming Guide, "Default Stream": it is per context). Few: one per device in use, as a
// rule. Each with its device. Guarded by
// g_contexts_mutex (a leaf: taken with g_streams_mutex held, never the other way).
std::mutex g_contexts_mutex;
std::vector<std::pair<CUcontext, int>>& g_contexts = *new std::vector<std::pair<CUcontext, int>>;
bool context_known_locked(CUcontext ctx) {
  return std::any_of(g_contexts.begin(), g_contexts.end(), [ctx](const auto& c) { return c.first == ctx; });
}
std::atomic<std::uint64_t> g_contexts_forgotten{0};  // forget_context() calls: thread caches below go stale
thread_local CUcontext t_noted_context = nullptr;     // the last this thread registered
thread_local std::uint64_t t_noted_generation = 0;    // ... when g_contexts_forgotten was this

// Registers the calling thread's current context.
void note_current_context() {
  CUcontext ctx = nullptr;
  if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return;
  const std::uint64_t generation = g_contexts_forgotten.load(std::memory_order_acquire);
  if (ctx == t_noted_context && generation == t_noted_generation) return;
  CUdevice device = -1;
  if (real().cuCtxGetDevice == nullptr || real().cuCtxGetDevice(&device) != CUDA_SUCCESS) device = -1;
  std::lock_guard lock(g_contexts_mutex);
  if (!context_known_locked(ctx)) g_contexts.emplace_back(ctx, device);
  t_noted_context = ctx;
  t_noted_generation = generation;
}

void note_launch_stream(CUstream stream) {
  note_current_context();
  std::lock_guard lock(g_streams_mutex);
  ++g_launches;
  if (stream == CU_STREAM_PER_THREAD) return;  // names another stream on every thread
  std::size_t oldest = 0;
  for (std::size_t i = 0; i < kStreamSlots; ++i) {
    if (g_streams[i].second != 0 && g_streams[i].first == stream) {
      g_streams[i].second = g_launches;
      return;
    }
    if (g_streams[i].second < g_streams[oldest].second) oldest = i;
  }
  g_streams[oldest] = {stream, g_launches};
}

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

std::unique_lock<std::mutex> lock_launch_streams() { return std::unique_lock<std::mutex>(g_streams_mutex); }

namespace {

// ---- fence events ----------------------------------------------------------------------
// Events for fences, reused per context (an event is recorded only on a stream of its own
// context; never destroyed: the driver may be unloading at exit, and a destroyed context
// takes its events with it).
std::mutex g_fence_events_mutex;
std::vector<std::pair<CUcontext, CUevent>>& g_fence_events = *new std::vector<std::pair<CUcontext, CUevent>>;  // guarded

// An event of the current context `ctx`.
CUevent fence_event(CUcontext ctx) {
  {
    std::lock_guard lock(g_fence_events_mutex);
    for (auto it = g_fence_events.rbegin(); it != g_fence_events.rend(); ++it) {
      if (it->first != ctx) continue;
      CUevent e = it->second;
      g_fence_events.erase(std::next(it).base());
      return e;
    }
  }
  CUevent e = nullptr;
  if (real().cuEventCreate == nullptr || real().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

// Back to the pool, unless their context has been forgotten since (destroyed or reset: its
// events went with it, and its handle may be given to a new context).
void give_back(const std::vector<std::pair<CUcontext, CUevent>>& events) {
  std::lock_guard registry(g_contexts_mutex);
  std::lock_guard lock(g_fence_events_mutex);
  for (const auto& e : events) {
    if (context_known_locked(e.first)) g_fence_events.push_back(e);
  }
}

void forget_fence_events(CUcontext ctx) {
  std::lock_guard lock(g_fence_events_mutex);
  std::erase_if(g_fence_events, [ctx](const auto& e) { return e.first == ctx; });
}

// One recorded fence event, shared by the fences that include it and by what it stands for
// (a stream's last fence event, a destroyed stream's tail), back to the pool when the last
// holder lets go. `done`: seen complete (it stays so: it is never recorded again while held).
struct FenceEvent {
  FenceEvent(CUcontext c, CUevent e) : ctx(c), event(e) {}
  ~FenceEvent() { give_back({{ctx, event}}); }
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
FenceEventPtr record_on(CUcontext ctx, CUstream stream, CUresult* r) {
  CUevent e = fence_event(ctx);
  if (e == nullptr) {
    *r = CUDA_ERROR_OUT_OF_MEMORY;
    return nullptr;
  }
  *r = real().cuEventRecord(e, stream);
  if (*r != CUDA_SUCCESS) {
    give_back({{ctx, e}});  // (kept only while its context is registered: give_back)
    return nullptr;
  }
  return std::make_shared<FenceEvent>(ctx, e);
}

// Runs `fn` with `ctx` current (pushed when it is not the current one); false when it could
// not be made current.
template <typename Fn>
bool in_context(CUcontext ctx, Fn&& fn) {
  CUcontext current = nullptr;
  if (real().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) {
    fn();
    return true;
  }
  if (ctx == nullptr || real().cuCtxPushCurrent_v2 == nullptr || real().cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS) return false;
  fn();
  CUcontext popped = nullptr;
  real().cuCtxPopCurrent_v2(&popped);
  return true;
}

// ---- the program's streams -------------------------------------------------------------
// Every stream the program created (cuStreamCreate, cuStreamCreateWithPriority), so that a
// fence costs by the streams with work since the last fence, not by the streams ever made:
// a stream is fenced with a new event only when the hooks saw work issued to it since its
// last fence event (launches, graph launches, the hooked copies and memsets); otherwise a
// fence includes that last event until it is seen complete, and then nothing. A blocking
// stream is followed by its context's legacy default stream (CUDA Programming Guide,
// "Default Stream", "Implicit Synchronization"), so it is fenced on its own only while a
// capture keeps that legacy stream from being used. Guarded by g_streams_mutex.
struct KnownStream {
  CUcontext ctx = nullptr;  // the context current at its creation, which it belongs to
  bool blocking = true;     // created without CU_STREAM_NON_BLOCKING
  bool dirty = false;       // work seen since `last` was recorded
  FenceEventPtr last;       // its last fence event, until seen complete
};
std::unordered_map<CUstream, KnownStream>& g_known = *new std::unordered_map<CUstream, KnownStream>;
// The streams a fence looks at: dirty, or with a last event not yet seen complete.
std::vector<CUstream>& g_active = *new std::vector<CUstream>;
// Events every fence includes until they are seen complete, for work that can no longer be
// fenced by recording on its stream: a destroyed stream's work (cuStreamDestroy: "the
// resources associated with the stream will be released automatically once the device has
// completed all work in the stream" — the work still runs), and the work issued before a
// capture began to the capturing stream and to the legacy stream the capture blocks.
std::vector<FenceEventPtr>& g_tails = *new std::vector<FenceEventPtr>;
constexpr std::size_t kTailsBeforePrune = 64;
// Captures begun through the hooks and not ended: the stream, and the context whose legacy
// stream it keeps from use (a blocking stream's; nullptr for a non-blocking one): work on
// the legacy stream while a blocking stream of its context is captured would join the
// capture (CUDA Programming Guide, "Stream Capture", "Prohibited and Unhandled Operations").
std::vector<std::pair<CUstream, CUcontext>>& g_capturing = *new std::vector<std::pair<CUstream, CUcontext>>;

bool is_default(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }

bool legacy_captured_locked(CUcontext ctx) {
  return std::any_of(g_capturing.begin(), g_capturing.end(), [ctx](const auto& c) { return c.second == ctx; });
}

void mark_active_locked(CUstream s, KnownStream& k) {
  if (!k.dirty && k.last == nullptr) g_active.push_back(s);
}

// Tails seen complete leave; with `query`, each is asked first (bounds them when the program
// destroys many streams between fences).
void prune_tails_locked(bool query) {
  std::erase_if(g_tails, [query](const FenceEventPtr& t) {
    if (!t->done && query && real().cuEventQuery(t->event) != CUDA_ERROR_NOT_READY) t->done = true;
    return t->done.load();
  });
}

// Whether `stream` is being captured now (any capture may have drawn it in through an
// event); only asked while some capture is in progress.
bool capturing_now(CUstream stream) {
  if (!captures_in_progress()) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return real().cuStreamIsCapturing == nullptr || real().cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

void note_stream_created(CUstream stream, unsigned flags) {
  if (stream == nullptr) return;
  CUcontext ctx = nullptr;  // (a stream belongs to the context current at its creation)
  {
    ShimCallScope scope;
    if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  }
  note_current_context();
  std::lock_guard lock(g_streams_mutex);
  KnownStream& k = g_known[stream];  // (a handle the driver gives out again replaces the old entry)
  k = KnownStream{ctx, (flags & CU_STREAM_NON_BLOCKING) == 0, false, nullptr};
}

void note_stream_work(CUstream stream) {
  {
    ShimCallScope scope;
    note_current_context();
  }
  if (is_default(stream)) return;
  std::lock_guard lock(g_streams_mutex);
  auto it = g_known.find(stream);
  if (it == g_known.end() || it->second.dirty) return;
  mark_active_locked(stream, it->second);
  it->second.dirty = true;
}

void note_context_used() {
  ShimCallScope scope;
  note_current_context();
}

void forget_context(CUcontext ctx) {
  std::lock_guard lock(g_streams_mutex);
  g_contexts_forgotten.fetch_add(1, std::memory_order_acq_rel);
  {
    std::lock_guard registry(g_contexts_mutex);
    std::erase_if(g_contexts, [ctx](const auto& c) { return c.first == ctx; });
  }
  // (Its streams and events went with it: their events are not pooled again, give_back.)
  std::erase_if(g_known, [ctx](const auto& s) { return s.second.ctx == ctx; });
  std::erase_if(g_active, [](CUstream s) { return !g_known.contains(s); });
  std::erase_if(g_tails, [ctx](const FenceEventPtr& t) { return t->ctx == ctx; });
  std::erase_if(g_capturing, [ctx](const auto& c) { return c.second == ctx; });
  backend_instance().forget_streams_of(ctx);
}

namespace {

// (g_streams_mutex held.) `stream`, which belongs to `ctx` (nullptr: unknown, the current
// context's), is about to be destroyed or captured: an event after its work so far joins the
// tails. Nothing for a stream being captured (its captured work does not run) or one the
// driver does not know (it refuses the call); `last` stands in when no event can be recorded.
void keep_tail_locked(CUstream stream, CUcontext ctx, const FenceEventPtr& last) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (real().cuStreamIsCapturing == nullptr || real().cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS ||
      status != CU_STREAM_CAPTURE_STATUS_NONE) {
    return;
  }
  if (ctx == nullptr && real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return;
  FenceEventPtr tail;
  CUresult r = CUDA_SUCCESS;
  in_context(ctx, [&] { tail = record_on(ctx, stream, &r); });
  if (tail == nullptr) tail = last;
  if (tail != nullptr && !tail->done) g_tails.push_back(std::move(tail));
  if (g_tails.size() >= kTailsBeforePrune) prune_tails_locked(true);
}

}  // namespace

void forget_launch_stream(CUstream stream) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  std::lock_guard lock(g_streams_mutex);
  for (auto& slot : g_streams) {
    if (slot.second != 0 && slot.first == stream) slot = {nullptr, 0};
  }
  if (is_default(stream)) return;
  KnownStream known;
  if (auto it = g_known.find(stream); it != g_known.end()) {
    known = std::move(it->second);
    g_known.erase(it);
    std::erase(g_active, stream);
  }
  keep_tail_locked(stream, known.ctx, known.last);
}

void note_capture_beginning_locked(CUstream stream) {
  ShimCallScope scope;
  RelaxedCaptureMode relaxed;
  CUcontext ctx = nullptr;
  bool blocking = true;
  if (auto it = g_known.find(stream); it != g_known.end()) {
    ctx = it->second.ctx;
    blocking = it->second.blocking;
  }
  keep_tail_locked(stream, ctx, nullptr);
  if (!blocking) return;
  if (ctx == nullptr && real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return;
  if (!legacy_captured_locked(ctx)) keep_tail_locked(CU_STREAM_LEGACY, ctx, nullptr);
}

void note_capture_begun_locked(CUstream stream) {
  CUcontext ctx = nullptr;
  if (auto it = g_known.find(stream); it != g_known.end()) {
    if (!it->second.blocking) {
      g_capturing.emplace_back(stream, nullptr);
      return;
    }
    ctx = it->second.ctx;
  }
  ShimCallScope scope;
  if (ctx == nullptr && real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) ctx = nullptr;
  g_capturing.emplace_back(stream, ctx);
}

void note_capture_ended(CUstream stream) {
  std::lock_guard lock(g_streams_mutex);
  auto it = std::find_if(g_capturing.begin(), g_capturing.end(), [stream](const auto& c) { return c.first == stream; });
  if (it != g_capturing.end()) g_capturing.erase(it);
}

namespace {

using DiscardBatchFn = CUresult (*)(CUdeviceptr*, size_t*, size_t, unsigned long long, CUstream);

// cuMemDiscardBatchAsync (CUDA 13.0), resolved once through the driver's own cuGetProcAddress;
// null where the driver has none.
DiscardBatchFn discard_batch() {
  static const DiscardBatchFn fn = [] {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status{};
    if (real().cuGetProcAddress_v2 == nullptr ||
        real().cuGetProcAddress_v2("cuMemDiscardBatchAsync", &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        status != CU_GET_PROC_ADDRESS_SUCCESS) {
      return static_cast<DiscardBatchFn>(nullptr);
    }
    return reinterpret_cast<DiscardBatchFn>(p);
  }();
  return fn;
}

// (g_streams_mutex held, ctx current.) One stream of the program for a fence: a new event if
// work was seen on it since its last, else that last one until it is seen complete.
CUresult fence_stream_locked(CUcontext ctx, CUstream s, KnownStream& k, FenceRecord& rec) {
  if (k.dirty) {
    if (capturing_now(s)) {
      k.dirty = false;  // (captured work does not run now; what came before is a tail)
      return CUDA_SUCCESS;
    }
    CUresult r = CUDA_SUCCESS;
    FenceEventPtr e = record_on(ctx, s, &r);
    if (e == nullptr) return r;
    k.last = e;
    k.dirty = false;
    rec.events.push_back(std::move(e));
    return CUDA_SUCCESS;
  }
  if (k.last != nullptr && !k.last->done) rec.events.push_back(k.last);
  return CUDA_SUCCESS;
}

// (g_streams_mutex held, ctx current.) A context's work: its legacy default stream (unless a
// capture keeps it from use: then its blocking streams one by one), its streams with work
// since their last fence, and the shim's own streams there (a prefetch may still be copying
// a range the fence frees).
CUresult fence_context_locked(CUcontext ctx, FenceRecord& rec) {
  const bool legacy_captured = legacy_captured_locked(ctx);
  CUresult r = CUDA_SUCCESS;
  if (!legacy_captured) {
    FenceEventPtr e = record_on(ctx, CU_STREAM_LEGACY, &r);
    if (e == nullptr) return r;
    rec.events.push_back(std::move(e));
  }
  for (CUstream s : g_active) {
    KnownStream& k = g_known[s];
    if (k.ctx != ctx || (k.blocking && !legacy_captured)) continue;
    if (r = fence_stream_locked(ctx, s, k, rec); r != CUDA_SUCCESS) return r;
  }
  for (CUstream s : backend_instance().own_streams_of(ctx)) {
    FenceEventPtr e = record_on(ctx, s, &r);
    if (e == nullptr) return r;
    rec.events.push_back(std::move(e));
  }
  return CUDA_SUCCESS;
}

// (g_streams_mutex held.) Streams that need no fence any more leave the active list.
void settle_active_locked() {
  std::erase_if(g_active, [](CUstream s) {
    KnownStream& k = g_known[s];
    if (k.last != nullptr && k.last->done) k.last.reset();
    return !k.dirty && k.last == nullptr;
  });
}

// (g_streams_mutex held.) Every registered context's work, `current` first. A context that
// is no longer active (a primary context reset or released for the last time: its work is
// complete or gone with it; a destroyed one left the registry in the cuCtxDestroy hook) is
// skipped, with the events recorded in it so far, so that no range stays parked for ever.
// Any other failure fails the fence (it is tried again later): a live context's work is
// never left out.
CUresult fence_all_locked(CUcontext current, FenceRecord& rec) {
  if (CUresult r = fence_context_locked(current, rec); r != CUDA_SUCCESS) return r;
  std::vector<CUcontext> others;
  {
    std::lock_guard registry(g_contexts_mutex);
    for (const auto& [ctx, d] : g_contexts) {
      if (ctx != current) others.push_back(ctx);
    }
  }
  for (CUcontext ctx : others) {
    const std::size_t before = rec.events.size();
    CUresult r = CUDA_SUCCESS;
    if (!in_context(ctx, [&] { r = fence_context_locked(ctx, rec); })) continue;
    if (r == CUDA_SUCCESS) continue;
    if (r != CUDA_ERROR_CONTEXT_IS_DESTROYED && r != CUDA_ERROR_INVALID_CONTEXT && r != CUDA_ERROR_DEINITIALIZED) return r;
    rec.events.resize(before);
  }
  prune_tails_locked(false);
  rec.events.insert(rec.events.end(), g_tails.begin(), g_tails.end());
  settle_active_locked();
  return CUDA_SUCCESS;
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
  {
    // Under the registry's lock: no capture begins and no registered stream is destroyed
    // meanwhile. A capture in progress keeps only what it holds from being fenced: its own
    // stream, and the legacy stream of its context (their earlier work is a tail).
    std::lock_guard lock(g_streams_mutex);
    if (CUresult r = fence_all_locked(current, *record); r != CUDA_SUCCESS) return from_cuda(r);
  }
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

bool CudaBackend::held_by_capture(std::uint64_t addr, std::uint64_t bytes) { return used_by_capture(addr, bytes); }

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
  const auto own_slot = static_cast<std::size_t>(device);
  if (to == Location::cpu) {
    if (LaunchOrder* o = t_order; o != nullptr && !o->host_ordered) {
      order_after(stream, o->launch_stream, 0);
      // Other streams' recent work too, unless a capture is in progress anywhere (an event
      // recorded on a capturing stream would make the host stream join its capture). Under
      // the registry's lock, which the capture-begin hooks hold across the real call: no
      // capture begins meanwhile, and no registered stream is destroyed (forget_launch_stream).
      std::lock_guard lock(g_streams_mutex);
      if (!captures_in_progress()) {
        for (const auto& [other, at] : g_streams) {
          if (at != 0 && other != o->launch_stream && at + kRecentLaunches > g_launches) order_after(stream, other, 0);
        }
      }
      o->host_ordered = true;
    }
    std::lock_guard lock(g_evicted_mutex);
    g_evicted[own_slot] = true;
    return from_cuda(real().cuMemPrefetchAsync_v2(addr, bytes, location_of(to, device), 0, stream));
  }
  std::lock_guard lock(g_evicted_mutex);
  if (g_evicted[own_slot]) {
    CUstream host = own_stream(Location::cpu, device);
    // (Still owed to the next prefetch if it could not be ordered now.)
    if (host != nullptr && order_after(stream, host, 1)) g_evicted[own_slot] = false;
  }
  return from_cuda(real().cuMemPrefetchAsync_v2(addr, bytes, location_of(to, device), 0, stream));
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
  ShimCallScope scope;
  if (real().cuStreamIsCapturing == nullptr) return missing();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = real().cuStreamIsCapturing(reinterpret_cast<CUstream>(stream), &status);
  if (r != CUDA_SUCCESS) return from_cuda(r);
  // An invalidated capture still forbids new work on the stream until it ends.
  *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
  return Result{};
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
