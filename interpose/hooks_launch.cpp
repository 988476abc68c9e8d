// Launch observation (docs/design.md, "One launch, hook to Backend"): the launch hooks of hooks.def.
//
// Per launch, before the real launch:
//  1. The kernel's parameter layout and name (kernel_info.h): read once per handle and code
//     generation through cuFuncGetParamInfo (CUDA 12.4+) into a lock-free cache; the
//     generation is part of the execution id, so durations learned for a kernel whose code
//     was unloaded do not describe the one that reuses its handle.
//  2. Every 8-byte-aligned word of every parameter of 8 bytes or more (pointers passed
//     directly and pointers inside by-value structs) is looked up in the allocation table:
//     first the Engine's lock-free address bounds, then Engine::find.
//  3. The footprint: spillway/footprint.h's rule (the
//     simulator applies the same one): for each pointer p found in a block B, the range from
//     p to the next pointer found in B by this launch, else to B's end; a pointer into the
//     middle of B is further bounded to kInteriorExtent bytes. The Engine turns ranges into
//     chunks.
//  4. On a capturing stream nothing is issued and the Engine is not called (the kernel does
//     not run now): the footprint joins the capture, and cuGraphLaunch is one launch with the
//     union of the footprints captured into its graph, restricted to blocks still live
//     (capture_registry.h, which also says how captured frees follow their graph). A graph
//     built without capture (explicit node APIs) is launched with an empty footprint.
//     Stream-ordered allocations on a capturing stream are left to the driver (graph memory
//     nodes, hooks_driver.cpp).
//  5. Engine::launch(Launch{...}) with a LaunchOrderScope (cuda_backend.h: the shim's own
//     streams are ordered after the launching stream with events), then the real launch.
//  6. Durations: 1 launch in kSampleEvery per execution id (direct-mapped table) is timed
//     with two events on the launching stream; completed samples are collected without
//     blocking on later launches (cuEventQuery) and feed Launch::dur_ns for that id.
//
// The runtime's cudaLaunchKernel/cudaLaunchKernelExC (shared libcudart only) map the host
// stub to its CUfunction with cudaGetFuncBySymbol when the runtime has it; the driver launch
// the runtime makes underneath is then not observed a second time. Without a CUfunction the
// launch is observed with an empty footprint (the args array's length is unknown).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "capture_registry.h"
#include "cuda_backend.h"
#include "driver_helpers.h"
#include "duration_samples.h"
#include "kernel_info.h"
#include "shim.h"
#include "torch_tracker.h"
#include "spillway/footprint.h"
#include "spillway/log.h"

namespace spillway::hook {

using interpose::FuncInfo;
using interpose::info_for;
using interpose::real;
using interpose::stub_info;

namespace {

constexpr std::size_t kMaxHits = 64;                    // pointers per launch beyond this are ignored
constexpr std::size_t kMaxParams = 1024;

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}


// ---- footprint ---------------------------------------------------------------------------

struct Footprint {
  std::array<ArgumentHit, kMaxHits> hits;
  std::size_t count = 0;
  std::uint64_t exec_id = 0;
  std::array<Access, kMaxHits> accesses;
  std::size_t naccesses = 0;

  void look_up(Engine& e, std::uint64_t word) {
    if (!e.maybe_managed(word) || count == kMaxHits) return;
    for (std::size_t i = 0; i < count; ++i) {
      if (hits[i].ptr == word) return;
    }
    std::optional<Block> b = e.find_extent(word);  // (a followed tensor: its own extent)
    if (!b) return;
    hits[count++] = ArgumentHit{word, b->base, b->end()};
    exec_id = mix(exec_id, word);
  }

  void scan(Engine& e, const unsigned char* p, std::uint32_t offset, std::uint32_t size) {
    for (std::uint32_t o = (8 - offset % 8) % 8; o + 8 <= size; o += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + o, 8);
      look_up(e, w);
    }
  }

  // The rule of the file comment, step 3.
  void build() { naccesses = footprint_of(std::span<ArgumentHit>(hits.data(), count), accesses); }
};

