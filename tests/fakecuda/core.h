// fakecuda core: the state behind the fake CUDA driver (libcuda.so.1) used by Spillway's
// GPU-less tests — configuration from FAKECUDA_* variables (and CUDA_VISIBLE_DEVICES), the
// per-call log and failure injection, the devices, the allocation registry, contexts,
// streams, events and modules, and the optional simulated GPU residency of managed memory
// (FAKECUDA_GPU_MEMORY, residency.cpp).
// Types and constants come from the CUDA 13.0 cuda.h; behaviour follows the driver API
// reference (see README.md in this directory for what is faked and what is left out).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1  // declares every versioned name (_v2, _ptsz, v1 ABIs)
#pragma GCC visibility push(default)     // the CUDA entry points we define are exported
#include <cuda.h>
#pragma GCC visibility pop

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace fakecuda {

// ---- configuration (FAKECUDA_* environment variables) -------------------------------
struct FailRule {
  std::string name;       // exported symbol or base name
  uint64_t nth = 0;       // 1-based call number that fails
  int code = 0;           // 0: family default (OOM for allocations, UNKNOWN otherwise)
};

constexpr int kMaxDevices = 8;  // FAKECUDA_DEVICES is 1..8

struct Config {
  int devices = 1;                         // FAKECUDA_DEVICES: physical devices
  std::vector<int> visible{0};             // CUDA_VISIBLE_DEVICES: physical ordinal of each visible one
  uint64_t total_memory = 17179869184ull;  // FAKECUDA_TOTAL_MEMORY (each device)
  int concurrent_managed_access = 1;       // FAKECUDA_CONCURRENT_MANAGED_ACCESS
  bool async = false;                      // FAKECUDA_ASYNC
  int log_fd = -1;                         // FAKECUDA_LOG (O_APPEND)
  std::vector<FailRule> fail;              // FAKECUDA_FAIL
  uint64_t gpu_memory = 0;                 // FAKECUDA_GPU_MEMORY (each device): 0 = no residency model
  std::string stats_path;                  // FAKECUDA_STATS: residency counters at exit
};
const Config& config();
void reload_config();  // re-reads the environment (tests); resets failure counters and contexts

// ---- devices: ordinals are the visible ones (0..device_count()-1, CUDA_VISIBLE_DEVICES order) --
int device_count();
bool valid_device(int device);
int physical_ordinal(int device);  // -1 for an ordinal that is not visible

// ---- one driver call: log line + failure injection -----------------------------------
enum CallFlags : unsigned {
  kNone = 0,
  kNoInit = 1,   // allowed before cuInit
  kCtx = 2,      // needs a current context
  kAlloc = 4,    // injected failures default to CUDA_ERROR_OUT_OF_MEMORY
};

class Call {
 public:
  Call(const char* symbol, const char* base, unsigned flags);
  Call& hex(const char* key, uint64_t v);
  Call& ptr(const char* key, const void* p) { return hex(key, reinterpret_cast<uintptr_t>(p)); }
  Call& dec(const char* key, uint64_t v);
  Call& sdec(const char* key, int64_t v);
  Call& str(const char* key, const char* s);
  Call& stream(CUstream s);  // stream=0x.. capturing=0|1
  CUresult check();          // cuInit done, injected failure, current context
  CUresult finish(CUresult r);

 private:
  const char* symbol_;
  const char* base_;
  unsigned flags_;
  bool logging_;  // FAKECUDA_LOG is set: the arguments are formatted into line_ (else not)
  std::string line_;
};

// Runs body(Call&) with no exception escaping; logs "<symbol> k=v ... -> <result>".
template <class F>
CUresult api(const char* symbol, const char* base, unsigned flags, F&& body) {
  Call c(symbol, base, flags);
  CUresult r;
  try {
    r = body(c);
  } catch (const std::exception&) {
    // Only the fake's own errors (std::bad_alloc, std::out_of_range, ...) become an error
    // code. Thread cancellation (glibc's forced unwind, a foreign exception) matches no
    // typed handler and unwinds through, as through any C code; catching it by
    // `abi::__forced_unwind&` would bind a reference to no object (UBSan: "reference
    // binding to null pointer").
    r = CUDA_ERROR_UNKNOWN;
  }
  return c.finish(r);
}
#define FC_CHECK(c) \
  if (CUresult fc_r_ = (c).check(); fc_r_ != CUDA_SUCCESS) return fc_r_

bool initialized();
void set_initialized();

// ---- allocations ----------------------------------------------------------------------
enum class Kind { Device, Managed, Host, Vmm };
const char* kind_name(Kind k);

struct Alloc {
  uintptr_t base = 0;
  size_t size = 0;
  Kind kind = Kind::Device;
  uint64_t id = 0;         // BUFFER_ID
  void* map = nullptr;     // mmap'd region (nullptr for VMM mappings)
  size_t map_len = 0;
  CUmemoryPool pool = nullptr;
  int device = 0;          // DEVICE_ORDINAL: the device it is on / was made on
  CUcontext ctx = nullptr; // CONTEXT: the context current when it was made
};

// mmap-backed allocation; device-kind sizes count against `device`'s FAKECUDA_TOTAL_MEMORY.
CUresult alloc(Kind kind, size_t size, CUdeviceptr* out, int device, CUcontext ctx, CUmemoryPool pool = nullptr);
CUresult release(uintptr_t base, bool (*accept)(Kind));  // base must be an allocation start
bool find(uintptr_t p, Alloc* out);                         // allocation containing p
bool covers(uintptr_t p, size_t n, bool (*accept)(Kind), Alloc* out = nullptr);
void add_vmm_mapping(uintptr_t base, size_t size, int device, CUcontext ctx);
bool remove_vmm_mapping(uintptr_t base);
uint64_t device_bytes_used(int device);
bool reserve_device_bytes(int device, size_t n);  // VMM physical handles
void release_device_bytes(int device, size_t n);
// cuCtxDestroy: frees what cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged and cuMemAllocHost
// made in ctx (not pool allocations, not VMM).
void release_context_allocations(CUcontext ctx);
// Whether any live managed allocation overlaps [lo, hi).
bool managed_overlaps(uintptr_t lo, uintptr_t hi);

// ---- simulated GPU residency (residency.cpp; only while FAKECUDA_GPU_MEMORY is set) ------
// Per 2 MiB chunk of the address space (address >> 21, the driver's VA block), for managed
// memory only: fresh (never touched), on the CPU, or on one GPU (a visible ordinal). Each
// GPU holds FAKECUDA_GPU_MEMORY / 2 MiB chunks; past that the oldest-migrated chunk not used
// by the current operation is evicted to the CPU (uvm_pmm_gpu.c's root-chunk list, updated
// on migration, not on access). Every call is a no-op while the model is off. `caller` is
// the device of the calling context's stream: counters of work with no GPU of its own
// (a prefetch to the host, a discard) go to it.
constexpr uint64_t kChunkShift = 21;
void residency_reset(const Config& cfg);                     // config (re)load: forget all
void residency_alloc(uintptr_t base, size_t size);           // managed allocation made
void residency_free(uintptr_t base, size_t size);            // managed allocation released
// cuMemPrefetchAsync, executed: to GPU `device`, or to the host when device < 0.
void residency_prefetch(uintptr_t p, size_t n, int device, int caller);
void residency_discard(uintptr_t p, size_t n, int caller);   // cuMemDiscardBatchAsync, executed
// cuMemAdvise, accepted; device: the location's GPU, or -1 for a host location.
void residency_advise(uintptr_t p, size_t n, CUmem_advise advice, int device);
// A managed range a launch uses, and whether it writes it.
struct TouchedRange {
  uintptr_t base;
  size_t size;
  bool write;
};
// A launch that executes on GPU `device`: `ranges` are the managed ranges it uses; every chunk
// of each is touched there.
void residency_launch(int device, const std::vector<TouchedRange>& ranges);

// ---- contexts, streams and events ---------------------------------------------------------
// A context is on one device and has its own legacy default stream (NULL, CU_STREAM_LEGACY
// and CU_STREAM_PER_THREAD name the current context's). Streams and events belong to the
// context current when they were made. One primary context per visible device (a handle
// that never changes, so a reload keeps it valid), and any number from cuCtxCreate.
// Everything here is guarded by stream_mutex() unless said otherwise.
struct Context;
struct Stream;
struct Event {
  bool timing = true;
  bool recorded = false;
  bool complete = true;
  Stream* stream = nullptr;
  uint64_t ticket = 0;  // FAKECUDA_ASYNC: its record's place in stream's work (Stream::enqueued)
  Context* ctx = nullptr;
  std::chrono::steady_clock::time_point when{};
};
struct Stream {
  Context* ctx = nullptr;
  bool capturing = false;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  uint64_t capture_id = 0;  // the capture in progress (1, 2, ... per process)
  unsigned flags = 0;
  int priority = 0;
  // ASYNC mode: work not yet complete, in order. An op is an event to complete, a
  // deferred free, or plain work (launch, prefetch, ...).
  struct Op {
    Event* event = nullptr;
    uintptr_t free_base = 0;
    // cuStreamWaitEvent of a pending event: before this op, `wait_stream` completes its
    // work up to its op number `wait_upto` (the event's record), as a device would.
    Stream* wait_stream = nullptr;
    uint64_t wait_upto = 0;
  };
  std::deque<Op> pending;
  uint64_t enqueued = 0;   // ops queued so far (ASYNC mode)
  uint64_t completed = 0;  // ... and run
};

struct Context {
  int device = 0;      // visible ordinal
  bool primary = false;
  unsigned flags = 0;  // cuCtxCreate's, or cuDevicePrimaryCtxSetFlags'
  int refcount = 0;    // primary: cuDevicePrimaryCtxRetain minus Release
  Stream legacy;       // its legacy default stream
};

std::mutex& stream_mutex();  // guards every Context, Stream and Event
CUcontext primary_context(int device);   // the same handle for the life of the process
Context* live_context(CUcontext ctx);    // nullptr unless ctx is a context that exists now
CUcontext current_context();             // top of the calling thread's stack (no lock; may be destroyed)
Context* current();                      // the calling thread's current context, if it exists
CUresult check_current();                // locks: INVALID_CONTEXT (none) or CONTEXT_IS_DESTROYED
int current_device();                    // locks: the current context's device, -1 if none
Context* create_context(int device, unsigned flags);  // cuCtxCreate
bool destroy_context(CUcontext ctx);     // cuCtxDestroy: created contexts only
// The end of a primary context (cuDevicePrimaryCtxReset, the last cuDevicePrimaryCtxRelease):
// its work completes, its streams, events and allocations (but pool and VMM memory) go; the
// handle, its retains, flags and modules stay. With stream_mutex() held.
void end_primary_context(int device);
void set_current_context(CUcontext ctx);  // replaces top of the thread's stack (no lock)
void push_context(CUcontext ctx);
bool pop_context(CUcontext* out);
CUstreamCaptureMode& thread_capture_mode();

Stream* lookup_stream(CUstream s);  // nullptr, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD → current()'s
Stream* new_stream(Context* ctx);
bool delete_stream(CUstream s);
bool is_default_stream(CUstream s);
Event* lookup_event(CUevent e);
Event* new_event(Context* ctx);
bool delete_event(CUevent e);
// Adds work to a stream: completed now (synchronous mode) or at the next synchronize.
void enqueue(Stream* s, Stream::Op op);
// ASYNC mode: `s` waits for `e`'s record (cuStreamWaitEvent): its later work completes only
// after the work before that record on e's stream. No-op for a complete event.
void enqueue_wait(Stream* s, Event* e);
void complete(Stream* s, Event* upto = nullptr);  // drains s (up to and including upto)
void complete_context(Context* ctx);              // every stream of ctx (cuCtxSynchronize)
bool any_pending(Stream* s);

// ---- modules ------------------------------------------------------------------------------
struct Function {
  std::string name;
  std::vector<size_t> sizes, offsets;
};
struct Module {
  std::vector<Function> functions;  // as parsed
  // The CUfunction/CUkernel handles, filled by register_module(). Like a real driver's, the
  // handles of an unloaded module are given out again, most recently freed first, so that
  // tests can provoke a handle that names another kernel after a reload.
  std::vector<Function*> handles;
};
bool parse_module(const char* image, Module* out);
bool valid_module(CUmodule m);
bool valid_function(CUfunction f);
void register_module(Module* m);
void unregister_module(Module* m);

// Generic registry of opaque handles (graphs, pools, VMM handles), each with two values.
void* new_handle(const char* kind, uint64_t value = 0, uint64_t aux = 0);
bool handle_is(const void* h, const char* kind, uint64_t* value = nullptr, uint64_t* aux = nullptr);
bool delete_handle(const void* h, const char* kind);

}  // namespace fakecuda
