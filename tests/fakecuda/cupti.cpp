// A fake libcupti (libcupti.so.13, in fakecuda/cupti/): the part of CUPTI's Activity API that
// Spillway's fault feedback uses (interpose/cupti_feedback.h), driven by the fake driver's
// residency model (residency.cpp, through fakecuda_set_activity_sink). It emits the records
// the real CUPTI would, in the layouts of cupti_activity.h (CUDA 13.0):
//   * CONCURRENT_KERNEL (CUpti_ActivityKernel10: start, end, deviceId — the launching
//     device's ordinal —, correlationId) for each launch that executes with the model on;
//   * for such a launch, while the launching thread has an id pushed
//     (cuptiActivityPushExternalCorrelationId) and API records of the launch call are on (the
//     DRIVER or RUNTIME kind, or cuptiActivityEnableDriverApi/RuntimeApi with a launch
//     call's callback id), EXTERNAL_CORRELATION (CUSTOM0) followed by the call's API record
//     (CUpti_ActivityAPI), as CUPTI writes them (only before an API record);
//   * UNIFIED_MEMORY_COUNTER (CUpti_ActivityUnifiedMemoryCounter3): GPU_PAGE_FAULT at the
//     chunk's base for each chunk a launch faulted on or first-touched, timed inside its
//     kernel's [start, end], srcId the faulting device, flags the access type (WRITE where
//     the launch writes the chunk, else READ); BYTES_TRANSFER_HTOD / _DTOH / _DTOD
//     at the chunk's base for faults, prefetches and evictions, srcId and dstId the devices
//     involved (the CPU's id is 0, as in a single-socket host), each only when its counter
//     was configured and the kind enabled. The counters' scope and deviceId are not honoured:
//     every device's records come.
// Time is a counter (one tick per event), so kernels of concurrent threads may overlap, as
// on a GPU. Records are delivered when the program calls cuptiActivityFlushAll (no periodic
// flush: cuptiActivityFlushPeriod is not exported, as in CUPTI before 11.1), in buffers from
// the registered request callback. cuptiSubscribe succeeds once (one subscriber, as CUPTI).
// FAKECUPTI_FAIL=<function name> makes that function fail with CUPTI_ERROR_UNKNOWN.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <cupti_runtime_cbid.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "fakecuda.h"

#define FAKECUPTI_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mutex;  // guards everything below
CUpti_BuffersCallbackRequestFunc g_requested = nullptr;
CUpti_BuffersCallbackCompleteFunc g_completed = nullptr;
bool g_enabled[64] = {};
bool g_counter[16] = {};
std::vector<unsigned char> g_pending;  // records not yet delivered, each padded to 8 bytes
std::uint64_t g_tick = 0;
std::uint32_t g_correlation = 0;
std::uint64_t g_kernel_start = 0;
std::uint32_t g_kernel_correlation = 0;
bool g_subscribed = false;
bool g_driver_launch_api = false, g_runtime_launch_api = false;  // launch calls' API records (fine-grained)
thread_local std::vector<std::uint64_t> t_external;

bool failing(const char* name) {
  const char* f = std::getenv("FAKECUPTI_FAIL");
  return f != nullptr && std::strcmp(f, name) == 0;
}

template <typename R>
void append(const R& r) {
  const std::size_t at = g_pending.size();
  g_pending.resize(at + ((sizeof(R) + 7) & ~std::size_t{7}), 0);
  std::memcpy(g_pending.data() + at, &r, sizeof(R));
}

// srcId/dstId: "The ID of the source [destination] CPU/device involved in the memory
// transfer, page fault, ..." (cupti_activity.h, CUpti_ActivityUnifiedMemoryCounter3).
void um_record(CUpti_ActivityUnifiedMemoryCounterKind kind, std::uint64_t value, std::uint64_t addr, std::uint32_t src,
               std::uint32_t dst, std::uint32_t flags = 0) {
  if (!g_enabled[CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER] || !g_counter[kind]) return;
  CUpti_ActivityUnifiedMemoryCounter3 u{};
  u.kind = CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER;
  u.counterKind = kind;
  u.value = value;
  u.start = ++g_tick;
  u.end = u.start;
  u.address = addr;
  u.srcId = src;
  u.dstId = dst;
  u.flags = flags;
  append(u);
}

