#include "cupti_feedback.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "shim.h"
#include "spillway/cancel.h"
#include "spillway/cupti_library.h"
#include "spillway/log.h"

#if SPILLWAY_HAVE_CUPTI
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>
#endif

namespace spillway::interpose {
namespace {

enum : int { kNotStarted = 0, kActive = 1, kOff = 2 };
std::atomic<int> g_state{kNotStarted};
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_other_client{false};
std::once_flag g_start_once;
// Held while CUPTI is being started, and by a stop for another client: a client's callbacks
// are registered after ours, never before (its buffers would come back to us).
std::mutex& start_mutex() {
  static auto* m = new std::mutex;  // never destroyed: CUPTI's thread may call in at exit
  return *m;
}
thread_local bool t_starting = false;  // (CUPTI calling our exports while we start it)
std::mutex g_why_mutex;
// Never destroyed: the exit report reads it from a library destructor, after static destructors
// may have run (a late dlopen() of the shim printed freed bytes here).
std::string& g_why = *new std::string("off: not started (no launch yet)");
std::atomic<std::uint64_t> g_to_gpu{0}, g_to_host{0};
std::atomic<std::int64_t> g_last_flush_ns{0};

void set_off(std::string why) {
  std::lock_guard lock(g_why_mutex);
  g_why = std::move(why);
  g_state.store(kOff, std::memory_order_release);
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#if SPILLWAY_HAVE_CUPTI

struct Api {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  // Fine-grained API records (CUDA 12.x+; else the whole DRIVER and RUNTIME kinds): CUPTI
  // writes an EXTERNAL_CORRELATION record only before an API activity record made inside
  // the pushed region (cupti_activity.h, cuptiActivityPushExternalCorrelationId).
  CUptiResult (*enable_driver_api)(CUpti_CallbackId, uint8_t) = nullptr;
  CUptiResult (*enable_runtime_api)(CUpti_CallbackId, uint8_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*configure_um)(CUpti_ActivityUnifiedMemoryCounterConfig*, uint32_t) = nullptr;
  CUptiResult (*push)(CUpti_ExternalCorrelationKind, uint64_t) = nullptr;
  CUptiResult (*pop)(CUpti_ExternalCorrelationKind, uint64_t*) = nullptr;
};
Api g_api;

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER};
// The launch calls whose API records carry the external correlation ids (the shim brackets
// the driver's and the runtime's launch calls: hooks_launch.cpp).
constexpr CUpti_CallbackId kDriverLaunches[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz};
constexpr CUpti_CallbackId kRuntimeLaunches[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000};
bool g_whole_api_kinds = false;  // DRIVER and RUNTIME enabled whole (no fine-grained API)
constexpr std::size_t kBufferBytes = 1u << 20;

struct KernelSpan {
  std::uint64_t start, end;
  std::uint32_t device, correlation;
};
struct WaitingFault {
  std::uint64_t time, addr;
  std::uint32_t device;
  bool write;
};
// Never destroyed (heap): CUPTI's own thread may still deliver a buffer while the process
// exits, after static destructors have run.
struct Records {
  std::mutex mutex;  // guards all below
  std::deque<KernelSpan> kernels;                               // by start time
  std::unordered_map<std::uint32_t, std::uint64_t> external;   // CUPTI correlation id -> Launch::seq
  std::deque<WaitingFault> waiting;
  std::vector<FaultRecord> queue;
};
Records& records() {
  static auto* r = new Records;
  return *r;
}
std::atomic<bool> g_queued{false};
thread_local int t_pushed = 0;

template <typename F>
bool resolve(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(real_dlsym()(handle, name));
  return out != nullptr;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  NoCancelScope no_cancel;  // called inside the host's driver calls (spillway/cancel.h)
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

// Attributes the waiting faults to the kernels known so far (with records().mutex held). A
// fault counts once per (launch, 2 MiB chunk), a write fault after a read fault once more:
// CUPTI reports one record per faulting page.
void attribute_locked(Records& rec) {
  std::size_t kept = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> last_chunk;  // launch seq -> 2 * chunk last queued + its write bit
  for (std::size_t i = 0; i < rec.waiting.size(); ++i) {
    const WaitingFault& f = rec.waiting[i];
    bool found = false, covered = false;
    // Kernels that started at or before the fault; concurrent ones are few: look back a while.
    auto it = std::upper_bound(rec.kernels.begin(), rec.kernels.end(), f.time,
                               [](std::uint64_t t, const KernelSpan& k) { return t < k.start; });
    int looked = 0;
    while (it != rec.kernels.begin() && looked++ < 256) {
      --it;
      if (it->device != f.device || f.time > it->end) continue;
      covered = true;
      auto ext = rec.external.find(it->correlation);
      if (ext == rec.external.end()) continue;
      found = true;
      const std::uint64_t chunk = f.addr / kChunkBytes;
      auto [last, fresh] = last_chunk.try_emplace(ext->second, ~0ull);
      if (!fresh && last->second / 2 == chunk && (last->second % 2 == 1 || !f.write)) continue;
      last->second = 2 * chunk + (f.write ? 1 : 0);
      if (rec.queue.size() < CuptiFeedback::kMaxQueued) rec.queue.push_back(FaultRecord{ext->second, f.addr, f.write});
    }
    // Not attributable yet: its kernel's record may still come — unless a kernel record
    // covers it with no launch of ours (a kernel the shim did not bracket, e.g. a graph's)
    // or it is older than every kernel held.
    const bool hopeless = covered || (!rec.kernels.empty() && f.time < rec.kernels.front().start);
    if (!found && !hopeless) rec.waiting[kept++] = f;
  }
  rec.waiting.resize(kept);
  while (rec.waiting.size() > CuptiFeedback::kMaxWaiting) rec.waiting.pop_front();
  g_queued.store(!rec.queue.empty(), std::memory_order_release);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  NoCancelScope no_cancel;  // called inside the host's driver calls (spillway/cancel.h)
  if (buffer == nullptr) return;
  if (g_exiting.load(std::memory_order_relaxed)) {  // (CUPTI's last flush at exit: just hand it back)
    std::free(buffer);
    return;
  }
  try {
    Records& rec = records();
    std::lock_guard lock(rec.mutex);
    CUpti_Activity* record = nullptr;
    while (valid > 0 && g_api.next_record != nullptr && g_api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          // The fields read here (start, end, deviceId, correlationId) lie at the same
          // offsets in every kernel record version a CUDA 12 or 13 libcupti emits.
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          KernelSpan span{k->start, k->end, k->deviceId, k->correlationId};
          auto at = std::upper_bound(rec.kernels.begin(), rec.kernels.end(), span.start,
                                     [](std::uint64_t t, const KernelSpan& x) { return t < x.start; });
          rec.kernels.insert(at, span);
          while (rec.kernels.size() > CuptiFeedback::kMaxKernels) {
            rec.external.erase(rec.kernels.front().correlation);
            rec.kernels.pop_front();
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            // (Ids whose kernel never came: the oldest half goes, by correlation id, which
            // CUPTI hands out in increasing order.)
            if (rec.external.size() > 4 * CuptiFeedback::kMaxKernels) {
              std::vector<std::uint32_t> ids;
              ids.reserve(rec.external.size());
              for (const auto& [id, seq] : rec.external) ids.push_back(id);
              std::nth_element(ids.begin(), ids.begin() + ids.size() / 2, ids.end());
              const std::uint32_t median = ids[ids.size() / 2];
              std::erase_if(rec.external, [median](const auto& e) { return e.first < median; });
            }
            rec.external[x->correlationId] = x->externalId;
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
          const auto* u = reinterpret_cast<const CUpti_ActivityUnifiedMemoryCounter3*>(record);
          if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT) {
            // flags: the faulting access's CUpti_ActivityUnifiedMemoryAccessType (cupti_activity.h)
            const bool write = u->flags == CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_WRITE ||
                               u->flags == CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_ATOMIC;
            rec.waiting.push_back(WaitingFault{u->start, u->address, u->srcId, write});
          } else if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD) {
            g_to_gpu.fetch_add(u->value, std::memory_order_relaxed);
          } else if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH) {
            g_to_host.fetch_add(u->value, std::memory_order_relaxed);
          }
          break;
        }
        default: break;
      }
    }
    attribute_locked(rec);
  } catch (...) {
    SPILLWAY_LOG_ONCE(LogLevel::warn, "fault feedback: a CUPTI buffer could not be read; its records are dropped");
  }
  std::free(buffer);
}

