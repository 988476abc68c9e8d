// Hook bodies for the driver API rows of hooks.def. Each runs only while hooks are active
// (shim.cpp's exported wrapper checks that and catches exceptions).
#include <atomic>
#include <functional>

#include "capture_registry.h"
#include "cuda_backend.h"
#include "driver_helpers.h"
#include "shim.h"
#include "torch_tracker.h"
#include "spillway/log.h"

namespace spillway::hook {

using interpose::engine;
using interpose::engine_for_allocation;
using interpose::real;

namespace {

// The driver's pitch alignment for cuMemAllocPitch: rows start on 512-byte boundaries on
// every GPU since Kepler (observed cudaMallocPitch pitches; the CUDA Programming Guide
// only promises "appropriately padded"). The driver limits the element size to 4, 8 or 16.
constexpr std::uint64_t kPitchAlignment = 512;

using interpose::per_thread;

// A passed-through allocation, once the driver has made it, occupies the device outside
// managed memory: the Engine's budget counts it while it lives (Engine::note_device_memory),
// if it is device memory on the Engine's device (a pool the program created may hold host
// memory: CU_POINTER_ATTRIBUTE_MEMORY_TYPE and _DEVICE_ORDINAL say where it is).
CUresult count_outside(CUresult r, const CUdeviceptr* dptr, std::uint64_t bytes) {
  if (r != CUDA_SUCCESS || dptr == nullptr || *dptr == 0) return r;
  Engine* e = engine();
  if (e == nullptr || e->device() < 0 || real().cuPointerGetAttribute == nullptr) return r;
  unsigned type = 0;
  int ordinal = -1;
  {
    interpose::ShimCallScope scope;
    if (real().cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, *dptr) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE ||
        real().cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, *dptr) != CUDA_SUCCESS) {
      return r;
    }
  }
  e->note_device_memory(Engine::DeviceMemory::allocation, *dptr, bytes, ordinal);
  return r;
}

// A free the driver carries out (the block is not ours): its record leaves the count before
// the call, so an address the driver hands out again at once is counted afresh, and comes
// back if the driver refuses.
CUresult free_outside(CUdeviceptr dptr, const std::function<CUresult()>& free_it) {
  Engine* e = engine();
  int device = 0;
  const std::uint64_t bytes =
      e != nullptr && dptr != 0 ? e->take_device_memory(Engine::DeviceMemory::allocation, dptr, &device) : 0;
  CUresult r = free_it();
  if (r != CUDA_SUCCESS && bytes != 0) e->note_device_memory(Engine::DeviceMemory::allocation, dptr, bytes, device);
  return r;
}

