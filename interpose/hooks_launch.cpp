// Launch observation (docs/design.md, "One launch, hook to Backend"): the launch hooks of hooks.def.
//
// Per launch, before the real launch:
//  1. The kernel's parameter layout comes from cuFuncGetParamInfo (CUDA 12.4+), read once
//     per CUfunction into a lock-free cache (open addressing over atomic pointers; entries
//     are never freed, functions are few). A handle names one kernel only while its code is
//     loaded: after cuModuleUnload, cuLibraryUnload or the end of a context (cuCtxDestroy,
//     cuDevicePrimaryCtxRelease/Reset) the driver may hand the very same CUfunction/CUkernel
//     to another kernel. Each of those calls starts a new code generation; an entry of an
//     older generation is read again (layout, name) before it is used, so the scan never
//     reads more parameters than the handle's current kernel has. (The retired entry is
//     kept, not freed: a launch on another thread may still be reading it. One per function
//     per unload.) The generation is part of the execution id, so durations learned for the
//     old kernel do not describe the new one.
//  2. Every 8-byte-aligned word of every parameter of 8 bytes or more (pointers passed
//     directly and pointers inside by-value structs) is looked up in the allocation table:
//     first the Engine's lock-free address bounds, then Engine::find.
//  3. The footprint: spillway/footprint.h's rule (the
//     simulator applies the same one): for each pointer p found in a block B, the range from
//     p to the next pointer found in B by this launch, else to B's end; a pointer into the
//     middle of B is further bounded to kInteriorExtent bytes. The Engine turns ranges into
//     chunks.
//  4. On a capturing stream nothing is issued and the Engine is not called (the kernel does
//     not run now). Whether the stream captures: a stream whose capture began through the
//     hooked cuStreamBeginCapture_v2(_ptsz) or cuStreamBeginCaptureToGraph(_ptsz) (CUDA
//     12.3+) is known without asking; while any such capture is in progress every other
//     stream is asked (cuStreamIsCapturing: it may have joined the capture through an event);
//     with none in progress nothing is asked, which saves a driver call per launch. The
//     launch's footprint is added to that stream's
//     capture and becomes the graph's footprint (cuStreamEndCapture) and then the graph exec's
//     (cuGraphInstantiateWithFlags): cuGraphLaunch is one launch with the union of the
//     footprints of the kernels captured into it, restricted to blocks still live. A graph
//     built without capture (explicit node APIs) is launched with an empty footprint.
//     Stream-ordered allocations on a capturing stream are left to the driver (graph memory
//     nodes, hooks_driver.cpp). A cuMemFreeAsync of a managed block on a capturing stream is
//     a free node: the block stays live (and in footprints) and follows the capture to its
//     graph and the graph's execs; the first cuGraphLaunch of one of them that the driver
//     accepts releases it, stream-ordered after that launch. A graph never launched never
//     frees it, as the driver would not.
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
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_backend.h"
#include "duration_samples.h"
#include "shim.h"
#include "spillway/footprint.h"
#include "spillway/log.h"