// Turns off what the shim turned on: its activity kinds, and the launch calls' API records
// (g_whole_api_kinds says which way they were turned on).
void disable_ours(const Api& a) {
  for (CUpti_ActivityKind k : kKinds) a.disable(k);
  if (g_whole_api_kinds) {
    a.disable(CUPTI_ACTIVITY_KIND_DRIVER);
    a.disable(CUPTI_ACTIVITY_KIND_RUNTIME);
  } else {
    for (CUpti_CallbackId id : kDriverLaunches) a.enable_driver_api(id, 0);
    for (CUpti_CallbackId id : kRuntimeLaunches) a.enable_runtime_api(id, 0);
  }
}

// start_locked()'s steps. Each returns why the feedback stays off ("" when the step worked).
std::string other_client_reason() {
  if (const char* inj = std::getenv("CUDA_INJECTION64_PATH"); inj != nullptr && *inj != '\0') {
    return "off: another CUPTI client is injected (CUDA_INJECTION64_PATH)";
  }
  if (g_other_client.load()) return "off: another CUPTI client registered first";
  return "";
}

std::string resolve_api(Api& a) {
  void* h = open_cupti_library();  // (spillway/cupti_library.h)
  if (h == nullptr) return std::string("off: libcupti not found (") + kCuptiSearchText + ")";
  if (!resolve(h, "cuptiActivityRegisterCallbacks", a.register_callbacks) || !resolve(h, "cuptiActivityEnable", a.enable) ||
      !resolve(h, "cuptiActivityDisable", a.disable) || !resolve(h, "cuptiActivityFlushAll", a.flush_all) ||
      !resolve(h, "cuptiActivityGetNextRecord", a.next_record) ||
      !resolve(h, "cuptiActivityConfigureUnifiedMemoryCounter", a.configure_um) ||
      !resolve(h, "cuptiActivityPushExternalCorrelationId", a.push) ||
      !resolve(h, "cuptiActivityPopExternalCorrelationId", a.pop)) {
    return "off: libcupti lacks an Activity API function";
  }
  resolve(h, "cuptiActivityEnableDriverApi", a.enable_driver_api);
  resolve(h, "cuptiActivityEnableRuntimeApi", a.enable_runtime_api);
  return "";
}