void collect(Engine& e, const FuncInfo& fn, void** params, void** extra, Footprint& fp) {
  // The kernel's identity: its CUfunction, or for a runtime host stub the runtime could not
  // map, the stub itself (distinct kernels must not share one id).
  fp.exec_id = mix(fn.generation, fn.function != nullptr ? reinterpret_cast<std::uintptr_t>(fn.function)
                                                         : reinterpret_cast<std::uintptr_t>(fn.key));
  const unsigned char* buffer = nullptr;
  std::size_t buffer_size = 0;
  if (params == nullptr) {
    for (void** x = extra; x != nullptr && x[0] != CU_LAUNCH_PARAM_END; x += 2) {
      if (x[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = static_cast<const unsigned char*>(x[1]);
      else if (x[0] == CU_LAUNCH_PARAM_BUFFER_SIZE && x[1] != nullptr) buffer_size = *static_cast<size_t*>(x[1]);
      else break;
    }
  }
  if (fn.layout_known) {
    for (const FuncInfo::Param& prm : fn.params) {
      const unsigned char* p = nullptr;
      if (params != nullptr) p = static_cast<const unsigned char*>(params[prm.index]);
      else if (buffer != nullptr && prm.offset + prm.size <= buffer_size) p = buffer + prm.offset;
      if (p != nullptr) fp.scan(e, p, prm.offset, prm.size);
    }
  }
  // Without a layout nothing is scanned: neither the length of kernelParams nor the real
  // size of an `extra` buffer is known (its claimed CU_LAUNCH_PARAM_BUFFER_SIZE may exceed
  // it; the driver checks it against the kernel's layout and refuses the launch).
  fp.build();
}

// After a graph launch the driver accepted: the frees captured into it are carried out,
// stream-ordered after the launch; a launch into a capture makes the graph a node of that
// capture, whose frees they become.
void release_captured_frees(CUgraphExec exec, CUstream stream) {
  std::vector<CUdeviceptr> blocks = interpose::capture_registry().take_frees(exec);
  if (blocks.empty()) return;
  bool capturing = false;
  std::uint64_t capture = 0;
  const bool asked = interpose::capture_of(stream, &capturing, &capture) == CUDA_SUCCESS;
  if (asked && capturing) {
    for (CUdeviceptr p : blocks) interpose::capture_registry().defer_free(capture, p);
    return;
  }
  Engine* e = interpose::engine();
  if (e == nullptr) return;
  const std::optional<bool> not_capturing = asked ? std::optional<bool>(false) : std::nullopt;  // asked once
  for (CUdeviceptr p : blocks) {
    bool ours = false;
    e->release(p, reinterpret_cast<StreamHandle>(stream), &ours, not_capturing);
  }
}

// ---- the common path ---------------------------------------------------------------------

thread_local bool t_in_runtime_launch = false;
std::atomic<std::uint64_t> g_seq{0};

// What a launch hook does before the real launch; its destructor (after the real launch)
// finishes a duration sample.
class Observation {
 public:
  // `stream`: the program's stream, already mapped (per-thread default stream for _ptsz).
  Observation(CUfunction function, const void* stub, CUgraphExec exec, CUstream stream, void** params, void** extra) {
    Engine* e = interpose::engine();
    if (e == nullptr || e->managed_bytes() == 0 || t_in_runtime_launch) return;
    // Under the framework's own allocator, its trace is followed once it can be (here no
    // allocator lock is held: the point for a process with several devices).
    if (!e->config().framework_per_tensor) interpose::maybe_attach_torch_tracker(*e, interpose::AttachPoint::launch);
    const FuncInfo* fn = function != nullptr ? info_for(function) : stub != nullptr ? stub_info(stub) : nullptr;
    const std::uint64_t graph_key = reinterpret_cast<std::uintptr_t>(exec);
    poll_samples();
    Footprint& fp = footprint();
    fp.count = 0;
    fp.naccesses = 0;
    const std::vector<Access>* graph = nullptr;
    std::vector<Access>& graph_acc = graph_accesses();
    if (fn != nullptr) {
      collect(*e, *fn, params, extra, fp);
    } else {
      fp.exec_id = mix(0x6772617068ull, graph_key);
      interpose::capture_registry().exec_footprint(exec, graph_acc);
      // Only blocks still live, clipped to them.
      std::size_t k = 0;
      for (const Access& a : graph_acc) {
        std::optional<Block> b = e->find(a.addr);
        if (!b) continue;
        graph_acc[k++] = Access{a.addr, std::min(a.bytes, b->end() - a.addr), false};
      }
      graph_acc.resize(k);
      graph = &graph_acc;
    }
    SPILLWAY_LOG_ONCE(LogLevel::debug, "first observed launch: {} via the {} API, {} pointer-sized parameters, {} accesses",
                      fn != nullptr ? fn->name : std::string("a graph"), function != nullptr ? "driver" : "runtime",
                      fn != nullptr ? fn->params.size() : 0, fp.naccesses);
    if (interpose::capture_registry().capturing(stream)) {
      if (fn != nullptr) interpose::capture_registry().add_footprint(stream, std::span<const Access>(fp.accesses.data(), fp.naccesses));
      return;  // nothing issued, the Engine not asked: the kernel does not run now
    }
    bool sample = false;
    Launch l;
    l.seq = g_seq.fetch_add(1, std::memory_order_relaxed);
    l.name = fn != nullptr ? std::string_view(fn->name) : std::string_view("graph");
    l.exec_id = fp.exec_id;
    l.accesses = graph != nullptr ? std::span<const Access>(*graph) : std::span<const Access>(fp.accesses.data(), fp.naccesses);
    l.dur_ns = duration_of(fp.exec_id, &sample);
    l.now_ns = interpose::steady_now_ns();
    // One cuCtxGetCurrent for the whole hook: the context is registered for the fences here
    // (note_context, its device from the thread's cache), so neither the launching streams'
    // note nor the work noted after the launch asks the driver again. (No context yet: the
    // runtime may make its primary context current inside the launch, so the work noted
    // after it asks again and registers that one.)
    const Backend::ContextAndDevice current = interpose::backend_instance().current_context_and_device();
    l.device = current.device;
    context_noted_ = current.context != 0;
    // Fault feedback (cupti_feedback.h): started before the first launch the Engine plans,
    // outside its lock; the kernel's CUPTI record is tied to l.seq while it is issued.
    if (e->wants_fault_feedback() && interpose::backend_instance().start_fault_feedback()) bracketed_ = true;
    {
      interpose::LaunchOrderScope order(stream);
      in_flight_.emplace(e->launch_in_flight(l));
    }
    if (sample) start_sample(fp.exec_id, stream);
    // Last: from here the destructor runs and pops the id (a constructor that throws runs none).
    if (bracketed_) interpose::backend_instance().begin_launch(l.seq);
  }

  ~Observation() {
    if (bracketed_) interpose::backend_instance().end_launch();
    in_flight_.reset();  // the kernel is issued (or failed): its chunks may be evicted again
    if (start_ == nullptr) return;
    interpose::ShimCallScope scope;
    if (!launched_ok_ || real().cuEventRecord(end_, stream_) != CUDA_SUCCESS) {
      give_event(start_);
      give_event(end_);
      return;
    }
    add_sample(exec_id_, start_, end_);
  }

  template <typename R>
  R done(R r, R ok) {
    launched_ok_ = r == ok;
    return r;
  }
  // After a launch the driver accepted on `stream`: the work is noted for the fences
  // (stream_registry.h), without asking for the context again when this hook registered it.
  void note_work(CUstream stream) const {
    if (context_noted_) interpose::note_stream_work_in_noted_context(stream);
    else interpose::note_stream_work(stream);
  }

 private:
  static Footprint& footprint() {
    thread_local Footprint fp;
    return fp;
  }
  static std::vector<Access>& graph_accesses() {
    thread_local std::vector<Access> v;
    return v;
  }

  void start_sample(std::uint64_t exec_id, CUstream stream) {
    interpose::ShimCallScope scope;
    CUevent a = take_event(), b = take_event();
    if (a == nullptr || b == nullptr || real().cuEventRecord(a, stream) != CUDA_SUCCESS) {
      give_event(a);
      give_event(b);
      return;
    }
    start_ = a;
    end_ = b;
    stream_ = stream;
    exec_id_ = exec_id;
  }

  std::optional<Engine::LaunchInFlight> in_flight_;
  CUevent start_ = nullptr, end_ = nullptr;
  CUstream stream_ = nullptr;
  std::uint64_t exec_id_ = 0;
  bool launched_ok_ = false;
  bool bracketed_ = false;  // begin_launch() was called: end_launch() is owed
  bool context_noted_ = false;  // the calling thread's current context is registered
};



template <typename Fn>
CUresult observed_launch(CUfunction f, CUstream stream, void** params, void** extra, Fn&& call) {
  if (f == nullptr) return call();
  Observation obs(f, nullptr, nullptr, stream, params, extra);
  const CUresult r = call();
  if (r == CUDA_SUCCESS) obs.note_work(stream);
  return obs.done(r, CUDA_SUCCESS);
}

template <typename Fn>
cudaError_t observed_runtime_launch(const void* stub, CUstream stream, void** args, Fn&& call) {
  if (stub == nullptr || t_in_runtime_launch) return call();
  Observation obs(nullptr, stub, nullptr, stream, args, nullptr);
  t_in_runtime_launch = true;
  cudaError_t r = call();
  t_in_runtime_launch = false;
  if (r == cudaSuccess) obs.note_work(stream);
  return obs.done(r, cudaSuccess);
}

// (The launching streams' lock held: cuda_backend.h, note_capture_begun_locked.)
// PyTorch with its cache off (PYTORCH_NO_CUDA_MEMORY_CACHING set: `spillway run`'s
// per-tensor mode) allocates with plain cudaMalloc, which it does on purpose "to force an
// error if someone tries to use forceUncachedAllocator while capturing"
// (c10/cuda/CUDACachingAllocator.cpp): a graph capture then fails in the program, so say
// which setting to change before it does.
void warn_if_capture_meets_uncached_pytorch() {
  const char* uncached = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
  if (uncached == nullptr || *uncached == '\0') return;
  SPILLWAY_LOG_ONCE(LogLevel::warn,
                    "a CUDA graph is being captured while PYTORCH_NO_CUDA_MEMORY_CACHING is set (spillway run's "
                    "per-tensor mode): PyTorch cannot allocate during a capture then; run with "
                    "--framework-allocator keep (docs/configuration.md, \"When to use keep\")");
}

CUresult begin_capture(CUstream stream, CUresult r) {
  if (r != CUDA_SUCCESS) return r;
  warn_if_capture_meets_uncached_pytorch();
  interpose::note_capture_begun_locked(stream);
  interpose::capture_registry().begun(stream);
  return r;
}

// `capture`: the id of the capture the stream was in before the real end call.
CUresult end_capture(CUstream stream, CUgraph* graph, CUresult r, std::uint64_t capture) {
  interpose::note_capture_ended(stream);
  interpose::capture_registry().ended(stream, graph, r, capture);
  return r;
}

}  // namespace

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params, void** extra) {
  return observed_launch(f, s, params, extra,
                         [&] { return real().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra); });
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params,
                             void** extra) {
  return observed_launch(f, interpose::per_thread(s), params, extra,
                         [&] { return real().cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra); });
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return real().cuLaunchKernelEx(config, f, params, extra);
  return observed_launch(f, config->hStream, params, extra, [&] { return real().cuLaunchKernelEx(config, f, params, extra); });
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return real().cuLaunchKernelEx_ptsz(config, f, params, extra);
  return observed_launch(f, interpose::per_thread(config->hStream), params, extra,
                         [&] { return real().cuLaunchKernelEx_ptsz(config, f, params, extra); });
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                   unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params) {
  return observed_launch(f, s, params, nullptr,
                         [&] { return real().cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params); });
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                        CUstream s, void** params) {
  return observed_launch(f, interpose::per_thread(s), params, nullptr, [&] {
    return real().cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params);
  });
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
  if (exec == nullptr) return real().cuGraphLaunch(exec, s);
  CUresult r;
  {
    Observation obs(nullptr, nullptr, exec, s, nullptr, nullptr);
    r = obs.done(real().cuGraphLaunch(exec, s), CUDA_SUCCESS);
  }
  if (r == CUDA_SUCCESS) interpose::note_stream_work(s);
  if (r == CUDA_SUCCESS) release_captured_frees(exec, s);
  return r;
}

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
  if (exec == nullptr) return real().cuGraphLaunch_ptsz(exec, s);
  CUresult r;
  {
    Observation obs(nullptr, nullptr, exec, interpose::per_thread(s), nullptr, nullptr);
    r = obs.done(real().cuGraphLaunch_ptsz(exec, s), CUDA_SUCCESS);
  }
  if (r == CUDA_SUCCESS) interpose::note_stream_work(interpose::per_thread(s));
  if (r == CUDA_SUCCESS) release_captured_frees(exec, interpose::per_thread(s));
  return r;
}

