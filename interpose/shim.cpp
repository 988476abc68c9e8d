// libspillway.so: state, the one ordered initialisation, REAL resolution, the exported hook
// symbols generated from hooks.def, the dlsym hook and the exit report.
//
// How symbols reach the shim: a program linked against libcuda binds to the
// exported symbols below because LD_PRELOAD puts this library first. The CUDA runtime
// (static or shared) instead dlopen()s libcuda.so.1, asks dlsym for cuGetProcAddress_v2 and
// resolves every entry point through it: the dlsym hook hands back our cuGetProcAddress,
// which asks the real one and substitutes the hook for exactly the symbol it returned.
#include "shim.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <vector>

#include "cuda_backend.h"
#include "policy_registry.h"
#include "spillway/cancel.h"
#include "spillway/output_file.h"
#include "spillway/report.h"

#define SPILLWAY_EXPORT __attribute__((visibility("default")))

// Every exported hook, declared up front (cuda.h declares only some of the versioned names).
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) extern "C" ret symbol params;
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args) extern "C" ret symbol params;
#include "hooks.def"

namespace spillway::hook {
// Hook bodies, in hooks_driver.cpp and hooks_runtime.cpp.
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) ret symbol params;
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args) ret symbol params;
#include "hooks.def"
}  // namespace spillway::hook

extern "C" __attribute__((visibility("hidden"))) void* spillway_real_dlsym_for_next();