// The unified-memory counters (GPU page faults, bytes each way) of `device`, and our buffers.
std::string configure_counters(const Api& a, int device) {
  CUpti_ActivityUnifiedMemoryCounterConfig config[3] = {};
  const CUpti_ActivityUnifiedMemoryCounterKind counters[3] = {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT,
                                                              CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD,
                                                              CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH};
  for (int i = 0; i < 3; ++i) {
    config[i].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
    config[i].kind = counters[i];
    config[i].deviceId = static_cast<uint32_t>(device);
    config[i].enable = 1;
  }
  CUptiResult r = a.configure_um(config, 3);
  if (r != CUPTI_SUCCESS) return fmt::format("off: cuptiActivityConfigureUnifiedMemoryCounter failed ({})", static_cast<int>(r));
  r = a.register_callbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) return fmt::format("off: cuptiActivityRegisterCallbacks failed ({})", static_cast<int>(r));
  return "";
}

std::string enable_kinds(const Api& a) {
  for (CUpti_ActivityKind kind : kKinds) {
    CUptiResult r = a.enable(kind);
    if (r != CUPTI_SUCCESS) {
      for (CUpti_ActivityKind k : kKinds) a.disable(k);
      return fmt::format("off: cuptiActivityEnable({}) failed ({})", static_cast<int>(kind), static_cast<int>(r));
    }
  }
  // API records for the launch calls only, where CUPTI can restrict them; else every driver
  // and runtime call gets one (more overhead, same feedback).
  g_whole_api_kinds = a.enable_driver_api == nullptr || a.enable_runtime_api == nullptr;
  CUptiResult r = CUPTI_SUCCESS;
  if (g_whole_api_kinds) {
    r = a.enable(CUPTI_ACTIVITY_KIND_DRIVER);
    if (r == CUPTI_SUCCESS) r = a.enable(CUPTI_ACTIVITY_KIND_RUNTIME);
  } else {
    for (CUpti_CallbackId id : kDriverLaunches) {
      if (r == CUPTI_SUCCESS) r = a.enable_driver_api(id, 1);
    }
    for (CUpti_CallbackId id : kRuntimeLaunches) {
      if (r == CUPTI_SUCCESS) r = a.enable_runtime_api(id, 1);
    }
  }
  if (r != CUPTI_SUCCESS) {
    disable_ours(a);
    return fmt::format("off: enabling the launch calls' API records failed ({})", static_cast<int>(r));
  }
  return "";
}