namespace spillway::hook {

using interpose::real;

namespace {

constexpr std::size_t kMaxHits = 64;                    // pointers per launch beyond this are ignored
constexpr std::size_t kMaxParams = 1024;

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// ---- per-function information -----------------------------------------------------------

struct FuncInfo {
  const void* key = nullptr;
  std::uint64_t generation = 0;  // the code generation it was read in (step 1)
  CUfunction function = nullptr;
  bool layout_known = false;
  struct Param {
    std::uint32_t index, offset, size;
  };
  std::vector<Param> params;  // parameters of 8 bytes or more (the only ones that can hold a pointer)
  std::uint32_t buffer_bytes = 0;                                // end of the last parameter
  std::string name;
};

// The code generation (file comment, step 1): bumped by every call that may unload code.
std::atomic<std::uint64_t> g_code_generation{0};

// Lock-free read path: a fixed open-addressing table of atomic pointers; insertion by CAS.
// Past kSlots entries (never in practice) a mutex-guarded map takes over. An entry of an
// older code generation is replaced in its slot by a fresh one (the old one is retired).
class FuncCache {
 public:
  template <typename Make>
  const FuncInfo* get(const void* key, Make&& make) {
    const std::uint64_t gen = g_code_generation.load(std::memory_order_acquire);
    std::size_t h = slot_of(key);
    for (std::size_t i = 0; i < kProbe; ++i) {
      std::atomic<FuncInfo*>& slot = slots_[(h + i) & (kSlots - 1)];
      FuncInfo* cur = slot.load(std::memory_order_acquire);
      if (cur != nullptr && cur->key != key) continue;
      if (cur != nullptr && cur->generation == gen) return cur;
      // Empty, or this key's entry of an older generation: read the function now.
      FuncInfo* fresh = make(key);
      fresh->generation = gen;
      FuncInfo* expected = cur;
      if (slot.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;  // (cur retired)
      delete fresh;
      if (expected->key == key) return expected;  // another thread read it first
    }
    std::lock_guard lock(overflow_mutex_);
    auto it = overflow_.find(key);
    if (it != overflow_.end() && it->second->generation == gen) return it->second;
    FuncInfo* fresh = make(key);
    fresh->generation = gen;
    overflow_[key] = fresh;  // (an older entry is retired)
    return fresh;
  }

 private:
  static constexpr std::size_t kSlots = 8192, kProbe = 32;
  static std::size_t slot_of(const void* p) {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) >> 4) * 0x9e3779b97f4a7c15ull >> 51);
  }
  std::array<std::atomic<FuncInfo*>, kSlots> slots_{};
  std::mutex overflow_mutex_;
  std::unordered_map<const void*, FuncInfo*> overflow_;
};

FuncCache& functions() {
  static auto* cache = new FuncCache();  // never destroyed: hooks may run during exit
  return *cache;
}

std::atomic<std::uint64_t> g_unnamed{0};