namespace spillway::interpose {

DlsymFn real_dlsym() { return reinterpret_cast<DlsymFn>(spillway_real_dlsym_for_next()); }

namespace {

enum class Library { driver, runtime };

struct Entry {
  const char* symbol;
  const char* base;      // driver: cuGetProcAddress name; runtime: same as symbol
  int since;             // driver: first cudaVersion
  bool ptsz;
  Library library;
  void* hook;            // the exported hook; nullptr for DRIVER_USE rows
  void** real_slot;      // where REAL is stored in Real
};

Real g_real;

std::vector<Entry> make_entries() {
  std::vector<Entry> e;
  constexpr bool plain = false, ptsz = true;
  (void)plain, (void)ptsz;
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args)                      \
  e.push_back(Entry{#symbol, #base, since, variant, Library::driver, reinterpret_cast<void*>(&::symbol), \
                    reinterpret_cast<void**>(&g_real.symbol)});
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args)                                             \
  e.push_back(Entry{#symbol, #symbol, 0, false, Library::runtime, reinterpret_cast<void*>(&::symbol),   \
                    reinterpret_cast<void**>(&g_real.symbol)});
#define SPILLWAY_DRIVER_USE(symbol, ret, params) \
  e.push_back(Entry{#symbol, #symbol, 0, false, Library::driver, nullptr, reinterpret_cast<void**>(&g_real.symbol)});
#include "hooks.def"
  std::sort(e.begin(), e.end(), [](const Entry& a, const Entry& b) { return std::strcmp(a.symbol, b.symbol) < 0; });
  return e;
}

const std::vector<Entry>& entries() {
  // Never destroyed: dlsym and the hooks may run on other threads while exit() runs the
  // static destructors (a destroyed table was read after free: tests/reliability).
  static const std::vector<Entry>* table = new std::vector<Entry>(make_entries());
  return *table;
}

const Entry* find_entry(const char* name) {
  const auto& t = entries();
  auto it = std::lower_bound(t.begin(), t.end(), name,
                             [](const Entry& e, const char* n) { return std::strcmp(e.symbol, n) < 0; });
  if (it == t.end() || std::strcmp(it->symbol, name) != 0) return nullptr;
  return &*it;
}

// real function pointer -> hook, for every way a real pointer can reach the program.
// Never destroyed, like the State below: lookups may run while exit() destroys statics. Made
// on first use, not by a global's initialiser: the first use may come before this file's
// globals are initialised (load_settings() runs state(), where a policy plugin's factory may
// call a hooked driver function, which resolves the driver here).
std::shared_mutex& subst_mutex() {
  static std::shared_mutex* m = new std::shared_mutex;
  return *m;
}
std::vector<std::pair<void*, void*>>& substitutions() {  // sorted by first
  static auto* v = new std::vector<std::pair<void*, void*>>;
  return *v;
}

void add_substitution(void* real_fn, void* hook) {
  if (real_fn == nullptr || hook == nullptr || real_fn == hook) return;
  std::vector<std::pair<void*, void*>>& g_subst = substitutions();
  std::unique_lock lock(subst_mutex());
  auto it = std::lower_bound(g_subst.begin(), g_subst.end(), std::make_pair(real_fn, static_cast<void*>(nullptr)));
  if (it != g_subst.end() && it->first == real_fn) return;
  g_subst.insert(it, {real_fn, hook});
}

thread_local int t_shim_depth = 0;
thread_local int t_dlsym_depth = 0;
// Set while this thread makes the process state (state()): code that runs then — a policy
// plugin's static constructors and factory — finds the hooks inactive and reaches the driver
// itself, instead of asking for the state it is being made for (which would wait for itself).
thread_local bool t_making_state = false;
thread_local std::optional<AllocKind> t_runtime_kind;
thread_local bool t_driver_hook_ran = false;

// Process-wide state. Allocated once and never destroyed: hooks may run on other threads
// while static destructors run at exit.
struct State {
  Config config;
  bool active = false;  // config valid and not disabled
  CudaBackend backend;
  Engine* engine = nullptr;
  std::atomic<bool> failed{false};
};

State* g_state = nullptr;
std::once_flag g_state_once;

// (std::call_once sets thread-local state and calls pthread_once on every call, about 40
// instructions and a __tls_get_addr: every hook asks for the state several times, so a
// released atomic answers once it is made.)
std::atomic<State*> g_state_ready{nullptr};

// The policy `spec` names for one device's plan. A plugin's factory that accepted the spec
// once may still make nothing later (it is the plugin's code): that plan then runs `demand`
// (the driver's demand paging), with one warning, rather than no policy at all.
std::unique_ptr<Policy> make_policy_or_demand(const PolicySpec& spec) {
  std::unique_ptr<Policy> p = make_policy(spec);
  if (p) return p;
  SPILLWAY_LOG_ONCE(LogLevel::warn, "SPILLWAY_POLICY '{}' made no policy for a device; it runs demand", spec.text());
  return make_policy("demand");
}

State& state() {
  if (State* s = g_state_ready.load(std::memory_order_acquire)) return *s;
  std::call_once(g_state_once, [] {
    t_making_state = true;
    auto* s = new State();
    ConfigResult cr = read_config(policy_names());
    for (const ConfigError& err : cr.errors) {
      log(LogLevel::error, "{}; Spillway passes every call through", err.message);
    }
    s->config = cr.config;
    set_log_level(s->config.log_level);
    for (const std::string& warning : cr.warnings) log(LogLevel::warn, "{}", warning);
    s->active = cr.errors.empty() && !s->config.disable;
    std::string policy_error;
    // (Parsed only when active: a disabled shim loads no policy plugin.)
    std::optional<PolicySpec> spec;
    if (s->active) spec = parse_policy_spec(s->config.policy, false, &policy_error);
    if (s->active && !spec) {
      log(LogLevel::error, "invalid value '{}' for SPILLWAY_POLICY: {}; Spillway passes every call through",
          s->config.policy, policy_error);
      s->active = false;
    }
    if (s->active) {
      // (One Policy instance per device's plan: engine.h, "One plan per device".)
      s->engine = new Engine(s->config, s->backend, [spec = *spec] { return make_policy_or_demand(spec); });
      if (s->engine != nullptr && !s->config.trace_path.empty()) install_trace_recorder(*s->engine, s->config.trace_path);
    }
    g_state = s;
    g_state_ready.store(s, std::memory_order_release);
    t_making_state = false;
  });
  return *g_state;
}

std::once_flag g_driver_once;
std::atomic<bool> g_driver_ok{false};
std::once_flag g_runtime_once;
std::atomic<bool> g_runtime_ok{false};

void* resolve_in(void* handle, const char* name, void* self) {
  void* p = real_dlsym()(handle, name);
  return p == self ? nullptr : p;  // never resolve to ourselves
}

}  // namespace

Real& real() { return g_real; }

std::atomic<bool> g_driver_tried{false};

bool ensure_driver() {
  if (g_driver_tried.load(std::memory_order_acquire)) return g_driver_ok.load(std::memory_order_acquire);
  std::call_once(g_driver_once, [] {
    ShimCallScope scope;
    if (real_dlsym() == nullptr) return;
    void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_LAZY);
    if (handle == nullptr) return;
    for (const Entry& e : entries()) {
      if (e.library != Library::driver) continue;
      void* p = resolve_in(handle, e.symbol, e.hook);
      *e.real_slot = p;
      add_substitution(p, e.hook);
    }
    // The driver may hand out other addresses through cuGetProcAddress than through dlsym
    // (trampolines): ask it for each hooked symbol at exactly that symbol's version.
    if (g_real.cuGetProcAddress_v2 != nullptr) {
      for (const Entry& e : entries()) {
        if (e.library != Library::driver || e.hook == nullptr || *e.real_slot == nullptr) continue;
        void* p = nullptr;
        CUdriverProcAddressQueryResult status{};
        cuuint64_t flags = e.ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
        if (g_real.cuGetProcAddress_v2(e.base, &p, e.since, flags, &status) == CUDA_SUCCESS && p != e.hook) {
          add_substitution(p, e.hook);
        }
      }
    }
    g_driver_ok.store(g_real.cuMemAllocManaged != nullptr && g_real.cuMemFree_v2 != nullptr);
  });
  g_driver_tried.store(true, std::memory_order_release);
  return g_driver_ok.load(std::memory_order_acquire);
}