// Redirects one device allocation to managed memory, or returns nullopt to pass it through.
// Counts every allocation it passes through (once: callers do not count again). *outside
// (when given) says whether a passed-through allocation is device memory the budget must
// count once the driver has made it: not a graph memory node (its memory belongs to the
// graph), nor a call the driver will refuse.
// A stream-ordered allocation is left to the driver when its stream is being captured: it
// becomes a graph memory node, whose memory lives as long as the graph and is reused by the
// driver only when the graph's own free node has run ("Graph Memory Nodes", CUDA Programming
// Guide). It is also left to the driver when the stream is unknown: the driver's own error.
std::optional<CUresult> allocate_managed(CUdeviceptr* dptr, std::uint64_t bytes, AllocKind kind,
                                         StreamHandle stream, bool stream_ordered = false, bool* outside = nullptr) {
  interpose::note_driver_alloc_hook_ran();
  bool ignored = false;
  bool& counts = outside != nullptr ? *outside : ignored;
  counts = false;
  if (dptr == nullptr || bytes == 0) return std::nullopt;  // the driver reports its own error
  // A stream-ordered allocation on a capturing stream is a graph memory node whichever way
  // it goes (the graph owns its memory), and one on a stream the driver does not know fails.
  bool capturing = false;
  std::uint64_t capture = 0;
  if (stream_ordered && interpose::capture_of(reinterpret_cast<CUstream>(stream), &capturing, &capture) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  counts = !capturing;
  Engine* e = engine_for_allocation();
  if (e == nullptr) {
    if (Engine* any = engine()) any->note_passed_through(false);
    return std::nullopt;
  }
  if (auto rk = interpose::runtime_alloc_kind()) {
    kind = *rk;
  }
  if (interpose::allocation_excluded()) {
    e->note_passed_through(true);
    return std::nullopt;
  }
  // Under the framework's own allocator, its trace (PyTorch's) is followed once it can be.
  if (!e->config().framework_per_tensor) interpose::maybe_attach_torch_tracker(*e, interpose::AttachPoint::allocation);
  std::uint64_t addr = 0;
  Result r;
  if (stream_ordered) {
    if (capturing) {
      e->note_passed_through(false);
      return std::nullopt;
    }
    interpose::RelaxedCaptureMode relaxed;  // stream-ordered calls are legal during capture; ours must stay so
    r = e->allocate(bytes, kind, stream, &addr);
  } else {
    r = e->allocate(bytes, kind, stream, &addr);
  }
  if (r.status == Status::not_supported) {
    e->note_passed_through(false);
    return std::nullopt;
  }
  if (!r.ok()) return interpose::to_cuda(r);
  *dptr = static_cast<CUdeviceptr>(addr);  // (its context registered for fences: CudaBackend::current_context)
  return CUDA_SUCCESS;
}

bool is_default_pool(CUmemoryPool pool) {
  CUdevice dev = 0;
  CUmemoryPool def = nullptr;
  interpose::ShimCallScope scope;
  if (real().cuCtxGetDevice == nullptr || real().cuDeviceGetDefaultMemPool == nullptr) return false;
  if (real().cuCtxGetDevice(&dev) != CUDA_SUCCESS) return false;
  return real().cuDeviceGetDefaultMemPool(&def, dev) == CUDA_SUCCESS && def == pool;
}

// Set once the program has made a pool of its own current on some device
// (cuDeviceSetMemPool): from then on cuMemAllocAsync asks which pool is current.
std::atomic<bool> g_program_pool_set{false};

// The pool cuMemAllocAsync takes from: "the memory pool current to the stream's device"
// (CUDA Driver API, cuMemAllocAsync), read as the current context's device like
// is_default_pool(). nullptr when unknown.
CUmemoryPool current_pool() {
  CUdevice dev = 0;
  CUmemoryPool pool = nullptr;
  interpose::ShimCallScope scope;
  if (real().cuCtxGetDevice == nullptr || real().cuDeviceGetMemPool == nullptr) return nullptr;
  if (real().cuCtxGetDevice(&dev) != CUDA_SUCCESS) return nullptr;
  return real().cuDeviceGetMemPool(&pool, dev) == CUDA_SUCCESS ? pool : nullptr;
}

// A stream-ordered allocation from a pool the program chose (one it created, or made the
// device's current pool): the driver's own, counted as memory outside Spillway when it is
// made outside a capture (a pool's properties, IPC export, location, release threshold,
// cannot be honoured in managed memory).
template <typename RealCall>
CUresult alloc_in_program_pool(CUdeviceptr* dptr, size_t bytes, CUstream mapped, RealCall real_call) {
  bool outside = false;
  if (Engine* e = engine(); e != nullptr && dptr != nullptr && bytes != 0) {
    e->note_passed_through(false);
    bool capturing = false;
    std::uint64_t capture = 0;
    outside = interpose::capture_of(mapped, &capturing, &capture) == CUDA_SUCCESS && !capturing;
  }
  CUresult r = real_call();
  return outside ? count_outside(r, dptr, bytes) : r;
}

// `mapped`: the stream as the driver reads it (the per-thread default stream for a _ptsz
// call's NULL stream); the real function is called with the caller's own argument.
CUresult alloc_async(CUdeviceptr* dptr, size_t bytes, CUstream stream, CUstream mapped,
                     CUresult (*real_fn)(CUdeviceptr*, size_t, CUstream)) {
  auto real_call = [&] { return real_fn(dptr, bytes, stream); };
  if (g_program_pool_set.load(std::memory_order_acquire)) {
    if (CUmemoryPool pool = current_pool(); pool == nullptr || !is_default_pool(pool)) {
      return alloc_in_program_pool(dptr, bytes, mapped, real_call);
    }
  }
  bool outside = false;
  if (auto r = allocate_managed(dptr, bytes, AllocKind::async, reinterpret_cast<StreamHandle>(mapped), true, &outside)) {
    return *r;
  }
  CUresult r = real_call();
  return outside ? count_outside(r, dptr, bytes) : r;
}

CUresult alloc_from_pool(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream, CUstream mapped,
                         CUresult (*real_fn)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)) {
  // Only the device's default pool is turned into managed memory.
  auto real_call = [&] { return real_fn(dptr, bytes, pool, stream); };
  if (pool == nullptr || !is_default_pool(pool)) return alloc_in_program_pool(dptr, bytes, mapped, real_call);
  bool outside = false;
  if (auto r = allocate_managed(dptr, bytes, AllocKind::pool_async, reinterpret_cast<StreamHandle>(mapped), true,
                                &outside)) {
    return *r;
  }
  CUresult r = real_call();
  return outside ? count_outside(r, dptr, bytes) : r;
}