std::uint32_t id_of(int device) { return device < 0 ? 0u : static_cast<std::uint32_t>(device); }  // the CPU: 0

// The residency model's events (called with its lock held, on the launching thread).
void on_kernel_begin(int) {
  std::lock_guard lock(g_mutex);
  g_kernel_start = ++g_tick;
  g_kernel_correlation = ++g_correlation;
  const bool driver = g_enabled[CUPTI_ACTIVITY_KIND_DRIVER] || g_driver_launch_api;
  const bool runtime = g_enabled[CUPTI_ACTIVITY_KIND_RUNTIME] || g_runtime_launch_api;
  if (!driver && !runtime) return;  // no API record, hence no external correlation record
  if (g_enabled[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION] && !t_external.empty()) {
    CUpti_ActivityExternalCorrelation x{};
    x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    x.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
    x.externalId = t_external.back();
    x.correlationId = g_kernel_correlation;
    append(x);
  }
  CUpti_ActivityAPI api{};
  api.kind = driver ? CUPTI_ACTIVITY_KIND_DRIVER : CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = driver ? CUpti_CallbackId{CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel} : CUpti_CallbackId{CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000};
  api.start = g_kernel_start;
  api.end = g_kernel_start;
  api.correlationId = g_kernel_correlation;
  append(api);
}
void on_fault(int device, std::uint64_t addr, int write) {
  std::lock_guard lock(g_mutex);
  um_record(CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT, 1, addr, id_of(device), 0,
            write ? CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_WRITE : CUPTI_ACTIVITY_UNIFIED_MEMORY_ACCESS_TYPE_READ);
}
void on_kernel_end(int device) {
  std::lock_guard lock(g_mutex);
  if (!g_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] && !g_enabled[CUPTI_ACTIVITY_KIND_KERNEL]) return;
  CUpti_ActivityKernel10 k{};
  k.kind = g_enabled[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL : CUPTI_ACTIVITY_KIND_KERNEL;
  k.start = g_kernel_start;
  k.end = ++g_tick;
  k.deviceId = id_of(device);
  k.correlationId = g_kernel_correlation;
  append(k);
}
void on_migration(int src, int dst, std::uint64_t addr, std::uint64_t bytes) {
  std::lock_guard lock(g_mutex);
  const CUpti_ActivityUnifiedMemoryCounterKind kind =
      src < 0   ? CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD
      : dst < 0 ? CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH
                : CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOD;
  um_record(kind, bytes, addr, id_of(src), id_of(dst));
}
const fakecuda_activity_sink_t kSink{on_kernel_begin, on_fault, on_kernel_end, on_migration};

std::size_t record_size(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return (sizeof(CUpti_ActivityKernel10) + 7) & ~std::size_t{7};
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: return (sizeof(CUpti_ActivityExternalCorrelation) + 7) & ~std::size_t{7};
    case CUPTI_ACTIVITY_KIND_DRIVER:
    case CUPTI_ACTIVITY_KIND_RUNTIME: return (sizeof(CUpti_ActivityAPI) + 7) & ~std::size_t{7};
    case CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER:
      return (sizeof(CUpti_ActivityUnifiedMemoryCounter3) + 7) & ~std::size_t{7};
    default: return 0;
  }
}

}  // namespace