bool ensure_runtime() {
  std::call_once(g_runtime_once, [] {
    ShimCallScope scope;
    if (real_dlsym() == nullptr) return;
    void* handle = nullptr;
    for (const Entry& e : entries()) {
      if (e.library != Library::runtime) continue;
      void* p = resolve_in(RTLD_NEXT, e.symbol, e.hook);
      if (p == nullptr) {
        if (handle == nullptr) handle = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
        if (handle != nullptr) p = resolve_in(handle, e.symbol, e.hook);
      }
      *e.real_slot = p;
      add_substitution(p, e.hook);
    }
    g_runtime_ok.store(g_real.cudaMalloc != nullptr);
  });
  return g_runtime_ok.load(std::memory_order_acquire);
}

void* substitute(void* fn) {
  if (fn == nullptr) return fn;
  const std::vector<std::pair<void*, void*>>& g_subst = substitutions();
  std::shared_lock lock(subst_mutex());
  auto it = std::lower_bound(g_subst.begin(), g_subst.end(), std::make_pair(fn, static_cast<void*>(nullptr)));
  if (it != g_subst.end() && it->first == fn) return it->second;
  return fn;
}

void* hook_for_name(const char* name) {
  const Entry* e = find_entry(name);
  return e ? e->hook : nullptr;
}

bool hooks_active() {
  if (t_making_state) return false;
  State& s = state();
  return s.active && !s.failed.load(std::memory_order_relaxed) && t_shim_depth == 0;
}

Engine* engine() { return hooks_active() ? state().engine : nullptr; }

Engine* engine_for_allocation() {
  Engine* e = engine();
  if (e == nullptr || !ensure_driver()) return nullptr;
  // Until the Engine has read the device's facts a context must be current (the driver
  // answers a call without one itself); afterwards a thread without one gets the driver's
  // own error from cuMemAllocManaged, as it would have from cuMemAlloc.
  if (!e->started() && !state().backend.has_current_context()) return nullptr;
  return e->usable() ? e : nullptr;
}

void internal_failure(const char* where) noexcept {
  try {
    if (g_state != nullptr) g_state->failed.store(true);
    SPILLWAY_LOG_ONCE(LogLevel::error, "internal error in {}; Spillway passes every call through from now on", where);
  } catch (...) {
  }
}

ShimCallScope::ShimCallScope() { ++t_shim_depth; }
ShimCallScope::~ShimCallScope() { --t_shim_depth; }

RuntimeAllocScope::RuntimeAllocScope(AllocKind kind) {
  t_runtime_kind = kind;
  t_driver_hook_ran = false;
}
RuntimeAllocScope::~RuntimeAllocScope() { t_runtime_kind.reset(); }
bool RuntimeAllocScope::driver_hook_ran() const { return t_driver_hook_ran; }
std::optional<AllocKind> runtime_alloc_kind() { return t_runtime_kind; }
void note_driver_alloc_hook_ran() { t_driver_hook_ran = true; }

CudaBackend& backend_instance() { return state().backend; }