using FuncGetNameFn = CUresult (*)(const char**, CUfunction);
FuncGetNameFn func_get_name() {
  static FuncGetNameFn fn = [] {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st{};
    interpose::ShimCallScope scope;
    if (real().cuGetProcAddress_v2 == nullptr ||
        real().cuGetProcAddress_v2("cuFuncGetName", &p, 12030, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) {
      p = nullptr;
    }
    return reinterpret_cast<FuncGetNameFn>(p);
  }();
  return fn;
}

// A driver function the fake driver does not have, fetched through cuGetProcAddress at
// `version`; nullptr where the driver lacks it.
template <typename Fn>
Fn optional_driver_fn(const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  interpose::ShimCallScope scope;
  if (real().cuGetProcAddress_v2 == nullptr ||
      real().cuGetProcAddress_v2(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) {
    p = nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

// The CUDA runtime (12+) loads kernels as context-independent CUkernel handles (cuLibrary*)
// and passes them to cuLaunchKernel, which accepts both kinds ("CUDA Driver API: Library
// Management"); cuFuncGetParamInfo/cuFuncGetName answer CUDA_ERROR_INVALID_HANDLE for a
// CUkernel, cuKernelGetParamInfo (12.4) and cuKernelGetName (12.3) answer instead.
using ParamInfoFn = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
ParamInfoFn kernel_get_param_info() {
  static ParamInfoFn fn = optional_driver_fn<ParamInfoFn>("cuKernelGetParamInfo", 12040);
  return fn;
}
FuncGetNameFn kernel_get_name() {
  static FuncGetNameFn fn = optional_driver_fn<FuncGetNameFn>("cuKernelGetName", 12030);
  return fn;
}

FuncInfo* make_info(const void* key, CUfunction f) {
  auto* info = new FuncInfo();
  info->key = key;
  info->function = f;
  interpose::ShimCallScope scope;
  ParamInfoFn param_info = real().cuFuncGetParamInfo;
  bool is_kernel = false;
  if (f != nullptr && param_info != nullptr) {
    size_t offset = 0, size = 0;
    if (param_info(f, 0, &offset, &size) == CUDA_ERROR_INVALID_HANDLE && kernel_get_param_info() != nullptr) {
      param_info = kernel_get_param_info();
      is_kernel = true;
    }
  }
  if (f != nullptr && param_info != nullptr) {
    for (std::size_t i = 0; i < kMaxParams; ++i) {
      size_t offset = 0, size = 0;
      CUresult r = param_info(f, i, &offset, &size);
      if (r != CUDA_SUCCESS && i == 0 && r != CUDA_ERROR_INVALID_VALUE) {
        SPILLWAY_LOG_ONCE(LogLevel::debug, "launches: cuFuncGetParamInfo failed ({}); footprints unknown", static_cast<int>(r));
      }
      if (r != CUDA_SUCCESS) {
        info->layout_known = i > 0 || r == CUDA_ERROR_INVALID_VALUE;
        break;
      }
      info->buffer_bytes = std::max<std::uint32_t>(info->buffer_bytes, static_cast<std::uint32_t>(offset + size));
      if (size >= 8) {
        info->params.push_back(FuncInfo::Param{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(offset),
                                               static_cast<std::uint32_t>(size)});
      }
    }
  }
  if (f != nullptr) {
    if (FuncGetNameFn get = is_kernel ? kernel_get_name() : func_get_name()) {
      const char* n = nullptr;
      if (get(&n, f) == CUDA_SUCCESS && n != nullptr) info->name = n;
    }
  }
  if (info->name.empty()) info->name = "kernel" + std::to_string(g_unnamed.fetch_add(1));
  return info;
}

const FuncInfo* info_for(CUfunction f) {
  return functions().get(f, [f](const void* key) { return make_info(key, f); });
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
    std::optional<Block> b = e.find(word);
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

// ---- capture and graphs ------------------------------------------------------------------

std::mutex g_graph_mutex;
std::unordered_map<CUstream, std::vector<Access>>& captures() {
  static auto* m = new std::unordered_map<CUstream, std::vector<Access>>();
  return *m;
}
std::unordered_map<CUgraph, std::vector<Access>>& graphs() {
  static auto* m = new std::unordered_map<CUgraph, std::vector<Access>>();
  return *m;
}
std::unordered_map<CUgraphExec, std::vector<Access>>& execs() {
  static auto* m = new std::unordered_map<CUgraphExec, std::vector<Access>>();
  return *m;
}

// Captured frees (file comment, step 4): per capturing stream, then per graph and exec. One
// list is shared by the graph and every exec made from it; the first launch takes it.
struct CapturedFrees {
  std::vector<CUdeviceptr> blocks;
  bool released = false;  // guarded by g_graph_mutex
};
using FreesPtr = std::shared_ptr<CapturedFrees>;
// Keyed by capture id (cuStreamGetCaptureInfo): one capture's frees, whichever of its
// streams (the origin, streams that joined it, a thread's per-thread default stream) they
// were made on. (Without cuStreamGetCaptureInfo, CUDA < 12.3: keyed by the stream.)
std::unordered_map<std::uint64_t, std::vector<CUdeviceptr>>& capture_frees() {
  static auto* m = new std::unordered_map<std::uint64_t, std::vector<CUdeviceptr>>();
  return *m;
}
std::unordered_map<CUgraph, FreesPtr>& graph_frees() {
  static auto* m = new std::unordered_map<CUgraph, FreesPtr>();
  return *m;
}
std::unordered_map<CUgraphExec, FreesPtr>& exec_frees() {
  static auto* m = new std::unordered_map<CUgraphExec, FreesPtr>();
  return *m;
}

// After a graph launch the driver accepted: the frees captured into it are carried out,
// stream-ordered after the launch; a launch into a capture makes the graph a node of that
// capture, whose frees they become.
void release_captured_frees(CUgraphExec exec, CUstream stream) {
  std::vector<CUdeviceptr> blocks;
  {
    std::lock_guard lock(g_graph_mutex);
    auto it = exec_frees().find(exec);
    if (it == exec_frees().end() || it->second->released) return;
    it->second->released = true;
    blocks = it->second->blocks;
  }
  bool capturing = false;
  std::uint64_t capture = 0;
  if (interpose::capture_of(stream, &capturing, &capture) == CUDA_SUCCESS && capturing) {
    for (CUdeviceptr p : blocks) interpose::defer_captured_free(capture, p);
    return;
  }
  Engine* e = interpose::engine();
  if (e == nullptr) return;
  for (CUdeviceptr p : blocks) {
    bool ours = false;
    e->release(p, reinterpret_cast<StreamHandle>(stream), &ours);
  }
}

// Streams whose capture began through the hooks (guarded by g_graph_mutex) and their count.
std::vector<CUstream>& capturing_streams() {
  static auto* v = new std::vector<CUstream>();
  return *v;
}
std::atomic<int> g_captures{0};

// Whether `stream` is capturing (file comment, step 4).
bool stream_capturing(CUstream stream) {
  if (g_captures.load(std::memory_order_acquire) == 0) return false;
  {
    std::lock_guard lock(g_graph_mutex);
    const auto& v = capturing_streams();
    if (std::find(v.begin(), v.end(), stream) != v.end()) return true;
  }
  interpose::ShimCallScope scope;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return real().cuStreamIsCapturing != nullptr &&
         (real().cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE);
}

void add_to_capture(CUstream stream, const Footprint& fp) {
  std::lock_guard lock(g_graph_mutex);
  std::vector<Access>& acc = captures()[stream];
  for (std::size_t i = 0; i < fp.naccesses; ++i) {
    const Access& a = fp.accesses[i];
    bool dup = std::any_of(acc.begin(), acc.end(), [&](const Access& x) { return x.addr == a.addr && x.bytes == a.bytes; });
    if (!dup) acc.push_back(a);
  }
}

// ---- runtime host stubs ------------------------------------------------------------------

using GetFuncBySymbolFn = cudaError_t (*)(cudaFunction_t*, const void*);

FuncCache& stubs() {
  static auto* cache = new FuncCache();
  return *cache;
}

// cudaGetFuncBySymbol from the very libcudart whose cudaLaunchKernel the program calls.
// Frameworks load that runtime into a local scope (Python extensions are dlopen'ed
// RTLD_LOCAL), where RTLD_DEFAULT does not reach: open the object that holds the real
// cudaLaunchKernel instead.
GetFuncBySymbolFn runtime_get_func_by_symbol() {
  void* anchor = reinterpret_cast<void*>(real().cudaLaunchKernel);
  Dl_info info{};
  if (anchor == nullptr || dladdr(anchor, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  auto fn = reinterpret_cast<GetFuncBySymbolFn>(dlsym(handle, "cudaGetFuncBySymbol"));
  dlclose(handle);  // NOLOAD took a reference to an object that stays loaded
  log(LogLevel::debug, "runtime launches: cudaGetFuncBySymbol {} in {}", fn != nullptr ? "found" : "missing",
      info.dli_fname);
  return fn;
}

// The FuncInfo of a runtime host stub: that of its CUfunction (cudaGetFuncBySymbol), or one
// without a layout when the runtime cannot say.
const FuncInfo* stub_info(const void* stub) {
  const FuncInfo* s = stubs().get(stub, [](const void* key) {
    static GetFuncBySymbolFn get = runtime_get_func_by_symbol();
    cudaFunction_t f = nullptr;
    if (get != nullptr) {
      interpose::ShimCallScope scope;
      if (cudaError_t r = get(&f, key); r != cudaSuccess) {
        SPILLWAY_LOG_ONCE(LogLevel::debug, "runtime launches: cudaGetFuncBySymbol failed ({}) for a host stub", static_cast<int>(r));
        f = nullptr;
      }
    }
    if (f == nullptr) return make_info(key, nullptr);
    auto* link = new FuncInfo();
    link->key = key;
    link->function = reinterpret_cast<CUfunction>(f);
    return link;
  });
  return s->function != nullptr ? info_for(s->function) : s;
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
      graph_acc.clear();
      {
        std::lock_guard lock(g_graph_mutex);
        auto it = execs().find(reinterpret_cast<CUgraphExec>(graph_key));
        if (it != execs().end()) graph_acc = it->second;
      }
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
    if (stream_capturing(stream)) {
      if (fn != nullptr) add_to_capture(stream, fp);
      return;  // nothing issued, the Engine not asked: the kernel does not run now
    }
    bool sample = false;
    Launch l;
    l.seq = g_seq.fetch_add(1, std::memory_order_relaxed);
    l.name = fn != nullptr ? std::string_view(fn->name) : std::string_view("graph");
    l.exec_id = fp.exec_id;
    l.accesses = graph != nullptr ? std::span<const Access>(*graph) : std::span<const Access>(fp.accesses.data(), fp.naccesses);
    l.dur_ns = duration_of(fp.exec_id, &sample);
    l.now_ns = now_ns();
    l.device = interpose::backend_instance().current_device();  // (cuCtxGetDevice: a thread-local read)
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
};


CUstream per_thread(CUstream s) { return s == nullptr ? CU_STREAM_PER_THREAD : s; }

template <typename Fn>
CUresult observed_launch(CUfunction f, CUstream stream, void** params, void** extra, Fn&& call) {
  if (f == nullptr) return call();
  Observation obs(f, nullptr, nullptr, stream, params, extra);
  const CUresult r = call();
  if (r == CUDA_SUCCESS) interpose::note_stream_work(stream);
  return obs.done(r, CUDA_SUCCESS);
}

template <typename Fn>
cudaError_t observed_runtime_launch(const void* stub, CUstream stream, void** args, Fn&& call) {
  if (stub == nullptr || t_in_runtime_launch) return call();
  Observation obs(nullptr, stub, nullptr, stream, args, nullptr);
  t_in_runtime_launch = true;
  cudaError_t r = call();
  t_in_runtime_launch = false;
  if (r == cudaSuccess) interpose::note_stream_work(stream);
  return obs.done(r, cudaSuccess);
}

// (The launching streams' lock held: cuda_backend.h, note_capture_begun_locked.)
CUresult begin_capture(CUstream stream, CUresult r) {
  if (r != CUDA_SUCCESS) return r;
  interpose::note_capture_begun_locked(stream);
  std::lock_guard lock(g_graph_mutex);
  capturing_streams().push_back(stream);
  g_captures.fetch_add(1, std::memory_order_acq_rel);
  captures().erase(stream);
  return r;
}

// The frees captured by capture `capture` go to the graph it made (with a failed capture:
// nowhere, never freed).
void end_captured_frees(std::uint64_t capture, CUgraph* graph, CUresult r) {
  std::lock_guard lock(g_graph_mutex);
  auto it = capture_frees().find(capture);
  if (it == capture_frees().end()) return;
  auto frees = std::make_shared<CapturedFrees>();
  frees->blocks = std::move(it->second);
  capture_frees().erase(it);
  if (r == CUDA_SUCCESS && graph != nullptr && *graph != nullptr) graph_frees()[*graph] = std::move(frees);
}

// `capture`: the id of the capture the stream was in before the real end call.
CUresult end_capture(CUstream stream, CUgraph* graph, CUresult r, std::uint64_t capture) {
  interpose::note_capture_ended(stream);
  end_captured_frees(capture, graph, r);
  std::lock_guard lock(g_graph_mutex);
  // The capture is over unless the driver refused the call for a stream that was not
  // capturing (then it was not in the list either).
  auto& v = capturing_streams();
  if (auto it = std::find(v.begin(), v.end(), stream); it != v.end()) {
    v.erase(it);
    g_captures.fetch_sub(1, std::memory_order_acq_rel);
  }
  auto it = captures().find(stream);
  if (it == captures().end()) return r;
  if (r == CUDA_SUCCESS && graph != nullptr && *graph != nullptr) graphs()[*graph] = std::move(it->second);
  captures().erase(it);
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
  return observed_launch(f, per_thread(s), params, extra,
                         [&] { return real().cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra); });
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return real().cuLaunchKernelEx(config, f, params, extra);
  return observed_launch(f, config->hStream, params, extra, [&] { return real().cuLaunchKernelEx(config, f, params, extra); });
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return real().cuLaunchKernelEx_ptsz(config, f, params, extra);
  return observed_launch(f, per_thread(config->hStream), params, extra,
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
  return observed_launch(f, per_thread(s), params, nullptr, [&] {
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
    Observation obs(nullptr, nullptr, exec, per_thread(s), nullptr, nullptr);
    r = obs.done(real().cuGraphLaunch_ptsz(exec, s), CUDA_SUCCESS);
  }
  if (r == CUDA_SUCCESS) interpose::note_stream_work(per_thread(s));
  if (r == CUDA_SUCCESS) release_captured_frees(exec, per_thread(s));
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
  interpose::note_capture_beginning_locked(per_thread(s));
  return begin_capture(per_thread(s), real().cuStreamBeginCapture_v2_ptsz(s, mode));
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
  interpose::note_capture_beginning_locked(per_thread(s));
  return begin_capture(per_thread(s), real().cuStreamBeginCaptureToGraph_ptsz(s, g, deps, data, n, mode));
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
  const std::uint64_t capture = capture_id_of(per_thread(s));
  return end_capture(per_thread(s), graph, real().cuStreamEndCapture_ptsz(s, graph), capture);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  CUresult r = real().cuGraphInstantiateWithFlags(exec, graph, flags);
  if (r == CUDA_SUCCESS && exec != nullptr && *exec != nullptr) {
    std::lock_guard lock(g_graph_mutex);
    auto it = graphs().find(graph);
    if (it != graphs().end()) execs()[*exec] = it->second;
    else execs().erase(*exec);
    auto f = graph_frees().find(graph);
    if (f != graph_frees().end()) exec_frees()[*exec] = f->second;
    else exec_frees().erase(*exec);
  }
  return r;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  {
    std::lock_guard lock(g_graph_mutex);
    execs().erase(exec);
    exec_frees().erase(exec);
  }
  return real().cuGraphExecDestroy(exec);
}

CUresult cuGraphDestroy(CUgraph graph) {
  {
    std::lock_guard lock(g_graph_mutex);
    graphs().erase(graph);
    graph_frees().erase(graph);
  }
  return real().cuGraphDestroy(graph);
}

// Code unloaded (file comment, step 1): the handles of its kernels may be given out again.
// The generation moves before the real call, so no launch after the call returns reads an
// entry of the code it unloaded.
CUresult cuModuleUnload(CUmodule hmod) {
  g_code_generation.fetch_add(1, std::memory_order_acq_rel);
  return real().cuModuleUnload(hmod);
}

CUresult cuLibraryUnload(CUlibrary library) {
  g_code_generation.fetch_add(1, std::memory_order_acq_rel);
  return real().cuLibraryUnload(library);
}

// The end of a context. The driver frees the managed memory made in it (cuCtxDestroy:
// "Destroys and cleans up all resources associated with the context"; cuDevicePrimaryCtxReset:
// "Destroy all allocations and reset all state on the primary context"; the last
// cuDevicePrimaryCtxRelease destroys it; CUDA Driver API, Context and Primary Context
// Management): the Engine's blocks and ranges of that context end with it, and no other's
// (Engine::begin_context_end, finish_context_end).
namespace {

std::uint64_t handle_of(CUcontext ctx) { return reinterpret_cast<std::uint64_t>(ctx); }

// The primary context of `dev` while it is active, else nullptr. (A retain of an active
// primary context only counts one use more, and the release gives it back at once.)
CUcontext active_primary(CUdevice dev) {
  if (real().cuDevicePrimaryCtxGetState == nullptr || real().cuDevicePrimaryCtxRetain == nullptr) return nullptr;
  interpose::ShimCallScope scope;
  unsigned flags = 0;
  int active = 0;
  CUcontext ctx = nullptr;
  if (real().cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active == 0) return nullptr;
  if (real().cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) return nullptr;
  real().cuDevicePrimaryCtxRelease_v2(dev);
  return ctx;
}

bool primary_active(CUdevice dev) {
  if (real().cuDevicePrimaryCtxGetState == nullptr) return true;
  interpose::ShimCallScope scope;
  unsigned flags = 0;
  int active = 1;
  return real().cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || active != 0;
}

// `end` ends `ctx` (or not: it says so by its answer and `ended`).
template <class End, class Ended>
CUresult end_context(CUcontext ctx, End&& end, Ended&& ended) {
  Engine* e = interpose::hooks_active() && ctx != nullptr ? interpose::engine() : nullptr;
  if (e != nullptr) e->begin_context_end(handle_of(ctx));
  const CUresult r = end();
  if (e != nullptr) e->finish_context_end(handle_of(ctx), r == CUDA_SUCCESS && ended());
  return r;
}

}  // namespace

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  g_code_generation.fetch_add(1, std::memory_order_acq_rel);
  return end_context(
      ctx,
      [&] {
        // (Before the driver frees the handle, which it may hand out again.)
        if (interpose::hooks_active() && ctx != nullptr) interpose::forget_context(ctx);
        return real().cuCtxDestroy_v2(ctx);
      },
      [] { return true; });
}

// The last release of a primary context destroys it, and its modules with it.
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  g_code_generation.fetch_add(1, std::memory_order_acq_rel);
  CUcontext primary = interpose::hooks_active() ? active_primary(dev) : nullptr;
  bool last = false;
  CUresult r = end_context(
      primary, [&] { return real().cuDevicePrimaryCtxRelease_v2(dev); },
      [&] { return last = !primary_active(dev); });
  // The last release destroys the context's streams and events (the handle stays the same).
  if (last) interpose::forget_context(primary);
  return r;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  g_code_generation.fetch_add(1, std::memory_order_acq_rel);
  CUcontext primary = interpose::hooks_active() ? active_primary(dev) : nullptr;
  return end_context(
      primary,
      [&] {
        if (primary != nullptr) interpose::forget_context(primary);  // (before its streams and events go)
        return real().cuDevicePrimaryCtxReset_v2(dev);
      },
      [] { return true; });
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t shmem, cudaStream_t stream) {
  return observed_runtime_launch(func, stream, args,
                                 [&] { return real().cudaLaunchKernel(func, grid, block, args, shmem, stream); });
}

cudaError_t cudaLaunchKernel_ptsz(const void* func, dim3 grid, dim3 block, void** args, size_t shmem,
                                  cudaStream_t stream) {
  return observed_runtime_launch(func, per_thread(stream), args,
                                 [&] { return real().cudaLaunchKernel_ptsz(func, grid, block, args, shmem, stream); });
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config == nullptr) return real().cudaLaunchKernelExC(config, func, args);
  return observed_runtime_launch(func, config->stream, args, [&] { return real().cudaLaunchKernelExC(config, func, args); });
}

cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config == nullptr) return real().cudaLaunchKernelExC_ptsz(config, func, args);
  return observed_runtime_launch(func, per_thread(config->stream), args,
                                 [&] { return real().cudaLaunchKernelExC_ptsz(config, func, args); });
}

}  // namespace spillway::hook

namespace spillway::interpose {

void defer_captured_free(std::uint64_t capture, CUdeviceptr addr) {
  std::lock_guard lock(hook::g_graph_mutex);
  hook::capture_frees()[capture].push_back(addr);
}

CUresult capture_of(CUstream stream, bool* capturing, std::uint64_t* capture) {
  ShimCallScope scope;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r;
  *capture = 0;
  if (real().cuStreamGetCaptureInfo_v3 != nullptr) {
    cuuint64_t id = 0;
    r = real().cuStreamGetCaptureInfo_v3(stream, &status, &id, nullptr, nullptr, nullptr, nullptr);
    *capture = id;
  } else if (real().cuStreamIsCapturing != nullptr) {
    r = real().cuStreamIsCapturing(stream, &status);
    *capture = reinterpret_cast<std::uintptr_t>(stream);  // (per stream: the best there is)
  } else {
    r = CUDA_SUCCESS;
  }
  *capturing = r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
  return r;
}

bool captures_in_progress() { return hook::g_captures.load(std::memory_order_acquire) != 0; }

// The footprints of the kernels captured so far by the captures in progress (file comment,
// step 4): their graphs may still run on these ranges.
bool used_by_capture(std::uint64_t addr, std::uint64_t bytes) {
  if (!captures_in_progress()) return false;
  std::lock_guard lock(hook::g_graph_mutex);
  for (const auto& [stream, accesses] : hook::captures()) {
    for (const Access& a : accesses) {
      if (a.addr < addr + bytes && addr < a.addr + a.bytes) return true;
    }
  }
  return false;
}

}  // namespace spillway::interpose
