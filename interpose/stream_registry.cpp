// The stream registry and its fences (stream_registry.h, which has the lock order).
#include "stream_registry.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "capture_registry.h"
#include "cuda_backend.h"
#include "shim.h"

namespace spillway::interpose {

namespace {

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
// g_contexts_mutex (stream_registry.h, lock order 4).
std::mutex g_contexts_mutex;
std::vector<std::pair<CUcontext, int>>& g_contexts = *new std::vector<std::pair<CUcontext, int>>;
bool context_known_locked(CUcontext ctx) {
  return std::any_of(g_contexts.begin(), g_contexts.end(), [ctx](const auto& c) { return c.first == ctx; });
}
std::atomic<std::uint64_t> g_contexts_forgotten{0};  // forget_context() calls: thread caches below go stale
// The last context this thread registered, its device (-1: the driver did not say) and
// g_contexts_forgotten when it did: one thread-local block, one TLS lookup.
struct NotedContext {
  CUcontext context = nullptr;
  std::uint64_t generation = 0;
  int device = -1;
};
thread_local NotedContext t_noted;

}  // namespace

void note_current_context() {
  CUcontext ctx = nullptr;
  if (real().cuCtxGetCurrent == nullptr || real().cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return;
  note_context(ctx);
}

int note_context(CUcontext ctx) {
  if (ctx == nullptr) return -1;
  NotedContext& noted = t_noted;
  const std::uint64_t generation = g_contexts_forgotten.load(std::memory_order_acquire);
  if (ctx == noted.context && generation == noted.generation) return noted.device;
  CUdevice device = -1;
  if (real().cuCtxGetDevice == nullptr || real().cuCtxGetDevice(&device) != CUDA_SUCCESS) device = -1;
  std::lock_guard lock(g_contexts_mutex);
  if (!context_known_locked(ctx)) g_contexts.emplace_back(ctx, device);
  noted = NotedContext{ctx, generation, device};
  return device;
}

void note_launch_stream(CUstream stream) {
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

void order_after_recent_launches(CUstream waiter, CUstream except, bool (*order)(CUstream waiter, CUstream after)) {
  std::lock_guard lock(g_streams_mutex);
  if (capture_registry().in_progress()) return;
  for (const auto& [other, at] : g_streams) {
    if (at != 0 && other != except && at + kRecentLaunches > g_launches) order(waiter, other);
  }
}

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

}  // namespace

void forget_fence_events(CUcontext ctx) {
  std::lock_guard lock(g_fence_events_mutex);
  std::erase_if(g_fence_events, [ctx](const auto& e) { return e.first == ctx; });
}

FenceEvent::~FenceEvent() { give_back({{ctx, event}}); }

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

namespace {

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
  if (!capture_registry().in_progress()) return false;
  bool capturing = false;
  const std::optional<CUresult> r = stream_is_capturing(stream, &capturing);
  return !r || *r != CUDA_SUCCESS || capturing;
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
  note_stream_work_in_noted_context(stream);
}

void note_stream_work_in_noted_context(CUstream stream) {
  if (is_default(stream)) return;
  std::lock_guard lock(g_streams_mutex);
  auto it = g_known.find(stream);
  if (it == g_known.end() || it->second.dirty) return;
  mark_active_locked(stream, it->second);
  it->second.dirty = true;
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
  bool capturing = false;
  if (const std::optional<CUresult> r = stream_is_capturing(stream, &capturing); !r || *r != CUDA_SUCCESS || capturing) {
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

CUresult fence_all(CUcontext current, FenceRecord& rec) {
  std::lock_guard lock(g_streams_mutex);
  return fence_all_locked(current, rec);
}

}  // namespace spillway::interpose
