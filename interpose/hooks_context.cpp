// Hook bodies for the calls that end code or contexts: cuModuleUnload, cuLibraryUnload,
// cuCtxDestroy, cuDevicePrimaryCtxRelease/Reset. Each starts a new code generation (a kernel
// handle may name another kernel after it: kernel_info.h), and the end of a context ends the
// Engine's blocks and ranges made in it, the shim's streams and events there, and its fences.
#include "cuda_backend.h"
#include "kernel_info.h"
#include "shim.h"

namespace spillway::hook {

using interpose::real;

// Code unloaded (kernel_info.h): the handles of its kernels may be given out again.
// The generation moves before the real call, so no launch after the call returns reads an
// entry of the code it unloaded.
CUresult cuModuleUnload(CUmodule hmod) {
  interpose::note_code_unloading();
  return real().cuModuleUnload(hmod);
}

CUresult cuLibraryUnload(CUlibrary library) {
  interpose::note_code_unloading();
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
  interpose::note_code_unloading();
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
  interpose::note_code_unloading();
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
  interpose::note_code_unloading();
  CUcontext primary = interpose::hooks_active() ? active_primary(dev) : nullptr;
  return end_context(
      primary,
      [&] {
        if (primary != nullptr) interpose::forget_context(primary);  // (before its streams and events go)
        return real().cuDevicePrimaryCtxReset_v2(dev);
      },
      [] { return true; });
}

}  // namespace spillway::hook