// A stream-ordered free of a managed block. On a capturing stream it is a free node of the
// graph being captured: the block stays live until a launch of that graph has run
// (capture_registry.h). On a stream the driver does not know: its own error.
CUresult free_async(CUdeviceptr dptr, CUstream stream, CUstream mapped, CUresult (*real_fn)(CUdeviceptr, CUstream)) {
  if (Engine* e = engine(); e != nullptr && dptr != 0) {
    std::optional<bool> not_capturing;  // asked once: the Engine is told the answer
    if (e->owns_base(dptr)) {
      bool capturing = false;
      std::uint64_t capture = 0;
      if (CUresult q = interpose::capture_of(mapped, &capturing, &capture); q != CUDA_SUCCESS) return q;
      if (capturing) {
        interpose::capture_registry().defer_free(capture, dptr);
        return CUDA_SUCCESS;
      }
      not_capturing = false;
    }
    bool ours = false;
    Result r = e->release(dptr, reinterpret_cast<StreamHandle>(mapped), &ours, not_capturing);
    if (ours) return interpose::to_cuda(r);
  }
  return free_outside(dptr, [&] { return real_fn(dptr, stream); });
}

void substitute_out(CUresult r, void** pfn) {
  if (r == CUDA_SUCCESS && pfn != nullptr) *pfn = interpose::substitute(*pfn);
}

}  // namespace

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  interpose::ensure_driver();
  if (real().cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real().cuGetProcAddress(symbol, pfn, cudaVersion, flags);
  substitute_out(r, pfn);
  return r;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  interpose::ensure_driver();
  if (real().cuGetProcAddress_v2 == nullptr) return CUDA_ERROR_NOT_FOUND;
  CUresult r = real().cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
  substitute_out(r, pfn);
  return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  interpose::ensure_driver();
  bool outside = false;
  if (auto r = allocate_managed(dptr, bytesize, AllocKind::alloc, 0, false, &outside)) return *r;
  CUresult r = real().cuMemAlloc_v2(dptr, bytesize);
  return outside ? count_outside(r, dptr, bytesize) : r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes) {
  interpose::ensure_driver();
  bool valid = dptr != nullptr && pPitch != nullptr && WidthInBytes != 0 && Height != 0 &&
               (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16);
  bool outside = false;
  if (valid) {
    std::uint64_t pitch = (static_cast<std::uint64_t>(WidthInBytes) + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
    std::uint64_t bytes = pitch * Height;
    if (bytes / Height == pitch) {
      if (auto r = allocate_managed(dptr, bytes, AllocKind::pitch, 0, false, &outside)) {
        if (*r == CUDA_SUCCESS) *pPitch = pitch;
        return *r;
      }
    }
  }
  CUresult r = real().cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
  return outside && r == CUDA_SUCCESS ? count_outside(r, dptr, static_cast<std::uint64_t>(*pPitch) * Height) : r;
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  interpose::ensure_driver();
  return alloc_async(dptr, bytesize, hStream, hStream, real().cuMemAllocAsync);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  interpose::ensure_driver();
  return alloc_async(dptr, bytesize, hStream, per_thread(hStream), real().cuMemAllocAsync_ptsz);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  interpose::ensure_driver();
  return alloc_from_pool(dptr, bytesize, pool, hStream, hStream, real().cuMemAllocFromPoolAsync);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
  interpose::ensure_driver();
  return alloc_from_pool(dptr, bytesize, pool, hStream, per_thread(hStream), real().cuMemAllocFromPoolAsync_ptsz);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  interpose::ensure_driver();
  if (Engine* e = engine(); e != nullptr && dptr != 0) {
    bool ours = false;
    Result r = e->release(dptr, std::nullopt, &ours);
    if (ours) return interpose::to_cuda(r);
  }
  return free_outside(dptr, [&] { return real().cuMemFree_v2(dptr); });
}

// VMM (cuMemCreate/cuMemRelease): physical memory the program maps itself (PyTorch's
// expandable segments, XLA's VMM allocator). Passed through; memory on a device counts
// against the budget from its creation to its release (the driver frees it once the handle
// is released and every mapping of it is unmapped: CUDA Driver API, "Virtual Memory
// Management"; counting until the release is a bound from below).
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  interpose::ensure_driver();
  CUresult r = real().cuMemCreate(handle, size, prop, flags);
  if (r == CUDA_SUCCESS && handle != nullptr && prop != nullptr && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    if (Engine* e = engine()) {
      e->note_device_memory(Engine::DeviceMemory::vmm, *handle, size, prop->location.id);
      SPILLWAY_LOG_ONCE(LogLevel::warn,
                        "the program maps GPU memory itself (cuMemCreate: PyTorch's expandable_segments:True, a "
                        "VMM allocator); that memory cannot be made managed and cannot spill to host memory "
                        "(PyTorch: leave expandable_segments out of PYTORCH_CUDA_ALLOC_CONF)");
    }
  }
  return r;
}

