// Internals of libspillway.so shared by the hook files. Not a public interface.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "spillway/engine.h"

#undef cuGetProcAddress  // cuda.h maps it to _v2; the shim hooks both exact symbols
extern "C" CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);

namespace spillway::interpose {

// The real functions: one typed pointer per row of hooks.def.
struct Real {
#define SPILLWAY_DRIVER_HOOK(symbol, base, since, variant, ret, params, args) ret(*symbol) params = nullptr;
#define SPILLWAY_RUNTIME_HOOK(symbol, ret, params, args) ret(*symbol) params = nullptr;
#define SPILLWAY_DRIVER_USE(symbol, ret, params) ret(*symbol) params = nullptr;
#include "hooks.def"
};

// REAL pointers. Driver rows are filled by ensure_driver(), runtime rows by
// ensure_runtime(); a null pointer means "not available".
Real& real();
// Resolves the driver's real functions once (dlopen of libcuda.so.1, dlsym, then
// cuGetProcAddress for the pointers the driver hands out). Thread-safe; false if libcuda
// cannot be found.
bool ensure_driver();
// Resolves the shared runtime's real functions once, from the libcudart the program uses.
bool ensure_runtime();

// If `fn` is a real function the shim hooks (as returned by dlsym, cuGetProcAddress or
// cudaGetDriverEntryPoint), its hook; else `fn` unchanged. Exact: only the very symbol the
// driver returned is substituted, never another version of it.
void* substitute(void* fn);
// The hook for an exported symbol name, or nullptr (dlsym uses this).
void* hook_for_name(const char* name);

// The Engine, or nullptr when Spillway passes everything through (SPILLWAY_DISABLE=1, a
// bad setting, an internal failure, or a device without concurrent managed access).
Engine* engine();
// The Engine if allocations may be redirected now: nullptr also while no context is
// current (the driver then answers the call itself).
Engine* engine_for_allocation();
bool hooks_active();
// Logs once and turns the shim into a pass-through for the rest of the process.
void internal_failure(const char* where) noexcept;

// glibc's dlsym itself (the versioned symbol, never the shim's own export; dlsym_entry.cpp
// finds and caches it): the shim's own look-ups go through it. Thread-safe.
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym();

// True if the calling thread's stack passes through a library named in SPILLWAY_EXCLUDE.
bool allocation_excluded();

// Set while the shim runs its own driver calls on this thread.
struct ShimCallScope {
  ShimCallScope();
  ~ShimCallScope();
};

// Set by runtime hooks (cudaMalloc, ...) around the real runtime call, so the driver hook
// it leads to records the runtime's family and tells the runtime hook that it ran.
struct RuntimeAllocScope {
  explicit RuntimeAllocScope(AllocKind kind);
  ~RuntimeAllocScope();
  bool driver_hook_ran() const;
};
std::optional<AllocKind> runtime_alloc_kind();
void note_driver_alloc_hook_ran();

// SPILLWAY_TRACE (trace_recorder.cpp): opens the trace and makes it the Engine's observer;
// a path that cannot be written logs one error line and records nothing.
void install_trace_recorder(Engine& engine, const std::string& path);
// Flushes and closes the trace (at exit; calls no driver function). If another event is
// being written for longer than `wait` (this thread itself may hold the recorder, exit()
// having come from a signal handler), the trace is left unfinished, with one error line.
void close_trace_recorder(std::chrono::milliseconds wait) noexcept;
// The same before this process image is replaced by exec (exec_hooks.cpp), which runs no
// exit-time code: only in the process that opened the trace, never in a vfork()ed child,
// which shares the recorder's memory with its parent. Touches nothing else then.
void close_trace_recorder_before_exec(std::chrono::milliseconds wait) noexcept;

// The CUresult for an Engine Result: the driver's own code when it gave one.
CUresult to_cuda(const Result& r);

}  // namespace spillway::interpose
