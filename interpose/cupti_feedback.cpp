#include "cupti_feedback.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "spillway/log.h"

#if SPILLWAY_HAVE_CUPTI
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#endif

extern "C" __attribute__((visibility("hidden"))) void* spillway_real_dlsym_for_next();

namespace spillway::interpose {
namespace {

using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym() { return reinterpret_cast<DlsymFn>(spillway_real_dlsym_for_next()); }

enum : int { kNotStarted = 0, kActive = 1, kOff = 2 };
std::atomic<int> g_state{kNotStarted};
std::atomic<bool> g_exiting{false};
std::atomic<bool> g_other_client{false};
std::once_flag g_start_once;
std::mutex g_why_mutex;
std::string g_why = "off: not started (no launch yet)";
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
  CUptiResult (*flush_period)(uint32_t) = nullptr;  // optional (CUDA 11.1+)
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*configure_um)(CUpti_ActivityUnifiedMemoryCounterConfig*, uint32_t) = nullptr;
  CUptiResult (*push)(CUpti_ExternalCorrelationKind, uint64_t) = nullptr;
  CUptiResult (*pop)(CUpti_ExternalCorrelationKind, uint64_t*) = nullptr;
};
Api g_api;

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER};
constexpr std::size_t kBufferBytes = 1u << 20;

struct KernelSpan {
  std::uint64_t start, end;
  std::uint32_t device, correlation;
};
struct WaitingFault {
  std::uint64_t time, addr;
  std::uint32_t device;
};
std::mutex g_mutex;  // guards the three below and g_queue
std::deque<KernelSpan> g_kernels;                               // by start time
std::unordered_map<std::uint32_t, std::uint64_t> g_external;   // CUPTI correlation id -> Launch::seq
std::deque<WaitingFault> g_waiting;
std::vector<FaultRecord> g_queue;
std::atomic<bool> g_queued{false};
thread_local int t_pushed = 0;

void* open_cupti() {
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  }
  for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  }
  std::vector<std::string> roots;
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0') roots.emplace_back(home);
  roots.emplace_back("/usr/local/cuda");
  for (const std::string& root : roots) {
    for (const char* dir : {"/extras/CUPTI/lib64/", "/lib64/", "/lib/"}) {
      const std::string path = root + dir + "libcupti.so";
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
  }
  return nullptr;
}