// The program makes a pool of its own the device's current pool: cuMemAllocAsync (and the
// runtime's cudaMallocAsync) then allocate from it, and Spillway leaves them to the driver.
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  interpose::ensure_driver();
  CUresult r = real().cuDeviceSetMemPool(dev, pool);
  if (r == CUDA_SUCCESS) g_program_pool_set.store(true, std::memory_order_release);
  return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  interpose::ensure_driver();
  Engine* e = engine();
  int device = 0;
  const std::uint64_t bytes = e != nullptr ? e->take_device_memory(Engine::DeviceMemory::vmm, handle, &device) : 0;
  CUresult r = real().cuMemRelease(handle);
  if (r != CUDA_SUCCESS && bytes != 0) e->note_device_memory(Engine::DeviceMemory::vmm, handle, bytes, device);
  return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  interpose::ensure_driver();
  return free_async(dptr, hStream, hStream, real().cuMemFreeAsync);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  interpose::ensure_driver();
  return free_async(dptr, hStream, per_thread(hStream), real().cuMemFreeAsync_ptsz);
}

CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  interpose::ensure_driver();
  CUresult r = real().cuStreamCreate(phStream, Flags);
  if (r == CUDA_SUCCESS && phStream != nullptr) interpose::note_stream_created(*phStream, Flags);
  return r;
}

CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  interpose::ensure_driver();
  CUresult r = real().cuStreamCreateWithPriority(phStream, flags, priority);
  if (r == CUDA_SUCCESS && phStream != nullptr) interpose::note_stream_created(*phStream, flags);
  return r;
}

CUresult cuStreamDestroy_v2(CUstream hStream) {
  if (Engine* e = engine(); e != nullptr && hStream != nullptr) e->stream_destroyed(reinterpret_cast<StreamHandle>(hStream));
  interpose::forget_launch_stream(hStream);
  return real().cuStreamDestroy_v2(hStream);
}

// ---- copies and memsets: observed for the fences (cuda_backend.h, note_stream_work) ----
namespace {
template <typename Fn>
CUresult stream_work(CUstream stream, Fn&& call) {
  const CUresult r = call();
  if (r == CUDA_SUCCESS) interpose::note_stream_work(stream);
  return r;
}
}  // namespace

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemcpyHtoD_v2(dst, src, n); });
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemcpyDtoH_v2(dst, src, n); });
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemcpyDtoD_v2(dst, src, n); });
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemcpy(dst, src, n); });
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return stream_work(s, [&] { return real().cuMemcpyAsync(dst, src, n, s); });
}
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return stream_work(per_thread(s), [&] { return real().cuMemcpyAsync_ptsz(dst, src, n, s); });
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemsetD8_v2(dst, value, n); });
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  return stream_work(nullptr, [&] { return real().cuMemsetD32_v2(dst, value, n); });
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  interpose::ensure_driver();
  Engine* e = engine();
  if (e == nullptr || e->config().report_memory == ReportMemory::physical || !e->usable()) {
    return real().cuMemGetInfo_v2(free, total);
  }
  // virtual: what the program may still allocate under the managed cap. The driver still
  // judges the arguments (drivers differ on NULL outputs: the real one fills the others and
  // succeeds), so a NULL argument gets exactly the driver's own answer.
  CUresult r = real().cuMemGetInfo_v2(free, total);
  if (r != CUDA_SUCCESS) return r;
  // (The sub-allocator's ranges count as far as blocks fill them: room freed in them is room
  // the program may allocate again.)
  std::uint64_t cap = e->max_managed_bytes();
  std::uint64_t used = e->reported_used_bytes();
  if (total != nullptr) *total = cap;
  if (free != nullptr) *free = used < cap ? cap - used : 0;
  return CUDA_SUCCESS;
}