bool start_locked(int device) {
  std::string off = other_client_reason();
  Api a;
  if (off.empty()) off = resolve_api(a);
  if (!off.empty()) {
    set_off(off);
    return false;
  }
  g_api = a;
  if (off = configure_counters(a, device); off.empty()) off = enable_kinds(a);
  if (!off.empty()) {
    set_off(off);
    return false;
  }
  // A client that appeared while we started (its call waits on start_mutex(), so it comes
  // after ours and its callbacks replace ours): hand CUPTI back at once.
  if (g_other_client.load()) {
    disable_ours(a);
    a.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    set_off("off: another CUPTI client appeared while feedback started");
    return false;
  }
  std::atexit([] { g_exiting.store(true); });  // runs before the libraries' destructors and CUPTI's own teardown
  {
    std::lock_guard lock(g_why_mutex);
    g_why = "cupti";
  }
  g_state.store(kActive, std::memory_order_release);
  return true;
}

// Stops the feedback for good and hands CUPTI back as the shim found it, as far as it can:
// its activity kinds and API records off, its buffers flushed back to it. (With
// start_mutex() held.)
void stop_locked() {
  disable_ours(g_api);
  g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

#endif  // SPILLWAY_HAVE_CUPTI

}  // namespace

bool CuptiFeedback::start(int device) {
  std::call_once(g_start_once, [device] {
#if SPILLWAY_HAVE_CUPTI
    try {
      std::lock_guard lock(start_mutex());
      t_starting = true;
      struct Reset {
        ~Reset() { t_starting = false; }
      } reset;
      if (g_state.load() != kNotStarted) return;  // (another client came first)
      if (start_locked(device)) log(LogLevel::info, "fault feedback: CUPTI unified-memory activity on for device {}", device);
      else log(LogLevel::info, "fault feedback {}", state());
    } catch (...) {
      set_off("off: internal failure while starting CUPTI");
    }
#else
    (void)device;
    set_off("off: built without cupti_activity.h");
#endif
  });
  return active();
}

bool CuptiFeedback::tried() { return g_state.load(std::memory_order_acquire) != kNotStarted; }

bool CuptiFeedback::active() { return g_state.load(std::memory_order_acquire) == kActive && !g_exiting.load(std::memory_order_relaxed); }

void CuptiFeedback::begin_launch(std::uint64_t seq) {
#if SPILLWAY_HAVE_CUPTI
  if (!active()) return;
  if (g_api.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, seq) == CUPTI_SUCCESS) ++t_pushed;
  // Deliver what has completed, at most every kFlushPeriodMs (CUPTI's periodic flush,
  // cuptiActivityFlushPeriod, returns only full buffers: cupti_activity.h).
  const std::int64_t now = steady_ns();
  std::int64_t last = g_last_flush_ns.load(std::memory_order_relaxed);
  if (now - last >= std::int64_t(kFlushPeriodMs) * 1'000'000 && g_last_flush_ns.compare_exchange_strong(last, now)) {
    g_api.flush_all(0);
  }
