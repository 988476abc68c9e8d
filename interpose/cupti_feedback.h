// Fault feedback through CUPTI (docs/configuration.md, "Fault feedback"):
// the GPU page faults the driver reports in CUPTI's unified-memory activity, attributed to
// the shim's launches, for the CudaBackend to hand to the Engine (Backend::take_faults).
//
// How (CUPTI Activity API, cupti_activity.h of CUDA 13.0):
//   * libcupti is resolved at run time, never linked: the copy the process already has
//     loaded (a framework's, e.g. PyTorch's nvidia-cuda-cupti wheel) by RTLD_NOLOAD, else
//     `libcupti.so.13`, `libcupti.so.12`, `libcupti.so` through the loader's search path,
//     else the toolkit's (`$CUDA_HOME`/`/usr/local/cuda`, `extras/CUPTI/lib64` and `lib64`);
//   * activity kinds UNIFIED_MEMORY_COUNTER (counters GPU_PAGE_FAULT, BYTES_TRANSFER_HTOD,
//     BYTES_TRANSFER_DTOH, scope PROCESS_SINGLE_DEVICE for the current device), CONCURRENT_KERNEL
//     (which, unlike KIND_KERNEL, does not serialise kernels) and EXTERNAL_CORRELATION, and
//     API records for the launch calls (cuptiActivityEnableDriverApi/RuntimeApi for the
//     cuLaunchKernel*/cudaLaunchKernel* callback ids; without those functions, the whole
//     DRIVER and RUNTIME kinds): CUPTI writes an external correlation record only before an
//     API activity record made inside the pushed region;
//   * the launch hook pushes the launch's Launch::seq as a CUSTOM0 external correlation id
//     around the driver's (or runtime's) launch call, so the call's API record — and, by its
//     correlation id, the kernel's record — names it;
//   * a GPU page fault (its `start`: when the driver began servicing it, while the faulting
//     kernel is stalled) is attributed to every kernel of its device whose [start, end]
//     holds that time, once per (launch, 2 MiB chunk); its record's streamId is documented
//     as invalid. A fault that arrives before its kernel's record waits for it (at most
//     kMaxWaiting, then the oldest go); one covered only by kernels the shim did not bracket
//     is dropped;
//   * records arrive when the launch hook flushes (cuptiActivityFlushAll, at most every
//     kFlushPeriodMs, never under the Engine's lock; CUPTI's periodic flush would return
//     only full buffers).
// Off (state() says why) when: SPILLWAY_FAULT_FEEDBACK=off or the policy does not learn from
// faults (the Engine never asks); the shim was built without cupti_activity.h; libcupti is
// not found or lacks a function; a CUPTI call fails; CUDA_INJECTION64_PATH is set (a CUPTI
// injection client: Nsight Systems or Compute); another client registers activity
// callbacks or subscribes to callbacks (the shim's exported cuptiActivityRegisterCallbacks /
// cuptiSubscribe see that call first when the client is linked to libcupti: feedback stops —
// after a start in progress has finished, its activity kinds and API records disabled, its
// buffers flushed — before the call goes on to CUPTI). A client that enabled activity kinds
// before registering its callbacks loses those of the shim's kinds it had enabled itself
// (CUPTI keeps one switch per kind). After exit() has begun, CUPTI's buffers are handed back
// unread.
//
// Thread-safe. Memory: bounded (kMaxKernels kernel records, kMaxWaiting faults, the queue
// of attributed faults at kMaxQueued).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spillway/types.h"

namespace spillway::interpose {

class CuptiFeedback {
 public:
  static constexpr std::size_t kMaxKernels = 1u << 14;
  static constexpr std::size_t kMaxWaiting = 1u << 16;
  static constexpr std::size_t kMaxQueued = 1u << 20;
  static constexpr std::uint32_t kFlushPeriodMs = 10;

  // Starts CUPTI activity collection for `device` once (later calls return the first
  // outcome). True when feedback is on.
  static bool start(int device);
  // Whether start() has run (or another client stopped feedback before it could). Lock-free.
  static bool tried();
  // Whether records may come (started, and not stopped since).
  static bool active();
  // Brackets the driver's launch call on the calling thread (no-ops while inactive).
  static void begin_launch(std::uint64_t seq);
  static void end_launch();
  // Moves the attributed faults that arrived into `out` (appended); returns how many.
  static std::size_t take(std::vector<FaultRecord>& out);
  static std::string state();
  static void migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host);
  // Another CUPTI client appeared (the exported CUPTI hooks): stop for good, after a start
  // in progress has finished. `why` names it.
  static void stop_for_other_client(const char* why);
};

}  // namespace spillway::interpose