namespace {

template <typename Ret>
Ret unavailable();
template <>
CUresult unavailable<CUresult>() { return CUDA_ERROR_NOT_INITIALIZED; }
template <>
cudaError_t unavailable<cudaError_t>() { return cudaErrorInitializationError; }

// Writes the exit report. Runs from a destructor of the library, after main returns or
// exit() is called; it never calls the driver, which may already be unloading.
// The process that loaded the shim. A child forked without exec inherits a copy of the
// parent's Engine and statistics: it must not print or write them again (it would repeat
// the parent's table and could overwrite the parent's report with stale figures).
pid_t g_owner_pid = 0;
// When the shim loaded: the exit line's wall time.
std::chrono::steady_clock::time_point g_loaded_at;

// Nothing here waits on a lock for long: exit() may come from a signal handler that
// interrupted this very thread inside the Engine (or the trace recorder) with its lock held.
constexpr std::chrono::milliseconds kExitLockWait{200};

__attribute__((destructor)) void write_exit_report() {
  if (g_state == nullptr || g_state->engine == nullptr) return;
  // (Before the owner check: a child forked before its parent used CUDA may have a trace of
  // its own to close; an inherited one it drops unflushed.)
  close_trace_recorder(kExitLockWait);
  if (getpid() != g_owner_pid) return;
  const bool summary = g_state->config.summary && log_enabled(LogLevel::warn);
  if (!summary && !log_enabled(LogLevel::info) && g_state->config.report_path.empty()) return;  // nothing asked for
  try {
    std::optional<Stats> stats = g_state->engine->stats_within(kExitLockWait);
    if (!stats) {
      log(LogLevel::warn, "no exit report: the Engine stayed busy at exit (exit() during a launch's plan)");
      return;
    }
    const Stats& s = *stats;
    bool used = s.allocations_redirected + s.allocations_passed_through + s.allocations_refused > 0;
    if (!used) return;
    if (log_enabled(LogLevel::info)) log(LogLevel::info, "{}", stats_table(s));
    if (summary) {
      const std::chrono::duration<double> wall = std::chrono::steady_clock::now() - g_loaded_at;
      log(LogLevel::warn, "{}", exit_summary(s, wall.count()));
    }
    if (!g_state->config.report_path.empty()) {
      // A file of this process's own (output_file.h): other processes of the run may write one too.
      std::string err;
      const std::string wanted = expand_output_pattern(g_state->config.report_path);  // %p, %r
      std::string path = claim_output_file(wanted, &err);
      if (!path.empty()) {
        if (path != wanted) {
          log(LogLevel::warn, "SPILLWAY_REPORT: '{}' exists; process {} writes its report to '{}'", wanted,
              static_cast<long>(getpid()), path);
        }
        err = write_report(path, s);
      }
      if (!err.empty()) log(LogLevel::error, "SPILLWAY_REPORT: {}", err);
    }
  } catch (...) {
  }
}

// Reads the settings at load time, so a bad value is reported once, up front.
__attribute__((constructor)) void load_settings() {
  g_owner_pid = getpid();
  g_loaded_at = std::chrono::steady_clock::now();
  try {
    state();
  } catch (...) {
  }
}

}  // namespace

// The generated pass-through used when hooks are off or a hook failed.
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) \
  static ret pass_##symbol params {                                           \
    if (!ensure_driver() || g_real.symbol == nullptr) return unavailable<ret>(); \
    return g_real.symbol args;                                                \
  }
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args)                      \
  static ret pass_##symbol params {                                           \
    if (!ensure_runtime() || g_real.symbol == nullptr) return unavailable<ret>(); \
    return g_real.symbol args;                                                \
  }
#include "hooks.def"

}  // namespace spillway::interpose

// ---- exported symbols ----------------------------------------------------------------
// Each exported hook passes straight through when hooks are off, otherwise runs the hook
// body; Spillway's own code (start-up and body) runs with thread cancellation held off
// (spillway/cancel.h: a forced unwind must never meet the catch below, nor leave the shim's
// locks and tables half-updated); no C++ exception crosses the C ABI. A pass-through call
// reaches the real driver with cancellation as the program set it, as without the shim.
//
// A driver hook entered on a thread that is already inside one passes straight through: the
// shim's own calls never enter the exported hooks, so that is a signal handler (or an
// atexit handler run by exit() from one) that interrupted the shim, maybe holding its locks
// (found in review: a cuMemFree from an atexit handler deadlocked on the allocation table's
// lock that the interrupted launch held). Runtime hooks do not count: each leads to a driver
// hook by design.
namespace spillway::interpose {
namespace {
thread_local int t_driver_hook_depth = 0;
}  // namespace
struct DriverHookScope {
  const bool nested = t_driver_hook_depth++ > 0;
  ~DriverHookScope() { --t_driver_hook_depth; }
};
struct RuntimeHookScope {
  static constexpr bool nested = false;
};
// Whether an exported hook runs its body (else it passes straight through): not nested,
// hooks on, the shim's start-up done (`ensure`, which may open files: cancellation points,
// so it runs with cancellation held off), and the real entry point found (`has_real`, asked
// after `ensure` has bound the entry points).
template <class HasReal>
bool hook_runs(bool nested, bool (*ensure)(), HasReal has_real) {
  if (nested || !hooks_active()) return false;
  NoCancelScope no_cancel;
  return ensure() && has_real();
}
}  // namespace spillway::interpose