// (The launching streams' lock: no eviction orders itself after other streams meanwhile.)
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  auto streams = interpose::lock_launch_streams();
  interpose::note_capture_beginning_locked(s);
  return begin_capture(s, real().cuStreamBeginCapture_v2(s, mode));
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  auto streams = interpose::lock_launch_streams();
  interpose::note_capture_beginning_locked(interpose::per_thread(s));
  return begin_capture(interpose::per_thread(s), real().cuStreamBeginCapture_v2_ptsz(s, mode));
}

// Captures into an existing graph count as captures like the others (no fence, no event on
// a capturing stream while they run).
CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                     size_t n, CUstreamCaptureMode mode) {
  auto streams = interpose::lock_launch_streams();
  interpose::note_capture_beginning_locked(s);
  return begin_capture(s, real().cuStreamBeginCaptureToGraph(s, g, deps, data, n, mode));
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                          size_t n, CUstreamCaptureMode mode) {
  auto streams = interpose::lock_launch_streams();
  interpose::note_capture_beginning_locked(interpose::per_thread(s));
  return begin_capture(interpose::per_thread(s), real().cuStreamBeginCaptureToGraph_ptsz(s, g, deps, data, n, mode));
}

// The id of the capture `stream` is in (0: none, or unknown).
std::uint64_t capture_id_of(CUstream stream) {
  bool capturing = false;
  std::uint64_t id = 0;
  return interpose::capture_of(stream, &capturing, &id) == CUDA_SUCCESS && capturing ? id : 0;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
  const std::uint64_t capture = capture_id_of(s);
  return end_capture(s, graph, real().cuStreamEndCapture(s, graph), capture);
}

CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) {
  const std::uint64_t capture = capture_id_of(interpose::per_thread(s));
  return end_capture(interpose::per_thread(s), graph, real().cuStreamEndCapture_ptsz(s, graph), capture);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  CUresult r = real().cuGraphInstantiateWithFlags(exec, graph, flags);
  if (r == CUDA_SUCCESS && exec != nullptr && *exec != nullptr) interpose::capture_registry().instantiated(*exec, graph);
  return r;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  interpose::capture_registry().exec_destroyed(exec);
  return real().cuGraphExecDestroy(exec);
}

CUresult cuGraphDestroy(CUgraph graph) {
  interpose::capture_registry().graph_destroyed(graph);
  return real().cuGraphDestroy(graph);
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shmem, cudaStream_t stream) {
  return observed_runtime_launch(func, stream, args,
                                 [&] { return real().cudaLaunchKernel(func, grid, block, args, shmem, stream); });
}

cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args, size_t shmem,
                                  cudaStream_t stream) {
  return observed_runtime_launch(func, interpose::per_thread(stream), args,
                                 [&] { return real().cudaLaunchKernel_ptsz(func, grid, block, args, shmem, stream); });
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config == nullptr) return real().cudaLaunchKernelExC(config, func, args);
  return observed_runtime_launch(func, config->stream, args, [&] { return real().cudaLaunchKernelExC(config, func, args); });
}

cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config == nullptr) return real().cudaLaunchKernelExC_ptsz(config, func, args);
  return observed_runtime_launch(func, interpose::per_thread(config->stream), args,
                                 [&] { return real().cudaLaunchKernelExC_ptsz(config, func, args); });
}

}  // namespace spillway::hook