// Managed memory is reported truthfully (IS_MANAGED = 1): frameworks that ask get the
// real answer. A block the sub-allocator carved from one of its ranges is an allocation of
// its own to the program, as the driver would have made it: its range start and size are
// the block's, and its buffer id is the block's own (the Engine's id with the top bit set,
// apart from the driver's small counters), never the range's; its context and device are the
// range's, which was made in the block's own context (Engine::allocate). A pointer into a
// range's free space is no allocation: it gets the driver's answer for an address that no
// allocation holds (kNoAllocation), in every attribute, as freed memory would.
namespace {

// An address no allocation holds: the first page, which Linux never maps (vm.mmap_min_addr).
constexpr CUdeviceptr kNoAllocation = 0x1000;

// The driver's answer for kNoAllocation, made the answer for `ptr`: an attribute that echoes
// the address asked about (an unallocated address's host pointer is that address: driver
// 580.159.04 on an H200, docs/gpu-results.md) names `ptr`, not kNoAllocation.
void readdress(CUpointer_attribute attribute, void* data, CUdeviceptr ptr) {
  if (data == nullptr) return;
  const bool address = attribute == CU_POINTER_ATTRIBUTE_HOST_POINTER || attribute == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
                       attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR;
  if (address && *static_cast<CUdeviceptr*>(data) == kNoAllocation) *static_cast<CUdeviceptr*>(data) = ptr;
}

std::optional<Block> carved_block(CUdeviceptr ptr, bool* in_range_gap) {
  *in_range_gap = false;
  Engine* e = engine();
  if (e == nullptr || !e->suballocating() || ptr == 0 || !e->maybe_managed(ptr)) return std::nullopt;
  std::optional<Block> b = e->find(ptr);
  if (b && b->suballocated) return b;
  *in_range_gap = !b && e->in_suballocator_range(ptr);
  return std::nullopt;
}

// Writes the block's answer for `attribute` into `data`; false for attributes it does not change.
bool block_attribute(const Block& b, CUpointer_attribute attribute, void* data) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = b.base; return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = b.bytes; return true;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = b.id | (1ull << 63); return true;
    default: return false;
  }
}

}  // namespace

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  interpose::ensure_driver();
  bool gap = false;
  std::optional<Block> b = carved_block(ptr, &gap);
  CUresult r = real().cuPointerGetAttribute(data, attribute, gap ? kNoAllocation : ptr);
  if (r == CUDA_SUCCESS && gap) readdress(attribute, data, ptr);
  if (r == CUDA_SUCCESS && data != nullptr && b) block_attribute(*b, attribute, data);
  return r;
}

CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  interpose::ensure_driver();
  bool gap = false;
  std::optional<Block> b = carved_block(ptr, &gap);
  CUresult r = real().cuPointerGetAttributes(numAttributes, attributes, data, gap ? kNoAllocation : ptr);
  if (r == CUDA_SUCCESS && gap && attributes != nullptr && data != nullptr) {
    for (unsigned i = 0; i < numAttributes; ++i) readdress(attributes[i], data[i], ptr);
  }
  if (r != CUDA_SUCCESS || attributes == nullptr || data == nullptr || !b) return r;
  for (unsigned i = 0; i < numAttributes; ++i) {
    if (data[i] != nullptr) block_attribute(*b, attributes[i], data[i]);
  }
  return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  interpose::ensure_driver();
  bool gap = false;
  std::optional<Block> b = carved_block(dptr, &gap);
  if (!b && !gap) return real().cuMemGetAddressRange_v2(pbase, psize, dptr);
  if (gap) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = b->base;  // either output may be NULL
  if (psize != nullptr) *psize = b->bytes;
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  interpose::ensure_driver();
  CUresult r = real().cuIpcGetMemHandle(pHandle, dptr);
  Engine* e = engine();
  if (r != CUDA_SUCCESS && e != nullptr && e->find(dptr)) {
    SPILLWAY_LOG_ONCE(LogLevel::warn,
                      "cuIpcGetMemHandle failed ({}) on {:#x}: CUDA cannot share managed memory between processes; "
                      "add the library that allocates it to SPILLWAY_EXCLUDE (e.g. SPILLWAY_EXCLUDE=libnccl,libyourlib) "
                      "to keep its allocations as device memory",
                      static_cast<int>(r), static_cast<unsigned long long>(dptr));
  }
  return r;
}

}  // namespace spillway::hook