template <typename F>
bool resolve(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(real_dlsym()(handle, name));
  return out != nullptr;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

// Attributes the waiting faults to the kernels known so far (with g_mutex held).
void attribute_locked() {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < g_waiting.size(); ++i) {
    const WaitingFault& f = g_waiting[i];
    bool found = false;
    // Kernels that started at or before the fault; concurrent ones are few: look back a while.
    auto it = std::upper_bound(g_kernels.begin(), g_kernels.end(), f.time,
                               [](std::uint64_t t, const KernelSpan& k) { return t < k.start; });
    int looked = 0;
    while (it != g_kernels.begin() && looked++ < 256) {
      --it;
      if (it->device != f.device || f.time > it->end) continue;
      auto ext = g_external.find(it->correlation);
      if (ext == g_external.end()) continue;
      if (g_queue.size() < CuptiFeedback::kMaxQueued) g_queue.push_back(FaultRecord{ext->second, f.addr});
      found = true;
    }
    // Not attributable yet: its kernel's record may still come (unless it is older than
    // every kernel held: then it never will).
    const bool hopeless = !g_kernels.empty() && f.time < g_kernels.front().start;
    if (!found && !hopeless) g_waiting[kept++] = f;
  }
  g_waiting.resize(kept);
  while (g_waiting.size() > CuptiFeedback::kMaxWaiting) g_waiting.pop_front();
  g_queued.store(!g_queue.empty(), std::memory_order_release);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (buffer == nullptr) return;
  try {
    std::lock_guard lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (valid > 0 && g_api.next_record != nullptr && g_api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          // The fields read here (start, end, deviceId, correlationId) lie at the same
          // offsets in every kernel record version a CUDA 12 or 13 libcupti emits.
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          KernelSpan span{k->start, k->end, k->deviceId, k->correlationId};
          auto at = std::upper_bound(g_kernels.begin(), g_kernels.end(), span.start,
                                     [](std::uint64_t t, const KernelSpan& x) { return t < x.start; });
          g_kernels.insert(at, span);
          while (g_kernels.size() > CuptiFeedback::kMaxKernels) {
            g_external.erase(g_kernels.front().correlation);
            g_kernels.pop_front();
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            if (g_external.size() > 4 * CuptiFeedback::kMaxKernels) g_external.clear();
            g_external[x->correlationId] = x->externalId;
          }
          break;
        }
        case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER: {
          const auto* u = reinterpret_cast<const CUpti_ActivityUnifiedMemoryCounter3*>(record);
          if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT) {
            g_waiting.push_back(WaitingFault{u->start, u->address, u->srcId});
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
    attribute_locked();
  } catch (...) {
    SPILLWAY_LOG_ONCE(LogLevel::warn, "fault feedback: a CUPTI buffer could not be read; its records are dropped");
  }
  std::free(buffer);
}

bool start_locked(int device) {
  if (const char* inj = std::getenv("CUDA_INJECTION64_PATH"); inj != nullptr && *inj != '\0') {
    set_off("off: another CUPTI client is injected (CUDA_INJECTION64_PATH)");
    return false;
  }
  if (g_other_client.load()) {
    set_off("off: another CUPTI client registered first");
    return false;
  }
  void* h = open_cupti();
  if (h == nullptr) {
    set_off("off: libcupti not found (dlopen libcupti.so.13/.12/.so, $CUDA_HOME or /usr/local/cuda/extras/CUPTI/lib64)");
    return false;
  }
  Api a;
  if (!resolve(h, "cuptiActivityRegisterCallbacks", a.register_callbacks) || !resolve(h, "cuptiActivityEnable", a.enable) ||
      !resolve(h, "cuptiActivityDisable", a.disable) || !resolve(h, "cuptiActivityFlushAll", a.flush_all) ||
      !resolve(h, "cuptiActivityGetNextRecord", a.next_record) ||
      !resolve(h, "cuptiActivityConfigureUnifiedMemoryCounter", a.configure_um) ||
      !resolve(h, "cuptiActivityPushExternalCorrelationId", a.push) ||
      !resolve(h, "cuptiActivityPopExternalCorrelationId", a.pop)) {
    set_off("off: libcupti lacks an Activity API function");
    return false;
  }
  resolve(h, "cuptiActivityFlushPeriod", a.flush_period);
  g_api = a;
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
  if (r != CUPTI_SUCCESS) {
    set_off(fmt::format("off: cuptiActivityConfigureUnifiedMemoryCounter failed ({})", static_cast<int>(r)));
    return false;
  }
  r = a.register_callbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    set_off(fmt::format("off: cuptiActivityRegisterCallbacks failed ({})", static_cast<int>(r)));
    return false;
  }
  for (CUpti_ActivityKind kind : kKinds) {
    r = a.enable(kind);
    if (r != CUPTI_SUCCESS) {
      for (CUpti_ActivityKind k : kKinds) a.disable(k);
      set_off(fmt::format("off: cuptiActivityEnable({}) failed ({})", static_cast<int>(kind), static_cast<int>(r)));
      return false;
    }
  }
  if (a.flush_period != nullptr) a.flush_period(CuptiFeedback::kFlushPeriodMs);
  std::atexit([] { g_exiting.store(true); });  // runs before the libraries' destructors and CUPTI's own teardown
  {
    std::lock_guard lock(g_why_mutex);
    g_why = "cupti";
  }
  g_state.store(kActive, std::memory_order_release);
  return true;
}

#endif  // SPILLWAY_HAVE_CUPTI

}  // namespace

bool CuptiFeedback::start(int device) {
  std::call_once(g_start_once, [device] {
#if SPILLWAY_HAVE_CUPTI
    try {
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
  // Deliver what has completed, at most every kFlushPeriodMs (CUPTI's own periodic flush
  // does the same where it has one).
  const std::int64_t now = steady_ns();
  std::int64_t last = g_last_flush_ns.load(std::memory_order_relaxed);
  if (g_api.flush_period == nullptr && now - last >= std::int64_t(kFlushPeriodMs) * 1'000'000 &&
      g_last_flush_ns.compare_exchange_strong(last, now)) {
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
  std::lock_guard lock(g_mutex);
  const std::size_t n = g_queue.size();
  out.insert(out.end(), g_queue.begin(), g_queue.end());
  g_queue.clear();
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
  g_other_client.store(true);
#if SPILLWAY_HAVE_CUPTI
  int expected = kActive;
  if (g_state.load() == kActive && !g_exiting.load()) {
    // Hand CUPTI over as we found it: our kinds off, our buffers back to us.
    for (CUpti_ActivityKind k : kKinds) g_api.disable(k);
    g_api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  }
  if (g_state.compare_exchange_strong(expected, kOff) || expected == kNotStarted) {
    set_off(std::string("off: another CUPTI client appeared (") + why + ")");
    log(LogLevel::info, "fault feedback {}", state());
  }
#else
  (void)why;
#endif
}

void CuptiFeedback::at_exit() { g_exiting.store(true); }

}  // namespace spillway::interpose

#if SPILLWAY_HAVE_CUPTI
// ---- exported CUPTI entry points ------------------------------------------------------
// The shim's own CUPTI calls go through pointers from dlsym on libcupti's handle; a call
// that reaches these exports comes from another CUPTI client (a profiler such as PyTorch's
// Kineto, linked against libcupti): fault feedback stops first, then the call goes on to
// CUPTI unchanged.
namespace {
template <typename F>
F next_cupti(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
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