FAKECUPTI_EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                             CUpti_BuffersCallbackCompleteFunc completed) {
  if (failing("cuptiActivityRegisterCallbacks")) return CUPTI_ERROR_UNKNOWN;
  if (requested == nullptr || completed == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard lock(g_mutex);
  g_requested = requested;
  g_completed = completed;
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  if (failing("cuptiActivityEnable")) return CUPTI_ERROR_UNKNOWN;
  if (kind < 0 || kind >= 64) return CUPTI_ERROR_INVALID_KIND;
  {
    std::lock_guard lock(g_mutex);
    g_enabled[kind] = true;
  }
  fakecuda_set_activity_sink(&kSink);
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  if (kind < 0 || kind >= 64) return CUPTI_ERROR_INVALID_KIND;
  std::lock_guard lock(g_mutex);
  g_enabled[kind] = false;
  return CUPTI_SUCCESS;
}

// Only the ids the fake's launches make count (its launches are all cuLaunchKernel-like;
// the runtime's reach the driver's): cuLaunchKernel, cudaLaunchKernel.
FAKECUPTI_EXPORT CUptiResult cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
  if (failing("cuptiActivityEnableDriverApi")) return CUPTI_ERROR_UNKNOWN;
  std::lock_guard lock(g_mutex);
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel) g_driver_launch_api = enable != 0;
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
  std::lock_guard lock(g_mutex);
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000) g_runtime_launch_api = enable != 0;
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityConfigureUnifiedMemoryCounter(CUpti_ActivityUnifiedMemoryCounterConfig* config,
                                                                         uint32_t count) {
  if (failing("cuptiActivityConfigureUnifiedMemoryCounter")) return CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED;
  if (config == nullptr || count == 0) return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard lock(g_mutex);
  for (uint32_t i = 0; i < count; ++i) {
    if (config[i].kind <= 0 || config[i].kind >= 16) return CUPTI_ERROR_INVALID_PARAMETER;
    g_counter[config[i].kind] = config[i].enable != 0;
  }
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
  if (kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return CUPTI_ERROR_INVALID_PARAMETER;
  t_external.push_back(id);
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t* id) {
  if (kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return CUPTI_ERROR_INVALID_PARAMETER;
  if (t_external.empty()) return CUPTI_ERROR_QUEUE_EMPTY;
  if (id != nullptr) *id = t_external.back();
  t_external.pop_back();
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityFlushAll(uint32_t) {
  std::vector<unsigned char> records;
  CUpti_BuffersCallbackRequestFunc requested;
  CUpti_BuffersCallbackCompleteFunc completed;
  {
    std::lock_guard lock(g_mutex);
    records.swap(g_pending);
    requested = g_requested;
    completed = g_completed;
  }
  if (requested == nullptr || completed == nullptr || records.empty()) return CUPTI_SUCCESS;
  std::size_t at = 0;
  while (at < records.size()) {
    uint8_t* buffer = nullptr;
    size_t size = 0, max_records = 0;
    requested(&buffer, &size, &max_records);
    if (buffer == nullptr || size == 0) return CUPTI_ERROR_UNKNOWN;  // the records are dropped, as CUPTI drops them
    std::size_t n = 0;
    while (at + n < records.size()) {  // whole records only
      const std::size_t s = record_size(reinterpret_cast<const CUpti_Activity*>(records.data() + at + n)->kind);
      if (n + s > size) break;
      n += s;
    }
    std::memcpy(buffer, records.data() + at, n);
    completed(nullptr, 0, buffer, size, n);
    at += n;
    if (n == 0) break;
  }
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  if (buffer == nullptr || record == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::size_t at = 0;
  if (*record != nullptr) {
    at = static_cast<std::size_t>(reinterpret_cast<uint8_t*>(*record) - buffer) + record_size((*record)->kind);
  }
  if (at >= valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(buffer + at);
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc, void*) {
  std::lock_guard lock(g_mutex);
  if (g_subscribed) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  g_subscribed = true;
  if (subscriber != nullptr) *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(1);
  return CUPTI_SUCCESS;
}

FAKECUPTI_EXPORT CUptiResult cuptiGetResultString(CUptiResult, const char** str) {
  if (str != nullptr) *str = "fake CUPTI";
  return CUPTI_SUCCESS;
}