#define SPILLWAY_EXPORT_HOOK(symbol, ensure, scope, ret, params, args)           \
  extern "C" SPILLWAY_EXPORT ret symbol params {                                 \
    ::spillway::interpose::scope hook_scope_;                                    \
    if (!::spillway::interpose::hook_runs(hook_scope_.nested, ::spillway::interpose::ensure, \
            [] { return ::spillway::interpose::real().symbol != nullptr; }))       \
      return ::spillway::interpose::pass_##symbol args;                          \
    ::spillway::NoCancelScope no_cancel_;                                        \
    try {                                                                        \
      return ::spillway::hook::symbol args;                                      \
    } catch (...) {                                                              \
      ::spillway::interpose::internal_failure(#symbol);                          \
    }                                                                            \
    return ::spillway::interpose::pass_##symbol args;                           \
  }
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) \
  SPILLWAY_EXPORT_HOOK(symbol, ensure_driver, DriverHookScope, ret, params, args)
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args) \
  SPILLWAY_EXPORT_HOOK(symbol, ensure_runtime, RuntimeHookScope, ret, params, args)
#include "hooks.def"

// The exported `dlsym` entry is in dlsym_entry.cpp (compiled without sanitizer
// instrumentation: sanitizer runtimes call it before their own start-up is done); it sends
// RTLD_NEXT lookups straight to glibc and names that may be hooks ("cu...") here.
// dlsym: programs that dlopen libcuda.so.1 themselves (the CUDA runtime, Triton, Numba,
// XLA) get the hooks for the symbols Spillway hooks, and everything else untouched.
extern "C" int cuptiActivityRegisterCallbacks();  // (cupti_feedback.cpp; only their addresses are used here)
extern "C" int cuptiSubscribe();
namespace {
bool is_own_cupti_export(void* fn) {
#if SPILLWAY_HAVE_CUPTI
  return fn == reinterpret_cast<void*>(&cuptiActivityRegisterCallbacks) || fn == reinterpret_cast<void*>(&cuptiSubscribe);
#else
  (void)fn;
  return false;
#endif
}
}  // namespace

extern "C" void* spillway_dlsym_impl(void* handle, const char* name) {
  using namespace spillway::interpose;
  DlsymFn real = real_dlsym();
  if (real == nullptr) return nullptr;
  void* result = real(handle, name);
  if (result == nullptr || name[0] != 'c' || name[1] != 'u' || t_dlsym_depth > 0) return result;
  // The lookup found the shim's own export (a handle whose scope holds the preloaded shim:
  // RTLD_DEFAULT, dlopen(NULL)). Without the shim it would have found the next definition,
  // or none in a process that has not loaded CUDA: a program probing for the runtime or the
  // driver this way must get that answer, and the hook only where the real function exists.
  if (const Entry* own = find_entry(name); own != nullptr && own->hook != nullptr && result == own->hook) {
    if (real(RTLD_NEXT, name) == nullptr) return nullptr;  // (RTLD_NEXT from here: after the shim)
  }
  // The same for the shim's CUPTI exports (cupti_feedback.cpp): without libcupti there is
  // no cuptiSubscribe to find.
  if (is_own_cupti_export(result) && real(RTLD_NEXT, name) == nullptr) return nullptr;
  ++t_dlsym_depth;
  void* out = result;
  spillway::NoCancelScope no_cancel;  // ensure_*() may open and write files: cancellation points (spillway/cancel.h)
  try {
    if (hooks_active() && find_entry(name) != nullptr && find_entry(name)->hook != nullptr) {
      const Entry* e = find_entry(name);
      if (e->library == Library::driver) ensure_driver();
      else ensure_runtime();
      out = substitute(result);
    }
  } catch (...) {
    out = result;
  }
  --t_dlsym_depth;
  return out;
}