#else
  (void)seq;
#endif
}

void CuptiFeedback::end_launch() {
#if SPILLWAY_HAVE_CUPTI
  if (t_pushed == 0) return;
  --t_pushed;
  if (g_exiting.load(std::memory_order_relaxed)) return;
  std::uint64_t id = 0;
  g_api.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
#endif
}

std::size_t CuptiFeedback::take(std::vector<FaultRecord>& out) {
#if SPILLWAY_HAVE_CUPTI
  if (!g_queued.load(std::memory_order_acquire)) return 0;
  Records& rec = records();
  std::lock_guard lock(rec.mutex);
  const std::size_t n = rec.queue.size();
  out.insert(out.end(), rec.queue.begin(), rec.queue.end());
  rec.queue.clear();
  g_queued.store(false, std::memory_order_release);
  return n;
#else
  (void)out;
  return 0;
#endif
}

std::string CuptiFeedback::state() {
  std::lock_guard lock(g_why_mutex);
  return g_why;
}

void CuptiFeedback::migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) {
  *to_gpu = g_to_gpu.load(std::memory_order_relaxed);
  *to_host = g_to_host.load(std::memory_order_relaxed);
}

void CuptiFeedback::stop_for_other_client(const char* why) {
#if SPILLWAY_HAVE_CUPTI
  if (t_starting) return;  // CUPTI calling back while the shim starts it: not another client
  g_other_client.store(true);
  // Waits for a start in progress, so that the client's call reaches CUPTI after ours.
  std::lock_guard lock(start_mutex());
  const int was = g_state.load();
  if (was == kOff) return;
  if (was == kActive && !g_exiting.load()) {
    ShimCallScope scope;
    stop_locked();
  }
  set_off(std::string("off: another CUPTI client appeared (") + why + ")");
  log(LogLevel::info, "fault feedback {}", state());
#else
  (void)why;
#endif
}

}  // namespace spillway::interpose

#if SPILLWAY_HAVE_CUPTI
// ---- exported CUPTI entry points ------------------------------------------------------
// The shim's own CUPTI calls go through pointers from dlsym on libcupti's handle; a call
// that reaches these exports comes from another CUPTI client (a profiler such as PyTorch's
// Kineto, linked against libcupti): fault feedback stops first, then the call goes on to
// CUPTI unchanged.
namespace {
// The libcupti the client's call was meant for: the next definition in the global scope
// (RTLD_NEXT), else a libcupti loaded RTLD_LOCAL (a Python extension's, or the one the shim
// loaded itself), found by its soname.
template <typename F>
F next_cupti(const char* name) {
  if (void* f = dlsym(RTLD_NEXT, name)) return reinterpret_cast<F>(f);
  for (const char* soname : spillway::kCuptiSonames) {
    if (void* h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD)) {
      void* f = spillway::interpose::real_dlsym()(h, name);
      dlclose(h);  // (NOLOAD took a reference)
      if (f != nullptr) return reinterpret_cast<F>(f);
    }
  }
  return nullptr;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) CUptiResult CUPTIAPI
cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed) {
  try {
    spillway::interpose::CuptiFeedback::stop_for_other_client("cuptiActivityRegisterCallbacks");
  } catch (...) {
  }
  auto next = next_cupti<CUptiResult(CUPTIAPI*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc)>(
      "cuptiActivityRegisterCallbacks");
  return next != nullptr ? next(requested, completed) : CUPTI_ERROR_NOT_INITIALIZED;
}

extern "C" __attribute__((visibility("default"))) CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle* subscriber,
                                                                                       CUpti_CallbackFunc callback,
                                                                                       void* userdata) {
  try {
    spillway::interpose::CuptiFeedback::stop_for_other_client("cuptiSubscribe");
  } catch (...) {
  }
  auto next = next_cupti<CUptiResult(CUPTIAPI*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*)>("cuptiSubscribe");
  return next != nullptr ? next(subscriber, callback, userdata) : CUPTI_ERROR_NOT_INITIALIZED;
}
#endif
