// fakecuda driver entry points: the CUDA driver API subset Spillway touches, exported
// under the real CUDA 13.0 versioned symbol names (cuMemAlloc_v2, cuMemAllocAsync_ptsz,
// v1 cuMemAlloc, ...). Signatures are checked by the compiler against cuda.h (compiled
// with __CUDA_API_VERSION_INTERNAL); semantics follow the driver API reference, with
// memory in host RAM. cuGetProcAddress lives in procs.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>

#include "core.h"

using namespace fakecuda;

namespace {

bool managed_kind(Kind k) { return k == Kind::Managed; }
bool freeable_kind(Kind k) { return k == Kind::Device || k == Kind::Managed; }
bool gpu_visible(Kind k) { return k != Kind::Host; }
bool host_kind(Kind k) { return k == Kind::Host; }

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

CUresult check_device(CUdevice dev) { return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

// Resolves a stream handle for a stream-ordered call; nullptr → invalid handle.
Stream* stream_of(CUstream s) {
  std::lock_guard lock(stream_mutex());
  return lookup_stream(s);
}

// The device of a stream's context (a stream lives as long as its context).
int stream_device(Stream* s) {
  std::lock_guard lock(stream_mutex());
  return s->ctx->device;
}

bool capturing(Stream* s) {
  std::lock_guard lock(stream_mutex());
  return s->capturing;
}

// Stream-ordered work: captured work is only logged; otherwise it is queued (FAKECUDA_ASYNC)
// or completed at once. Returns whether the work is executed (not captured).
bool submit(Stream* s, Stream::Op op = {}) {
  std::lock_guard lock(stream_mutex());
  if (!s->capturing) enqueue(s, op);
  return !s->capturing;
}

// ---- allocation helpers ----------------------------------------------------------------
// An allocation on `device` (-1: the current context's), made in the current context.
CUresult alloc_call(Call& c, CUdeviceptr* dptr, size_t size, Kind kind, CUmemoryPool pool = nullptr, int device = -1) {
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0) device = current_device();
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = alloc(kind, size, dptr, device, current_context(), pool);
  if (r == CUDA_SUCCESS) c.hex("dptr", *dptr);
  return r;
}

// A pool handle's values: managed (CUDA 13 managed pools) and the device it gives memory of.
// Each device has its own default pool, whose memory is that device's ("The default memory
// pool of a device contains device memory from that device", cuMemAllocAsync).
CUmemoryPool default_pool(int device) {
  static std::mutex mutex;
  static CUmemoryPool pools[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard lock(mutex);
  if (!pools[device]) pools[device] = static_cast<CUmemoryPool>(new_handle("pool", 0, static_cast<uint64_t>(device)));
  return pools[device];
}
bool is_default_pool(CUmemoryPool pool) {
  for (int d = 0; d < kMaxDevices; ++d)
    if (pool == default_pool(d)) return true;
  return false;
}

// The device's current pool, the one cuMemAllocAsync allocates from (cuDeviceSetMemPool:
// "Sets the current memory pool of a device"); nullptr: its default pool.
std::mutex g_current_pool_mutex;
CUmemoryPool g_current_pool[kMaxDevices] = {};
CUmemoryPool current_pool(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard lock(g_current_pool_mutex);
  CUmemoryPool p = g_current_pool[device];
  return p ? p : default_pool(device);
}
// A pool destroyed while current: its device's default pool is current again.
void forget_current_pool(CUmemoryPool pool) {
  std::lock_guard lock(g_current_pool_mutex);
  for (CUmemoryPool& p : g_current_pool)
    if (p == pool) p = nullptr;
}
bool pool_kind(CUmemoryPool pool, Kind* kind, int* device) {
  uint64_t managed = 0, dev = 0;
  if (!handle_is(pool, "pool", &managed, &dev)) return false;
  *kind = managed ? Kind::Managed : Kind::Device;
  *device = static_cast<int>(dev);
  return true;
}

// pool nullptr (cuMemAllocAsync): "the memory pool current to the stream's device"
// (cuDeviceSetMemPool).
CUresult alloc_async(Call& c, CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream stream) {
  Stream* s = stream_of(stream);
  if (!pool && s) pool = current_pool(stream_device(s));
  c.dec("bytesize", size).ptr("pool", pool).stream(stream);
  FC_CHECK(c);
  Kind kind;
  int device = 0;
  if (!dptr || (pool && !pool_kind(pool, &kind, &device))) return CUDA_ERROR_INVALID_VALUE;
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  // Managed pool memory is on no device: it gets the current one, as cuMemAllocManaged's.
  CUresult r = alloc_call(c, dptr, size, kind, pool, kind == Kind::Managed ? -1 : device);
  if (r == CUDA_SUCCESS) submit(s);
  return r;
}

CUresult free_async(Call& c, CUdeviceptr dptr, CUstream stream) {
  c.hex("dptr", dptr).stream(stream);
  FC_CHECK(c);
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  Alloc a;
  if (!find(dptr, &a) || a.base != dptr || !freeable_kind(a.kind)) return CUDA_ERROR_INVALID_VALUE;
  submit(s, {nullptr, dptr});  // released when the stream gets there
  return CUDA_SUCCESS;
}

// ---- unified memory hints ----------------------------------------------------------------
bool valid_location(CUmemLocation loc) {
  return (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(loc.id)) ||
         loc.type == CU_MEM_LOCATION_TYPE_HOST || loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         loc.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

CUresult prefetch(Call& c, CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags, CUstream stream) {
  c.hex("dptr", p).dec("count", n).sdec("loc_type", loc.type).sdec("loc_id", loc.id).dec("flags", flags);
  c.stream(stream);
  FC_CHECK(c);
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (!covers(p, n, managed_kind)) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_location(loc)) return CUDA_ERROR_INVALID_DEVICE;
  if (submit(s)) residency_prefetch(p, n, loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1, stream_device(s));
  return CUDA_SUCCESS;
}

// cuMemDiscardBatchAsync (CUDA 13.0): every range must be managed, flags 0, the stream not
// the legacy NULL stream. A discarded range's contents are indeterminate: the fake drops its
// pages (madvise(MADV_DONTNEED) on its private anonymous mapping: they read as zeros
// afterwards and hold no memory, as the driver's discard frees them), so a program that reads
// a live range discarded by mistake sees its data gone; a range not on page boundaries is
// zeroed instead. The residency model drops its chunks without a write-back.
void drop_pages(CUdeviceptr p, size_t n) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* at = reinterpret_cast<void*>(p);
  if (p % page == 0 && n % page == 0 && ::madvise(at, n, MADV_DONTNEED) == 0) return;
  std::memset(at, 0, n);
}

// A batch call's first ranges in its log line: d0= n0= ... (at most 8).
void log_ranges(Call& c, const CUdeviceptr* dptrs, const size_t* sizes, size_t count) {
  for (size_t i = 0; i < count && i < 8 && dptrs && sizes; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "d%zu", i);
    c.hex(key, dptrs[i]);
    std::snprintf(key, sizeof key, "n%zu", i);
    c.dec(key, sizes[i]);
  }
}

CUresult discard_batch(Call& c, CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags, CUstream stream) {
  c.dec("count", count).dec("flags", flags);
  log_ranges(c, dptrs, sizes, count);
  c.stream(stream);
  FC_CHECK(c);
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (count == 0 || dptrs == nullptr || sizes == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || !covers(dptrs[i], sizes[i], managed_kind)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!submit(s)) return CUDA_SUCCESS;  // captured: not run
  int device = stream_device(s);
  for (size_t i = 0; i < count; ++i) {
    drop_pages(dptrs[i], sizes[i]);
    residency_discard(dptrs[i], sizes[i], device);
  }
  return CUDA_SUCCESS;
}

// cuMemPrefetchBatchAsync (CUDA 13.0): every range managed and of non-zero size, flags 0,
// the stream not the legacy NULL stream; 1 <= numPrefetchLocs <= count, prefetchLocIdxs
// starting at 0 and rising, each below count, and each location valid. Each range then
// moves as cuMemPrefetchAsync moves it, to the location whose index range holds it.
CUresult prefetch_batch(Call& c, CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs, size_t* loc_idxs,
                        size_t num_locs, unsigned long long flags, CUstream stream) {
  c.dec("count", count).dec("locs", num_locs).dec("flags", flags);
  log_ranges(c, dptrs, sizes, count);
  if (locs && num_locs > 0) c.sdec("loc_type", locs[0].type).sdec("loc_id", locs[0].id);
  c.stream(stream);
  FC_CHECK(c);
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (count == 0 || !dptrs || !sizes || !locs || !loc_idxs || num_locs == 0 || num_locs > count || flags != 0 ||
      loc_idxs[0] != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t k = 0; k < num_locs; ++k) {
    if ((k > 0 && loc_idxs[k] <= loc_idxs[k - 1]) || loc_idxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_location(locs[k])) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || !covers(dptrs[i], sizes[i], managed_kind)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!submit(s)) return CUDA_SUCCESS;  // captured: not run
  size_t k = 0;
  for (size_t i = 0; i < count; ++i) {
    while (k + 1 < num_locs && loc_idxs[k + 1] <= i) ++k;
    const CUmemLocation& loc = locs[k];
    residency_prefetch(dptrs[i], sizes[i], loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1, stream_device(s));
  }
  return CUDA_SUCCESS;
}

CUmemLocation location_of(CUdevice dev) {
  CUmemLocation loc{};
  if (dev == CU_DEVICE_CPU) {
    loc.type = CU_MEM_LOCATION_TYPE_HOST;
  } else {
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
  }
  return loc;
}

CUresult advise(Call& c, CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  c.hex("dptr", p).dec("count", n).sdec("advice", advice).sdec("loc_type", loc.type).sdec("loc_id", loc.id);
  FC_CHECK(c);
  if (!covers(p, n, managed_kind)) return CUDA_ERROR_INVALID_VALUE;
  if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
    return CUDA_ERROR_INVALID_VALUE;
  bool needs_location = advice != CU_MEM_ADVISE_SET_READ_MOSTLY && advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY;
  if (needs_location && !valid_location(loc)) return CUDA_ERROR_INVALID_DEVICE;
  residency_advise(p, n, advice, loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1);
  return CUDA_SUCCESS;
}

// ---- copies ------------------------------------------------------------------------------------
CUresult copy(Call& c, void* dst, const void* src, size_t n, bool dst_dev, bool src_dev) {
  c.ptr("dst", dst).ptr("src", src).dec("bytes", n);
  FC_CHECK(c);
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  if (dst_dev && !covers(addr(dst), n, gpu_visible)) return CUDA_ERROR_INVALID_VALUE;
  if (src_dev && !covers(addr(src), n, gpu_visible)) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(dst, src, n);
  return CUDA_SUCCESS;
}

void* as_ptr(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

// ---- pointer attributes -----------------------------------------------------------------------
// Booleans (IS_MANAGED, MAPPED, IS_LEGACY_CUDA_IPC_CAPABLE) are written as unsigned int.
CUresult pointer_attribute(CUpointer_attribute attr, const Alloc* a, CUdeviceptr p, void* data) {
  auto put = [&](auto v) { std::memcpy(data, &v, sizeof v); };
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: put(a ? a->ctx : CUcontext{}); break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(static_cast<unsigned>(!a ? 0 : a->kind == Kind::Host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: put(a ? p : CUdeviceptr{0}); break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (a && (a->kind == Kind::Device || a->kind == Kind::Vmm)) return CUDA_ERROR_INVALID_VALUE;
      put(a ? as_ptr(p) : nullptr);
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: put(static_cast<unsigned long long>(a ? a->id : 0)); break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: put(static_cast<unsigned>(a && a->kind == Kind::Managed)); break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: put(a ? a->device : -2); break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      put(static_cast<unsigned>(a && a->kind == Kind::Device));
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: put(a ? CUdeviceptr{a->base} : CUdeviceptr{0}); break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put(a ? a->size : size_t{0}); break;
    case CU_POINTER_ATTRIBUTE_MAPPED: put(static_cast<unsigned>(a != nullptr)); break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: put(a ? a->pool : CUmemoryPool{}); break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- kernels --------------------------------------------------------------------------------
std::mutex g_launch_mutex;
std::string g_last_name;
std::vector<uint64_t> g_last_params;
bool g_launched = false;

uint64_t load_le(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  std::memcpy(&v, p, std::min<size_t>(n, 8));  // little-endian host
  return v;
}

bool device_range(uint64_t p, uint64_t count) {
  if (count > SIZE_MAX / 4) return false;
  return count == 0 || covers(p, count * 4, gpu_visible);
}

// The managed allocations that the 8-byte-aligned words of the parameters (of 8 bytes or
// more; `offsets` in the kernel's layout) point into, each once: what the residency model
// touches.
std::vector<std::pair<uintptr_t, size_t>> managed_arguments(const Function& fn,
                                                            const std::vector<const unsigned char*>& bytes) {
  std::vector<std::pair<uintptr_t, size_t>> blocks;
  for (size_t i = 0; i < fn.sizes.size(); ++i) {
    for (size_t o = (8 - fn.offsets[i] % 8) % 8; o + 8 <= fn.sizes[i]; o += 8) {
      uint64_t word = 0;
      std::memcpy(&word, bytes[i] + o, 8);
      Alloc a;
      if (!find(word, &a) || !managed_kind(a.kind)) continue;
      std::pair<uintptr_t, size_t> b{a.base, a.size};
      if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
    }
  }
  return blocks;
}

// The data work of the fake's kernels and memsets: the "GPU" writing the program's memory.
// ThreadSanitizer does not instrument it: it is data the device would write, which the shim
// never touches (the sanitizers check the shim), and these loops took most of the TSan
// suite's time. AddressSanitizer still checks them.
__attribute__((no_sanitize("thread"))) void fill_words(uint32_t* p, uint64_t count, uint32_t value) {
  for (uint64_t i = 0; i < count; ++i) p[i] = value;
}

__attribute__((no_sanitize("thread"))) void add_words(uint32_t* d, const uint32_t* x, const uint32_t* y, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) d[i] = x[i] + y[i];
}

// What a launch touches of managed memory, for the residency model: the bytes fill_u32 and
// add_u32 really access (a kernel touches its data, not the whole allocation its pointers lie
// in, which may be a sub-allocator's range), else every managed allocation a parameter word
// points into.
// fill_u32 writes its pointer's range, add_u32 writes dst and reads a and b; any other kernel
// is taken to write every managed allocation it is given (it may).
std::vector<TouchedRange> touched_ranges(const Function& fn, const std::vector<uint64_t>& values,
                                         const std::vector<const unsigned char*>& bytes) {
  auto arg = [&](size_t i) { return i < values.size() ? values[i] : 0; };
  std::vector<uint64_t> ptrs;
  uint64_t count = 0;
  if (fn.name.rfind("fill_u32", 0) == 0) {
    ptrs = {arg(0)};
    count = arg(1);
  } else if (fn.name.rfind("add_u32", 0) == 0) {
    ptrs = {arg(0), arg(1), arg(2)};
    count = arg(3);
  } else {
    std::vector<TouchedRange> ranges;
    for (const auto& [base, size] : managed_arguments(fn, bytes)) ranges.push_back(TouchedRange{base, size, true});
    return ranges;
  }
  std::vector<TouchedRange> ranges;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    Alloc a;
    const uint64_t p = ptrs[i];
    if (count == 0 || !find(p, &a) || !managed_kind(a.kind)) continue;
    auto same = std::find_if(ranges.begin(), ranges.end(), [&](const TouchedRange& r) { return r.base == p && r.size == count * 4; });
    if (same != ranges.end()) same->write = same->write || i == 0;
    else ranges.push_back(TouchedRange{p, count * 4, i == 0});  // (argument 0 is the one written)
  }
  return ranges;
}

// Executes a launch on the CPU; the kernel's behaviour is chosen by its name.
CUresult launch(Call& c, CUfunction f, unsigned grid[3], unsigned block[3], CUstream stream,
                void** params, void** extra) {
  auto* fn = reinterpret_cast<const Function*>(f);
  c.ptr("func", f);
  if (f && valid_function(f)) c.str("name", fn->name.c_str());
  char dims[48];
  std::snprintf(dims, sizeof dims, "%u,%u,%u", grid[0], grid[1], grid[2]);
  c.str("grid", dims);
  std::snprintf(dims, sizeof dims, "%u,%u,%u", block[0], block[1], block[2]);
  c.str("block", dims);
  c.stream(stream);
  FC_CHECK(c);
  if (!f) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_function(f)) return CUDA_ERROR_INVALID_HANDLE;
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  // "A kernel launch will fail if it is issued to a stream that is not associated to the
  // current device" (CUDA C++ Programming Guide, Multi-Device System: Stream and Event
  // Behavior): the launch runs on the current context's device.
  int device = -1;
  {
    std::lock_guard lock(stream_mutex());
    Context* cur = current();
    if (!cur || s->ctx != cur) return CUDA_ERROR_INVALID_HANDLE;
    device = cur->device;
  }
  if (grid[0] * grid[1] * grid[2] == 0 || block[0] * block[1] * block[2] == 0) return CUDA_ERROR_INVALID_VALUE;

  // Collect the parameter bytes from kernelParams or from CU_LAUNCH_PARAM_BUFFER_POINTER.
  const unsigned char* buffer = nullptr;
  size_t buffer_size = 0;
  for (void** e = extra; e && *e != CU_LAUNCH_PARAM_END; e += 2) {
    if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = static_cast<const unsigned char*>(e[1]);
    else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE && e[1]) buffer_size = *static_cast<size_t*>(e[1]);
    else return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<uint64_t> values;
  std::vector<const unsigned char*> bytes;
  for (size_t i = 0; i < fn->sizes.size(); ++i) {
    const unsigned char* p = nullptr;
    if (params) p = static_cast<const unsigned char*>(params[i]);
    else if (buffer && fn->offsets[i] + fn->sizes[i] <= buffer_size) p = buffer + fn->offsets[i];
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    bytes.push_back(p);
    values.push_back(load_le(p, fn->sizes[i]));
    char key[24];
    std::snprintf(key, sizeof key, "p%zu", i);
    c.hex(key, values.back());
  }
  {
    std::lock_guard lock(g_launch_mutex);
    g_last_name = fn->name;
    g_last_params = values;
    g_launched = true;
  }
  if (capturing(s)) return CUDA_SUCCESS;  // captured, not run

  auto arg = [&](size_t i) { return i < values.size() ? values[i] : 0; };
  if (fn->name.rfind("fill_u32", 0) == 0) {
    uint64_t ptr = arg(0), count = arg(1);
    if (!device_range(ptr, count)) {
      c.hex("fault", ptr);
      return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    fill_words(reinterpret_cast<uint32_t*>(ptr), count, static_cast<uint32_t>(arg(2)));
  } else if (fn->name.rfind("add_u32", 0) == 0) {
    uint64_t dst = arg(0), a = arg(1), b = arg(2), count = arg(3);
    for (uint64_t p : {dst, a, b})
      if (!device_range(p, count)) {
        c.hex("fault", p);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
      }
    add_words(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(b),
              count);
  }
  if (submit(s) && config().gpu_memory) residency_launch(device, touched_ranges(*fn, values, bytes));
  return CUDA_SUCCESS;
}

CUresult launch_kernel(Call& c, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params, void** extra) {
  unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  c.dec("shmem", shmem);
  return launch(c, f, grid, block, stream, params, extra);
}

CUresult launch_ex(Call& c, const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (!config) {
    FC_CHECK(c);
    return CUDA_ERROR_INVALID_VALUE;
  }
  unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  c.dec("shmem", config->sharedMemBytes);
  return launch(c, f, grid, block, config->hStream, params, extra);
}

// ---- streams, events, capture ---------------------------------------------------------------
CUresult stream_sync(Call& c, CUstream stream) {
  c.stream(stream);
  FC_CHECK(c);
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  complete(s);
  return CUDA_SUCCESS;
}

CUresult stream_query(Call& c, CUstream stream) {
  c.stream(stream);
  FC_CHECK(c);
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  return any_pending(s) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult stream_wait_event(Call& c, CUstream stream, CUevent event, unsigned flags) {
  c.ptr("event", event).dec("flags", flags).stream(stream);
  FC_CHECK(c);
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  Event* e = lookup_event(event);
  if (!s || !e) return CUDA_ERROR_INVALID_HANDLE;
  // An event of another context or device is legal ("hEvent may be from a different
  // context or device than hStream", cuStreamWaitEvent, CUDA Driver API, Stream Management).
  // Data effects happen at call time; with FAKECUDA_ASYNC the stream's later work completes
  // only after the event's (so a fence event after a wait is complete only once what it
  // waited for is).
  if (!s->capturing) enqueue_wait(s, e);
  return CUDA_SUCCESS;
}

CUresult begin_capture(Call& c, CUstream stream, CUstreamCaptureMode mode) {
  c.sdec("mode", mode).stream(stream);
  FC_CHECK(c);
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (is_default_stream(stream)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  static uint64_t captures = 0;  // (stream_mutex)
  s->capturing = true;
  s->mode = mode;
  s->capture_id = ++captures;
  return CUDA_SUCCESS;
}

// Status and id only (graphs are opaque: no graph, no dependencies).
CUresult capture_info(Call& c, CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  c.stream(stream);
  FC_CHECK(c);
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  *status = s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (s->capturing) {
    if (id) *id = s->capture_id;
    if (graph) *graph = nullptr;
    if (deps) *deps = nullptr;
    if (edges) *edges = nullptr;
    if (ndeps) *ndeps = 0;
    c.dec("id", s->capture_id);
  }
  return CUDA_SUCCESS;
}

CUresult is_capturing(Call& c, CUstream stream, CUstreamCaptureStatus* status) {
  return capture_info(c, stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

CUresult end_capture(Call& c, CUstream stream, CUgraph* graph) {
  c.stream(stream);
  FC_CHECK(c);
  if (!graph) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (!s->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  s->capturing = false;
  *graph = static_cast<CUgraph>(new_handle("graph"));
  c.ptr("graph", *graph);
  return CUDA_SUCCESS;
}

CUresult event_record(Call& c, CUevent event, CUstream stream) {
  c.ptr("event", event).stream(stream);
  FC_CHECK(c);
  std::lock_guard lock(stream_mutex());
  Stream* s = lookup_stream(stream);
  Event* e = lookup_event(event);
  if (!s || !e) return CUDA_ERROR_INVALID_HANDLE;
  // "hEvent and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE
  // is returned" (cuEventRecord, CUDA Driver API, Event Management).
  if (e->ctx != s->ctx) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capturing) return CUDA_SUCCESS;  // becomes a graph node; not run
  e->recorded = true;
  e->stream = s;
  e->when = std::chrono::steady_clock::now();
  e->complete = false;
  enqueue(s, {e, 0});
  return CUDA_SUCCESS;
}

CUresult elapsed(Call& c, float* ms, CUevent start, CUevent end) {
  c.ptr("start", start).ptr("end", end);
  FC_CHECK(c);
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  Event* a = lookup_event(start);
  Event* b = lookup_event(end);
  if (!a || !b || !a->timing || !b->timing || !a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  // "cudaEventElapsedTime() will fail if the two input events are associated to different
  // devices" (CUDA C++ Programming Guide, Multi-Device System: Stream and Event Behavior).
  if (a->ctx->device != b->ctx->device) return CUDA_ERROR_INVALID_HANDLE;
  if (!a->complete || !b->complete) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return CUDA_SUCCESS;
}

// The stream's context (cuStreamGetCtx): v2 also answers its green context (none here).
CUresult stream_ctx(Call& c, CUstream stream, CUcontext* pctx, CUgreenCtx* green, bool v2) {
  c.ptr("stream", stream);
  FC_CHECK(c);
  if (!pctx && !(v2 && green)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  if (is_default_stream(stream) && !current()) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(s->ctx);
  if (green) *green = nullptr;
  c.ptr("ctx", s->ctx);
  return CUDA_SUCCESS;
}

CUresult stream_dev(Call& c, CUstream stream, CUdevice* device) {
  c.ptr("stream", stream);
  FC_CHECK(c);
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  if (is_default_stream(stream) && !current()) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* s = lookup_stream(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  *device = s->ctx->device;
  c.sdec("dev", *device);
  return CUDA_SUCCESS;
}

CUresult graph_launch(Call& c, CUgraphExec exec, CUstream stream) {
  c.ptr("exec", exec).stream(stream);
  FC_CHECK(c);
  if (!exec) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = stream_of(stream);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  submit(s);
  return CUDA_SUCCESS;
}

// ---- VMM ------------------------------------------------------------------------------------
std::mutex g_vmm_mutex;
std::map<uintptr_t, size_t> g_reservations;  // base → length (mmap'd, PROT_READ|WRITE)

bool in_reservation(uintptr_t p, size_t n) {
  std::lock_guard lock(g_vmm_mutex);
  auto it = g_reservations.upper_bound(p);
  if (it == g_reservations.begin()) return false;
  --it;
  return p >= it->first && n <= it->first + it->second - p;
}

// ---- error strings -----------------------------------------------------------------------
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
const ErrorText* error_text(CUresult r) {
  for (const ErrorText& e : kErrors)
    if (e.code == r) return &e;
  return nullptr;
}

// ---- devices and contexts -------------------------------------------------------------------
// A device's identity follows its physical ordinal p (whatever CUDA_VISIBLE_DEVICES makes of
// its visible one): PCI bus p ("0000:0p:00.0"), UUID fa4ecda0-0000-0000-0000-0000000000pp.
int pci_bus(CUdevice dev) { return physical_ordinal(dev); }

CUresult device_uuid(Call& c, CUuuid* uuid, CUdevice dev) {
  c.sdec("dev", dev);
  FC_CHECK(c);
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  const unsigned char prefix[4] = {0xfa, 0x4e, 0xcd, 0xa0};
  std::memset(uuid->bytes, 0, sizeof uuid->bytes);
  std::memcpy(uuid->bytes, prefix, sizeof prefix);
  uuid->bytes[15] = static_cast<char>(physical_ordinal(dev));
  return CUDA_SUCCESS;
}
Context& primary(CUdevice dev) { return *live_context(primary_context(dev)); }  // (stream_mutex; dev checked)

// Flags are kept and reported (cuDevicePrimaryCtxGetState, cuCtxGetFlags is not faked); they
// change nothing. The v1 ABI refuses while the context is active ("CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
// is returned if the primary context is active", CUDA 10.2 Driver API, Primary Context
// Management); _v2 (CUDA 11) sets them at any time.
CUresult primary_set_flags(Call& c, CUdevice dev, unsigned flags, bool v1) {
  c.sdec("dev", dev).dec("flags", flags);
  FC_CHECK(c);
  if (CUresult r = check_device(dev)) return r;
  if (flags & ~unsigned{CU_CTX_FLAGS_MASK}) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(stream_mutex());
  Context& p = primary(dev);
  if (v1 && p.refcount > 0) return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
  p.flags = flags;
  return CUDA_SUCCESS;
}
// "Creates a new CUDA context and associates it with the calling thread ... If a context is
// already current to the thread, it is supplanted by the newly created context and may be
// restored by a subsequent call to cuCtxPopCurrent()" (cuCtxCreate, CUDA Driver API, Context
// Management): pushed. Execution affinity and CIG parameters are accepted and ignored.
CUresult create(Call& c, CUcontext* pctx, unsigned flags, CUdevice dev) {
  c.dec("flags", flags).sdec("dev", dev);
  FC_CHECK(c);
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~unsigned{CU_CTX_FLAGS_MASK}) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_device(dev)) return r;
  std::lock_guard lock(stream_mutex());
  *pctx = reinterpret_cast<CUcontext>(create_context(dev, flags));
  push_context(*pctx);
  c.ptr("ctx", *pctx);
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" {

// ---- initialization, device ----------------------------------------------------------------
// With no device visible (CUDA_VISIBLE_DEVICES empty or starting with an invalid entry)
// cuInit fails with CUDA_ERROR_NO_DEVICE and the driver stays uninitialized, as the real one
// (its cuDeviceGetCount then answers CUDA_ERROR_NOT_INITIALIZED). A process that already
// initialized stays so over a reload: its cuDeviceGetCount answers 0.
CUresult CUDAAPI cuInit(unsigned int flags) {
  return api("cuInit", "cuInit", kNoInit, [&](Call& c) {
    c.dec("flags", flags);
    FC_CHECK(c);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
    set_initialized();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  return api("cuDriverGetVersion", "cuDriverGetVersion", kNoInit, [&](Call& c) {
    FC_CHECK(c);
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
  });
}

// A CUdevice is its visible ordinal.
CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return api("cuDeviceGet", "cuDeviceGet", kNone, [&](Call& c) {
    c.sdec("ordinal", ordinal);
    FC_CHECK(c);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return api("cuDeviceGetCount", "cuDeviceGetCount", kNone, [&](Call& c) {
    FC_CHECK(c);
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count();
    c.sdec("count", *count);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return api("cuDeviceGetName", "cuDeviceGetName", kNone, [&](Call& c) {
    c.sdec("len", len).sdec("dev", dev);
    FC_CHECK(c);
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    std::snprintf(name, static_cast<size_t>(len), "%s", "Fakecuda GPU");
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return api("cuDeviceGetAttribute", "cuDeviceGetAttribute", kNone, [&](Call& c) {
    c.sdec("attrib", attrib).sdec("dev", dev);
    FC_CHECK(c);
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    switch (attrib) {
      case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *pi = config().concurrent_managed_access; break;
      case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *pi = 32; break;
      case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = 2147483647; break;
      case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: *pi = 0; break;
      case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
      case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
      case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
      case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = pci_bus(dev); break;
      default: *pi = 0; break;  // (PCI domain and device ids: 0)
    }
    c.sdec("value", *pi);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return api("cuDeviceGetUuid", "cuDeviceGetUuid", kNone, [&](Call& c) { return device_uuid(c, uuid, dev); });
}
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {  // (the MIG-aware one: no MIG here)
  return api("cuDeviceGetUuid_v2", "cuDeviceGetUuid", kNone, [&](Call& c) { return device_uuid(c, uuid, dev); });
}

// "[domain]:[bus]:[device].[function]" in hex, as nvidia-smi prints it (cuDeviceGetPCIBusId:
// "pciBusId - Returned identifier string for the device in the following format
// [domain]:[bus]:[device].[function]", CUDA Driver API, Device Management).
CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return api("cuDeviceGetPCIBusId", "cuDeviceGetPCIBusId", kNone, [&](Call& c) {
    c.sdec("len", len).sdec("dev", dev);
    FC_CHECK(c);
    if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    std::snprintf(pciBusId, static_cast<size_t>(len), "0000:%02x:00.0", static_cast<unsigned>(pci_bus(dev)));
    c.str("id", pciBusId);
    return CUDA_SUCCESS;
  });
}

// Accepts the forms the reference names: "[domain]:[bus]:[device].[function]",
// "[domain]:[bus]:[device]" and "[bus]:[device].[function]" (hex).
CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  return api("cuDeviceGetByPCIBusId", "cuDeviceGetByPCIBusId", kNone, [&](Call& c) {
    c.str("id", pciBusId);
    FC_CHECK(c);
    if (!dev || !pciBusId) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    char tail = 0;
    bool ok = std::sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) == 4 ||
              std::sscanf(pciBusId, "%x:%x:%x%c", &domain, &bus, &device, &tail) == 3 ||
              (domain = 0, std::sscanf(pciBusId, "%x:%x.%x%c", &bus, &device, &function, &tail) == 3);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < device_count(); ++d) {
      if (domain == 0 && device == 0 && function == 0 && bus == static_cast<unsigned>(pci_bus(d))) {
        *dev = d;
        c.sdec("dev", d);
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_DEVICE;
  });
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return api("cuDeviceTotalMem_v2", "cuDeviceTotalMem", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    *bytes = config().total_memory;  // each device has its own
    return CUDA_SUCCESS;
  });
}

// ---- contexts: a primary context per device, and cuCtxCreate's ------------------------------
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return api("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    std::lock_guard lock(stream_mutex());
    ++primary(dev).refcount;
    *pctx = primary_context(dev);
    c.ptr("ctx", *pctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return api("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (CUresult r = check_device(dev)) return r;
    std::lock_guard lock(stream_mutex());
    Context& p = primary(dev);
    if (p.refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--p.refcount == 0) end_primary_context(dev);  // (the last release destroys it)
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return api("cuDevicePrimaryCtxSetFlags", "cuDevicePrimaryCtxSetFlags", kNone,
             [&](Call& c) { return primary_set_flags(c, dev, flags, true); });
}
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return api("cuDevicePrimaryCtxSetFlags_v2", "cuDevicePrimaryCtxSetFlags", kNone,
             [&](Call& c) { return primary_set_flags(c, dev, flags, false); });
}

// Created contexts are destroyed with their streams, events and the allocations made in them;
// a primary context is not cuCtxDestroy's to destroy.
CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  return api("cuCtxDestroy_v2", "cuCtxDestroy", kNone, [&](Call& c) {
    c.ptr("ctx", ctx);
    FC_CHECK(c);
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    return destroy_context(ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  });
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return api("cuCtxCreate_v2", "cuCtxCreate", kNone, [&](Call& c) { return create(c, pctx, flags, dev); });
}
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int count, unsigned int flags,
                                CUdevice dev) {
  return api("cuCtxCreate_v3", "cuCtxCreate", kNone, [&](Call& c) {
    c.sdec("params", count);
    if (count < 0 || (count > 0 && !params)) {
      FC_CHECK(c);
      return CUDA_ERROR_INVALID_VALUE;
    }
    return create(c, pctx, flags, dev);
  });
}
CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  return api("cuCtxCreate_v4", "cuCtxCreate", kNone, [&](Call& c) {
    if (params && (params->numExecAffinityParams < 0 ||
                   (params->numExecAffinityParams > 0 && !params->execAffinityParams))) {
      FC_CHECK(c);
      return CUDA_ERROR_INVALID_VALUE;
    }
    return create(c, pctx, flags, dev);
  });
}

// "Destroy all allocations and reset all state on the primary context" (CUDA Driver API,
// Primary Context Management): its streams, events and allocations go; the fake keeps its
// modules, retains and flags (left out, README).
CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return api("cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (CUresult r = check_device(dev)) return r;
    std::lock_guard lock(stream_mutex());
    end_primary_context(dev);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return api("cuDevicePrimaryCtxGetState", "cuDevicePrimaryCtxGetState", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    std::lock_guard lock(stream_mutex());
    Context& p = primary(dev);
    *flags = p.flags;
    *active = p.refcount > 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  return api("cuCtxGetCurrent", "cuCtxGetCurrent", kNone, [&](Call& c) {
    FC_CHECK(c);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_context();
    c.ptr("ctx", *pctx);
    return CUDA_SUCCESS;
  });
}

// Any context that exists may be made current (a primary one need not be retained).
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return api("cuCtxSetCurrent", "cuCtxSetCurrent", kNone, [&](Call& c) {
    c.ptr("ctx", ctx);
    FC_CHECK(c);
    std::lock_guard lock(stream_mutex());
    if (ctx && !live_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    set_current_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return api("cuCtxPushCurrent_v2", "cuCtxPushCurrent", kNone, [&](Call& c) {
    c.ptr("ctx", ctx);
    FC_CHECK(c);
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    if (!live_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    push_context(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  return api("cuCtxPopCurrent_v2", "cuCtxPopCurrent", kNone, [&](Call& c) {
    FC_CHECK(c);
    CUcontext ctx{};
    if (!pop_context(&ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx) *pctx = ctx;  // NULL pctx is allowed
    c.ptr("ctx", ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  return api("cuCtxGetDevice", "cuCtxGetDevice", kCtx, [&](Call& c) {
    FC_CHECK(c);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    int d = current_device();
    if (d < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *device = d;
    c.sdec("dev", d);
    return CUDA_SUCCESS;
  });
}

// CUDA 13.0: "If the specified context is NULL, the API will return the current context's
// device" (cuCtxGetDevice_v2, CUDA Driver API, Context Management).
CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  return api("cuCtxGetDevice_v2", "cuCtxGetDevice", ctx ? kNone : kCtx, [&](Call& c) {
    c.ptr("ctx", ctx);
    FC_CHECK(c);
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    Context* x = ctx ? live_context(ctx) : current();
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    *device = x->device;
    c.sdec("dev", x->device);
    return CUDA_SUCCESS;
  });
}

// "Blocks until the current context has completed all preceding requested tasks"
// (cuCtxSynchronize): the current context's streams only.
CUresult CUDAAPI cuCtxSynchronize(void) {
  return api("cuCtxSynchronize", "cuCtxSynchronize", kCtx, [&](Call& c) {
    FC_CHECK(c);
    std::lock_guard lock(stream_mutex());
    if (Context* cur = current()) complete_context(cur);
    return CUDA_SUCCESS;
  });
}

// ---- device and managed memory -------------------------------------------------------------
CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return api("cuMemAlloc_v2", "cuMemAlloc", kCtx | kAlloc, [&](Call& c) {
    c.dec("bytesize", bytesize);
    FC_CHECK(c);
    return alloc_call(c, dptr, bytesize, Kind::Device);
  });
}

// v1 ABI (32-bit CUdeviceptr): exported so version lookups can be told apart; host RAM has
// no 32-bit addresses to hand out.
CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  return api("cuMemAlloc", "cuMemAlloc", kCtx | kAlloc, [&](Call& c) {
    c.dec("bytesize", bytesize);
    FC_CHECK(c);
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_NOT_SUPPORTED;
  });
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                    unsigned int element_size) {
  return api("cuMemAllocPitch_v2", "cuMemAllocPitch", kCtx | kAlloc, [&](Call& c) {
    c.dec("width", width).dec("height", height).dec("element_size", element_size);
    FC_CHECK(c);
    if (!dptr || !pitch || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (element_size != 4 && element_size != 8 && element_size != 16) return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX - 511) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) / 512 * 512;
    if (height > SIZE_MAX / p) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = alloc_call(c, dptr, p * height, Kind::Device);
    if (r == CUDA_SUCCESS) {
      *pitch = p;
      c.dec("pitch", p);
    }
    return r;
  });
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  return api("cuMemAllocManaged", "cuMemAllocManaged", kCtx | kAlloc, [&](Call& c) {
    c.dec("bytesize", bytesize).dec("flags", flags);
    FC_CHECK(c);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    return alloc_call(c, dptr, bytesize, Kind::Managed);
  });
}

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return api("cuMemAllocAsync", "cuMemAllocAsync", kCtx | kAlloc,
             [&](Call& c) { return alloc_async(c, dptr, bytesize, nullptr, stream); });
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return api("cuMemAllocAsync_ptsz", "cuMemAllocAsync", kCtx | kAlloc,
             [&](Call& c) { return alloc_async(c, dptr, bytesize, nullptr, stream); });
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
  return api("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", kCtx | kAlloc,
             [&](Call& c) { return alloc_async(c, dptr, bytesize, pool, stream); });
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream stream) {
  return api("cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", kCtx | kAlloc,
             [&](Call& c) { return alloc_async(c, dptr, bytesize, pool, stream); });
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  return api("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    *pool = default_pool(dev);
    c.ptr("pool", *pool);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return api("cuDeviceGetMemPool", "cuDeviceGetMemPool", kNone, [&](Call& c) {
    c.sdec("dev", dev);
    FC_CHECK(c);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_device(dev)) return r;
    *pool = current_pool(dev);
    c.ptr("pool", *pool);
    return CUDA_SUCCESS;
  });
}

// "The memory pool must be local to the specified device" (cuDeviceSetMemPool): a pool of
// another device, or a managed one, is refused.
CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return api("cuDeviceSetMemPool", "cuDeviceSetMemPool", kNone, [&](Call& c) {
    c.sdec("dev", dev).ptr("pool", pool);
    FC_CHECK(c);
    if (CUresult r = check_device(dev)) return r;
    Kind kind;
    int device = 0;
    if (!pool || !pool_kind(pool, &kind, &device) || kind != Kind::Device || device != dev) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(g_current_pool_mutex);
    g_current_pool[dev] = pool == default_pool(dev) ? nullptr : pool;
    return CUDA_SUCCESS;
  });
}

// CU_MEM_ALLOCATION_TYPE_MANAGED pools (CUDA 13) hand out managed memory. A pool's device
// memory is on its location's device (props->location.id for a device location; another
// location gets the current context's device, or 0).
CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return api("cuMemPoolCreate", "cuMemPoolCreate", kNone, [&](Call& c) {
    FC_CHECK(c);
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    c.sdec("alloc_type", props->allocType).sdec("loc_type", props->location.type).sdec("loc_id", props->location.id);
    bool managed = props->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED;
    if (!managed && props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    int device = std::max(current_device(), 0);
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
      if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
      device = props->location.id;
    }
    *pool = static_cast<CUmemoryPool>(new_handle("pool", managed, static_cast<uint64_t>(device)));
    c.ptr("pool", *pool);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  return api("cuMemPoolDestroy", "cuMemPoolDestroy", kNone, [&](Call& c) {
    c.ptr("pool", pool);
    FC_CHECK(c);
    if (!pool || is_default_pool(pool)) return CUDA_ERROR_INVALID_VALUE;
    if (!delete_handle(pool, "pool")) return CUDA_ERROR_INVALID_VALUE;
    forget_current_pool(pool);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return api("cuMemFree_v2", "cuMemFree", kCtx, [&](Call& c) {
    c.hex("dptr", dptr);
    FC_CHECK(c);
    return release(dptr, freeable_kind);
  });
}

CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) {
  return api("cuMemFree", "cuMemFree", kCtx, [&](Call& c) {
    c.hex("dptr", dptr);
    FC_CHECK(c);
    return release(dptr, freeable_kind);
  });
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return api("cuMemFreeAsync", "cuMemFreeAsync", kCtx, [&](Call& c) { return free_async(c, dptr, stream); });
}
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return api("cuMemFreeAsync_ptsz", "cuMemFreeAsync", kCtx, [&](Call& c) { return free_async(c, dptr, stream); });
}

// The current context's device: free = total − its live device bytes (managed memory is
// never counted as resident).
CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  return api("cuMemGetInfo_v2", "cuMemGetInfo", kCtx, [&](Call& c) {
    FC_CHECK(c);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    *total_bytes = config().total_memory;
    *free_bytes = *total_bytes - std::min<uint64_t>(device_bytes_used(current_device()), *total_bytes);
    c.dec("free", *free_bytes).dec("total", *total_bytes);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes) {
  return api("cuMemGetInfo", "cuMemGetInfo", kCtx, [&](Call& c) {
    FC_CHECK(c);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = config().total_memory;
    uint64_t free = total - std::min(device_bytes_used(current_device()), total);
    *total_bytes = static_cast<unsigned>(std::min<uint64_t>(total, UINT_MAX));
    *free_bytes = static_cast<unsigned>(std::min<uint64_t>(free, UINT_MAX));
    c.dec("free", *free_bytes).dec("total", *total_bytes);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return api("cuMemGetAddressRange_v2", "cuMemGetAddressRange", kCtx, [&](Call& c) {
    c.hex("dptr", dptr);
    FC_CHECK(c);
    Alloc a;
    if (!find(dptr, &a)) return CUDA_ERROR_NOT_FOUND;
    if (pbase) *pbase = a.base;  // either output may be NULL
    if (psize) *psize = a.size;
    c.hex("base", a.base).dec("size", a.size);
    return CUDA_SUCCESS;
  });
}

// ---- pinned host memory ----------------------------------------------------------------------
CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  return api("cuMemHostAlloc", "cuMemHostAlloc", kCtx | kAlloc, [&](Call& c) {
    c.dec("bytesize", bytesize).dec("flags", flags);
    FC_CHECK(c);
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    CUresult r = alloc_call(c, &p, bytesize, Kind::Host);
    if (r == CUDA_SUCCESS) *pp = as_ptr(p);
    return r;
  });
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return api("cuMemAllocHost_v2", "cuMemAllocHost", kCtx | kAlloc, [&](Call& c) {
    c.dec("bytesize", bytesize);
    FC_CHECK(c);
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    CUresult r = alloc_call(c, &p, bytesize, Kind::Host);
    if (r == CUDA_SUCCESS) *pp = as_ptr(p);
    return r;
  });
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  return api("cuMemFreeHost", "cuMemFreeHost", kCtx, [&](Call& c) {
    c.ptr("p", p);
    FC_CHECK(c);
    return release(addr(p), host_kind);
  });
}

// ---- pointer attributes -----------------------------------------------------------------------
CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return api("cuPointerGetAttribute", "cuPointerGetAttribute", kNone, [&](Call& c) {
    c.sdec("attribute", attribute).hex("ptr", ptr);
    FC_CHECK(c);
    Alloc a;
    if (!data || !find(ptr, &a)) return CUDA_ERROR_INVALID_VALUE;
    c.str("kind", kind_name(a.kind));
    return pointer_attribute(attribute, &a, ptr, data);
  });
}

// Unknown pointers are not an error here: every attribute gets its default (driver docs).
CUresult CUDAAPI cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                        CUdeviceptr ptr) {
  return api("cuPointerGetAttributes", "cuPointerGetAttributes", kNone, [&](Call& c) {
    c.dec("count", count).hex("ptr", ptr);
    FC_CHECK(c);
    if (!attributes || !data || count == 0) return CUDA_ERROR_INVALID_VALUE;
    Alloc a;
    bool known = find(ptr, &a);
    c.str("kind", known ? kind_name(a.kind) : "none");
    for (unsigned i = 0; i < count; ++i) {
      if (!data[i]) return CUDA_ERROR_INVALID_VALUE;
      // An address no allocation holds, as driver 580.159.04 answers on an H200
      // (docs/gpu-results.md): its host pointer is the address itself, and its range start
      // and size are left unwritten.
      if (!known && attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
        *static_cast<CUdeviceptr*>(data[i]) = ptr;
        continue;
      }
      if (!known && (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE)) continue;
      CUresult r = pointer_attribute(attributes[i], known ? &a : nullptr, ptr, data[i]);
      if (r == CUDA_ERROR_INVALID_VALUE && attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
        *static_cast<void**>(data[i]) = nullptr;  // device memory has no host pointer
      } else if (r != CUDA_SUCCESS) {
        return r;
      }
    }
    return CUDA_SUCCESS;
  });
}

// ---- unified memory hints ----------------------------------------------------------------------
CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                       CUstream stream) {
  return api("cuMemPrefetchAsync_v2", "cuMemPrefetchAsync", kCtx,
             [&](Call& c) { return prefetch(c, p, n, loc, flags, stream); });
}
CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                            CUstream stream) {
  return api("cuMemPrefetchAsync_v2_ptsz", "cuMemPrefetchAsync", kCtx,
             [&](Call& c) { return prefetch(c, p, n, loc, flags, stream); });
}
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dst, CUstream stream) {
  return api("cuMemPrefetchAsync", "cuMemPrefetchAsync", kCtx,
             [&](Call& c) { return prefetch(c, p, n, location_of(dst), 0, stream); });
}
CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dst, CUstream stream) {
  return api("cuMemPrefetchAsync_ptsz", "cuMemPrefetchAsync", kCtx,
             [&](Call& c) { return prefetch(c, p, n, location_of(dst), 0, stream); });
}
CUresult CUDAAPI cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags,
                                        CUstream stream) {
  return api("cuMemDiscardBatchAsync", "cuMemDiscardBatchAsync", kCtx,
             [&](Call& c) { return discard_batch(c, dptrs, sizes, count, flags, stream); });
}
CUresult CUDAAPI cuMemDiscardBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags,
                                             CUstream stream) {
  return api("cuMemDiscardBatchAsync_ptsz", "cuMemDiscardBatchAsync", kCtx,
             [&](Call& c) { return discard_batch(c, dptrs, sizes, count, flags, stream); });
}
CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                         size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream stream) {
  return api("cuMemPrefetchBatchAsync", "cuMemPrefetchBatchAsync", kCtx, [&](Call& c) {
    return prefetch_batch(c, dptrs, sizes, count, locs, loc_idxs, num_locs, flags, stream);
  });
}
CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                              size_t* loc_idxs, size_t num_locs, unsigned long long flags,
                                              CUstream stream) {
  return api("cuMemPrefetchBatchAsync_ptsz", "cuMemPrefetchBatchAsync", kCtx, [&](Call& c) {
    return prefetch_batch(c, dptrs, sizes, count, locs, loc_idxs, num_locs, flags, stream);
  });
}
CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  return api("cuMemAdvise_v2", "cuMemAdvise", kCtx, [&](Call& c) { return advise(c, p, n, advice, loc); });
}
CUresult CUDAAPI cuMemAdvise(CUdeviceptr p, size_t n, CUmem_advise advice, CUdevice dev) {
  return api("cuMemAdvise", "cuMemAdvise", kCtx,
             [&](Call& c) { return advise(c, p, n, advice, location_of(dev)); });
}

// ---- copies and sets -----------------------------------------------------------------------------
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return api("cuMemcpyHtoD_v2", "cuMemcpyHtoD", kCtx,
             [&](Call& c) { return copy(c, as_ptr(dst), src, n, true, false); });
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpyDtoH_v2", "cuMemcpyDtoH", kCtx,
             [&](Call& c) { return copy(c, dst, as_ptr(src), n, false, true); });
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return api("cuMemcpyDtoD_v2", "cuMemcpyDtoD", kCtx,
             [&](Call& c) { return copy(c, as_ptr(dst), as_ptr(src), n, true, true); });
}
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {  // unified addressing
  return api("cuMemcpy", "cuMemcpy", kCtx,
             [&](Call& c) { return copy(c, as_ptr(dst), as_ptr(src), n, false, false); });
}

static CUresult copy_async(Call& c, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  c.stream(stream);
  Stream* s = stream_of(stream);
  if (!s) {
    FC_CHECK(c);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (capturing(s)) {
    c.ptr("dst", as_ptr(dst)).ptr("src", as_ptr(src)).dec("bytes", n);
    FC_CHECK(c);
    return CUDA_SUCCESS;  // captured, not run
  }
  CUresult r = copy(c, as_ptr(dst), as_ptr(src), n, false, false);
  if (r == CUDA_SUCCESS) submit(s);
  return r;
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return api("cuMemcpyAsync", "cuMemcpyAsync", kCtx, [&](Call& c) { return copy_async(c, dst, src, n, stream); });
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return api("cuMemcpyAsync_ptsz", "cuMemcpyAsync", kCtx,
             [&](Call& c) { return copy_async(c, dst, src, n, stream); });
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  return api("cuMemsetD8_v2", "cuMemsetD8", kCtx, [&](Call& c) {
    c.hex("dst", dst).dec("value", value).dec("count", n);
    FC_CHECK(c);
    if (n == 0) return CUDA_SUCCESS;
    if (!covers(dst, n, gpu_visible)) return CUDA_ERROR_INVALID_VALUE;
    std::memset(as_ptr(dst), value, n);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  return api("cuMemsetD32_v2", "cuMemsetD32", kCtx, [&](Call& c) {
    c.hex("dst", dst).dec("value", value).dec("count", n);
    FC_CHECK(c);
    if (n == 0) return CUDA_SUCCESS;
    if (dst % 4 || n > SIZE_MAX / 4 || !covers(dst, n * 4, gpu_visible)) return CUDA_ERROR_INVALID_VALUE;
    fill_words(reinterpret_cast<uint32_t*>(dst), n, value);
    return CUDA_SUCCESS;
  });
}

// ---- streams ------------------------------------------------------------------------------------
CUresult CUDAAPI cuStreamCreate(CUstream* stream, unsigned int flags) {
  return api("cuStreamCreate", "cuStreamCreate", kCtx, [&](Call& c) {
    c.dec("flags", flags);
    FC_CHECK(c);
    if (!stream || flags > CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    Context* cur = current();
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    Stream* s = new_stream(cur);  // of the current context (cuStreamGetCtx)
    s->flags = flags;
    *stream = reinterpret_cast<CUstream>(s);
    c.ptr("stream", *stream);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  return api("cuStreamCreateWithPriority", "cuStreamCreateWithPriority", kCtx, [&](Call& c) {
    c.dec("flags", flags).sdec("priority", priority);
    FC_CHECK(c);
    if (!stream || flags > CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    Context* cur = current();
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    Stream* s = new_stream(cur);
    s->flags = flags;
    s->priority = std::clamp(priority, -5, 0);  // [greatest, least] like an sm_90 device
    *stream = reinterpret_cast<CUstream>(s);
    c.ptr("stream", *stream);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  return api("cuStreamDestroy_v2", "cuStreamDestroy", kCtx, [&](Call& c) {
    c.ptr("stream", stream);
    FC_CHECK(c);
    if (is_default_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard lock(stream_mutex());
    return delete_stream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s) {
  return api("cuStreamSynchronize", "cuStreamSynchronize", kCtx, [&](Call& c) { return stream_sync(c, s); });
}
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) {
  return api("cuStreamSynchronize_ptsz", "cuStreamSynchronize", kCtx, [&](Call& c) { return stream_sync(c, s); });
}
CUresult CUDAAPI cuStreamQuery(CUstream s) {
  return api("cuStreamQuery", "cuStreamQuery", kCtx, [&](Call& c) { return stream_query(c, s); });
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s) {
  return api("cuStreamQuery_ptsz", "cuStreamQuery", kCtx, [&](Call& c) { return stream_query(c, s); });
}
CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  return api("cuStreamWaitEvent", "cuStreamWaitEvent", kCtx,
             [&](Call& c) { return stream_wait_event(c, s, e, flags); });
}
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) {
  return api("cuStreamWaitEvent_ptsz", "cuStreamWaitEvent", kCtx,
             [&](Call& c) { return stream_wait_event(c, s, e, flags); });
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  return api("cuStreamIsCapturing", "cuStreamIsCapturing", kCtx,
             [&](Call& c) { return is_capturing(c, s, status); });
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* status) {
  return api("cuStreamIsCapturing_ptsz", "cuStreamIsCapturing", kCtx,
             [&](Call& c) { return is_capturing(c, s, status); });
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  return api("cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo", kCtx,
             [&](Call& c) { return capture_info(c, s, status, id, graph, deps, edges, ndeps); });
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                CUgraph* graph, const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                                size_t* ndeps) {
  return api("cuStreamGetCaptureInfo_v3_ptsz", "cuStreamGetCaptureInfo", kCtx,
             [&](Call& c) { return capture_info(c, s, status, id, graph, deps, edges, ndeps); });
}
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return api("cuStreamBeginCapture_v2", "cuStreamBeginCapture", kCtx,
             [&](Call& c) { return begin_capture(c, s, mode); });
}
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return api("cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCapture", kCtx,
             [&](Call& c) { return begin_capture(c, s, mode); });
}
// Capture into an existing graph (CUDA 12.3): the fake's graphs are opaque, so it is a
// capture like cuStreamBeginCapture's; the graph handle must not be NULL.
CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                             CUstreamCaptureMode mode) {
  return api("cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph", kCtx,
             [&](Call& c) { return g == nullptr ? CUDA_ERROR_INVALID_VALUE : begin_capture(c, s, mode); });
}
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                                  CUstreamCaptureMode mode) {
  return api("cuStreamBeginCaptureToGraph_ptsz", "cuStreamBeginCaptureToGraph", kCtx,
             [&](Call& c) { return g == nullptr ? CUDA_ERROR_INVALID_VALUE : begin_capture(c, s, mode); });
}
CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* graph) {
  return api("cuStreamEndCapture", "cuStreamEndCapture", kCtx, [&](Call& c) { return end_capture(c, s, graph); });
}
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) {
  return api("cuStreamEndCapture_ptsz", "cuStreamEndCapture", kCtx,
             [&](Call& c) { return end_capture(c, s, graph); });
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return api("cuThreadExchangeStreamCaptureMode", "cuThreadExchangeStreamCaptureMode", kNone, [&](Call& c) {
    FC_CHECK(c);
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
      return CUDA_ERROR_INVALID_VALUE;
    c.sdec("mode", *mode);
    std::swap(*mode, thread_capture_mode());
    c.sdec("previous", *mode);
    return CUDA_SUCCESS;
  });
}

// A special handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) names the current
// context's stream, and with no current context the call fails with
// CUDA_ERROR_INVALID_CONTEXT; a created stream answers the context current at its creation
// (cuStreamGetCtx, CUDA Driver API, Stream Management). No green contexts.
CUresult CUDAAPI cuStreamGetCtx(CUstream s, CUcontext* pctx) {
  return api("cuStreamGetCtx", "cuStreamGetCtx", kNone, [&](Call& c) { return stream_ctx(c, s, pctx, nullptr, false); });
}
CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream s, CUcontext* pctx) {
  return api("cuStreamGetCtx_ptsz", "cuStreamGetCtx", kNone, [&](Call& c) { return stream_ctx(c, s, pctx, nullptr, false); });
}
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream s, CUcontext* pctx, CUgreenCtx* green) {
  return api("cuStreamGetCtx_v2", "cuStreamGetCtx", kNone, [&](Call& c) { return stream_ctx(c, s, pctx, green, true); });
}
CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream s, CUcontext* pctx, CUgreenCtx* green) {
  return api("cuStreamGetCtx_v2_ptsz", "cuStreamGetCtx", kNone, [&](Call& c) { return stream_ctx(c, s, pctx, green, true); });
}
CUresult CUDAAPI cuStreamGetDevice(CUstream s, CUdevice* device) {
  return api("cuStreamGetDevice", "cuStreamGetDevice", kNone, [&](Call& c) { return stream_dev(c, s, device); });
}
CUresult CUDAAPI cuStreamGetDevice_ptsz(CUstream s, CUdevice* device) {
  return api("cuStreamGetDevice_ptsz", "cuStreamGetDevice", kNone, [&](Call& c) { return stream_dev(c, s, device); });
}

// ---- events -------------------------------------------------------------------------------------
CUresult CUDAAPI cuEventCreate(CUevent* event, unsigned int flags) {
  return api("cuEventCreate", "cuEventCreate", kCtx, [&](Call& c) {
    c.dec("flags", flags);
    FC_CHECK(c);
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lock(stream_mutex());
    Context* cur = current();
    if (!cur) return CUDA_ERROR_INVALID_CONTEXT;
    Event* e = new_event(cur);  // of the current context (cuEventRecord checks it)
    e->timing = !(flags & CU_EVENT_DISABLE_TIMING);
    *event = reinterpret_cast<CUevent>(e);
    c.ptr("event", *event);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) {
  return api("cuEventRecord", "cuEventRecord", kCtx, [&](Call& c) { return event_record(c, e, s); });
}
CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s) {
  return api("cuEventRecord_ptsz", "cuEventRecord", kCtx, [&](Call& c) { return event_record(c, e, s); });
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
  return api("cuEventQuery", "cuEventQuery", kCtx, [&](Call& c) {
    c.ptr("event", event);
    FC_CHECK(c);
    std::lock_guard lock(stream_mutex());
    Event* e = lookup_event(event);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    return e->complete ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
  return api("cuEventSynchronize", "cuEventSynchronize", kCtx, [&](Call& c) {
    c.ptr("event", event);
    FC_CHECK(c);
    std::lock_guard lock(stream_mutex());
    Event* e = lookup_event(event);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (!e->complete && e->stream) complete(e->stream, e);
    e->complete = true;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent event) {
  return api("cuEventDestroy_v2", "cuEventDestroy", kCtx, [&](Call& c) {
    c.ptr("event", event);
    FC_CHECK(c);
    std::lock_guard lock(stream_mutex());
    return delete_event(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  return api("cuEventElapsedTime_v2", "cuEventElapsedTime", kCtx, [&](Call& c) { return elapsed(c, ms, start, end); });
}
CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return api("cuEventElapsedTime", "cuEventElapsedTime", kCtx, [&](Call& c) { return elapsed(c, ms, start, end); });
}

// ---- modules and launches -------------------------------------------------------------------------
// Modules and libraries (CUDA 12+) share one implementation: a library is a module under a
// context-independent handle, and a CUkernel is the Function itself, so cuLaunchKernel and
// cuFuncGetParamInfo accept it as a CUfunction.
namespace {
CUresult load_image(Call& c, const void* image, Module** out, const char* key) {
  FC_CHECK(c);
  if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
  auto* m = new Module;
  if (!parse_module(static_cast<const char*>(image), m)) {
    delete m;
    return CUDA_ERROR_INVALID_IMAGE;
  }
  register_module(m);
  *out = m;
  c.ptr(key, m).dec("functions", m->functions.size());
  return CUDA_SUCCESS;
}

CUresult find_kernel(Call& c, void* handle, const char* handle_key, const char* name, void** out, const char* key) {
  c.ptr(handle_key, handle).str("name", name);
  FC_CHECK(c);
  if (!out || !handle || !name) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_module(static_cast<CUmodule>(handle))) return CUDA_ERROR_INVALID_HANDLE;
  for (Function* f : static_cast<Module*>(handle)->handles) {
    if (f->name == name) {
      *out = f;
      c.ptr(key, f);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}

CUresult unload_image(Call& c, void* handle, const char* key) {
  c.ptr(key, handle);
  FC_CHECK(c);
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_module(static_cast<CUmodule>(handle))) return CUDA_ERROR_INVALID_HANDLE;
  auto* m = static_cast<Module*>(handle);
  unregister_module(m);
  delete m;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return api("cuModuleLoadData", "cuModuleLoadData", kCtx,
             [&](Call& c) { return load_image(c, image, reinterpret_cast<Module**>(module), "module"); });
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* func, CUmodule module, const char* name) {
  return api("cuModuleGetFunction", "cuModuleGetFunction", kCtx,
             [&](Call& c) { return find_kernel(c, module, "module", name, reinterpret_cast<void**>(func), "func"); });
}

CUresult CUDAAPI cuModuleUnload(CUmodule module) {
  return api("cuModuleUnload", "cuModuleUnload", kCtx, [&](Call& c) { return unload_image(c, module, "module"); });
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**, unsigned int,
                                   CUlibraryOption*, void**, unsigned int) {
  return api("cuLibraryLoadData", "cuLibraryLoadData", kCtx,
             [&](Call& c) { return load_image(c, code, reinterpret_cast<Module**>(library), "library"); });
}

CUresult CUDAAPI cuLibraryGetKernel(CUkernel* kernel, CUlibrary library, const char* name) {
  return api("cuLibraryGetKernel", "cuLibraryGetKernel", kCtx,
             [&](Call& c) { return find_kernel(c, library, "library", name, reinterpret_cast<void**>(kernel), "kernel"); });
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  return api("cuLibraryUnload", "cuLibraryUnload", kCtx, [&](Call& c) { return unload_image(c, library, "library"); });
}

CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t index, size_t* offset, size_t* size) {
  return api("cuFuncGetParamInfo", "cuFuncGetParamInfo", kNone, [&](Call& c) {
    c.ptr("func", func).dec("index", index);
    FC_CHECK(c);
    if (!func || !offset || !size) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_function(func)) return CUDA_ERROR_INVALID_HANDLE;
    auto* f = reinterpret_cast<const Function*>(func);
    if (index >= f->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
    *offset = f->offsets[index];
    *size = f->sizes[index];
    c.dec("offset", *offset).dec("size", *size);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params,
                                void** extra) {
  return api("cuLaunchKernel", "cuLaunchKernel", kCtx,
             [&](Call& c) { return launch_kernel(c, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra); });
}
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                     unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                     CUstream s, void** params, void** extra) {
  return api("cuLaunchKernel_ptsz", "cuLaunchKernel", kCtx,
             [&](Call& c) { return launch_kernel(c, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra); });
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  return api("cuLaunchKernelEx", "cuLaunchKernelEx", kCtx,
             [&](Call& c) { return launch_ex(c, config, f, params, extra); });
}
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  return api("cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", kCtx,
             [&](Call& c) { return launch_ex(c, config, f, params, extra); });
}
CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                           CUstream s, void** params) {
  return api("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", kCtx,
             [&](Call& c) { return launch_kernel(c, f, gx, gy, gz, bx, by, bz, shmem, s, params, nullptr); });
}
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                unsigned int bx, unsigned int by, unsigned int bz,
                                                unsigned int shmem, CUstream s, void** params) {
  return api("cuLaunchCooperativeKernel_ptsz", "cuLaunchCooperativeKernel", kCtx,
             [&](Call& c) { return launch_kernel(c, f, gx, gy, gz, bx, by, bz, shmem, s, params, nullptr); });
}

// ---- graphs (opaque: a captured graph is not replayed) -------------------------------------------
CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream s) {
  return api("cuGraphLaunch", "cuGraphLaunch", kCtx, [&](Call& c) { return graph_launch(c, exec, s); });
}
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
  return api("cuGraphLaunch_ptsz", "cuGraphLaunch", kCtx, [&](Call& c) { return graph_launch(c, exec, s); });
}

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  return api("cuGraphDestroy", "cuGraphDestroy", kNone, [&](Call& c) {
    c.ptr("graph", graph);
    FC_CHECK(c);
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    return delete_handle(graph, "graph") ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return api("cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", kCtx, [&](Call& c) {
    c.ptr("graph", graph).dec("flags", flags);
    FC_CHECK(c);
    if (!exec || !graph) return CUDA_ERROR_INVALID_VALUE;
    *exec = static_cast<CUgraphExec>(new_handle("graph_exec"));
    c.ptr("exec", *exec);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
  return api("cuGraphExecDestroy", "cuGraphExecDestroy", kNone, [&](Call& c) {
    c.ptr("exec", exec);
    FC_CHECK(c);
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    delete_handle(exec, "graph_exec");  // foreign non-null handles are accepted, as by cuGraphLaunch
    return CUDA_SUCCESS;
  });
}

// ---- IPC: legacy handles exist only for cuMemAlloc'd memory ----------------------------------------
CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  return api("cuIpcGetMemHandle", "cuIpcGetMemHandle", kCtx, [&](Call& c) {
    c.hex("dptr", dptr);
    FC_CHECK(c);
    Alloc a;
    if (!handle || !find(dptr, &a)) return CUDA_ERROR_INVALID_VALUE;
    c.str("kind", kind_name(a.kind));
    if (a.kind != Kind::Device) return CUDA_ERROR_INVALID_VALUE;
    std::memset(handle, 0, sizeof *handle);
    uint64_t words[3] = {0xfa4ecda0ull, a.base, static_cast<uint64_t>(::getpid())};
    std::memcpy(handle->reserved, words, sizeof words);
    return CUDA_SUCCESS;
  });
}

// ---- virtual memory management -------------------------------------------------------------------
// A physical handle counts against its device's FAKECUDA_TOTAL_MEMORY (prop->location.id); a
// reservation is anonymous host memory; cuMemMap registers the range as kind vmm on the
// handle's device (two mappings of one handle do not alias).
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  return api("cuMemCreate", "cuMemCreate", kCtx | kAlloc, [&](Call& c) {
    c.dec("size", size).dec("flags", flags);
    FC_CHECK(c);
    if (!handle || !prop || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    c.sdec("loc_id", prop->location.id);
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(prop->location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    if (!reserve_device_bytes(prop->location.id, size)) return CUDA_ERROR_OUT_OF_MEMORY;
    *handle = reinterpret_cast<uintptr_t>(new_handle("vmm", size, static_cast<uint64_t>(prop->location.id)));
    c.hex("handle", *handle);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return api("cuMemRelease", "cuMemRelease", kCtx, [&](Call& c) {
    c.hex("handle", handle);
    FC_CHECK(c);
    auto* h = reinterpret_cast<void*>(handle);
    uint64_t size = 0, device = 0;
    if (!handle_is(h, "vmm", &size, &device)) return CUDA_ERROR_INVALID_VALUE;
    delete_handle(h, "vmm");
    release_device_bytes(static_cast<int>(device), size);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr hint,
                                     unsigned long long flags) {
  return api("cuMemAddressReserve", "cuMemAddressReserve", kCtx, [&](Call& c) {
    c.dec("size", size).dec("alignment", alignment).hex("addr", hint).dec("flags", flags);
    FC_CHECK(c);
    if (!ptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t align = std::max<size_t>(alignment, 4096);
    if (align & (align - 1) || size > SIZE_MAX - align) return CUDA_ERROR_INVALID_VALUE;
    void* m = ::mmap(nullptr, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = (addr(m) + align - 1) & ~(align - 1);  // trim to the requested alignment
    if (base > addr(m)) ::munmap(m, base - addr(m));
    size_t tail = addr(m) + size + align - (base + size);
    if (tail) ::munmap(as_ptr(base + size), tail);
    {
      std::lock_guard lock(g_vmm_mutex);
      g_reservations[base] = size;
    }
    *ptr = base;
    c.hex("ptr", base);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return api("cuMemAddressFree", "cuMemAddressFree", kCtx, [&](Call& c) {
    c.hex("ptr", ptr).dec("size", size);
    FC_CHECK(c);
    std::lock_guard lock(g_vmm_mutex);
    auto it = g_reservations.find(ptr);
    if (it == g_reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(as_ptr(ptr), size);
    g_reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  return api("cuMemMap", "cuMemMap", kCtx, [&](Call& c) {
    c.hex("ptr", ptr).dec("size", size).dec("offset", offset).hex("handle", handle).dec("flags", flags);
    FC_CHECK(c);
    uint64_t handle_size = 0, device = 0;
    if (size == 0 || flags != 0 || !handle_is(reinterpret_cast<void*>(handle), "vmm", &handle_size, &device))
      return CUDA_ERROR_INVALID_VALUE;
    if (offset > handle_size || size > handle_size - offset || !in_reservation(ptr, size))
      return CUDA_ERROR_INVALID_VALUE;
    if (find(ptr, nullptr) || find(ptr + size - 1, nullptr)) return CUDA_ERROR_INVALID_VALUE;  // already mapped
    add_vmm_mapping(ptr, size, static_cast<int>(device), current_context());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return api("cuMemUnmap", "cuMemUnmap", kCtx, [&](Call& c) {
    c.hex("ptr", ptr).dec("size", size);
    FC_CHECK(c);
    Alloc a;
    if (!find(ptr, &a) || a.kind != Kind::Vmm || a.base != ptr || a.size != size) return CUDA_ERROR_INVALID_VALUE;
    remove_vmm_mapping(ptr);
    ::madvise(as_ptr(ptr), size, MADV_DONTNEED);  // contents are gone, as on a GPU
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return api("cuMemSetAccess", "cuMemSetAccess", kCtx, [&](Call& c) {
    c.hex("ptr", ptr).dec("size", size).dec("count", count);
    FC_CHECK(c);
    if (!desc || count == 0 || !covers(ptr, size, [](Kind k) { return k == Kind::Vmm; }))
      return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i)
      if (!valid_location(desc[i].location)) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
  });
}

// ---- errors, export tables -------------------------------------------------------------------------
CUresult CUDAAPI cuGetErrorString(CUresult error, const char** str) {
  return api("cuGetErrorString", "cuGetErrorString", kNoInit, [&](Call& c) {
    c.sdec("error", error);
    FC_CHECK(c);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText* e = error_text(error);
    *str = e ? e->text : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  return api("cuGetErrorName", "cuGetErrorName", kNoInit, [&](Call& c) {
    c.sdec("error", error);
    FC_CHECK(c);
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText* e = error_text(error);
    *str = e ? e->name : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
  return api("cuGetExportTable", "cuGetExportTable", kNoInit, [&](Call& c) {
    c.ptr("id", id);
    FC_CHECK(c);
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    *table = nullptr;
    return CUDA_ERROR_NOT_SUPPORTED;  // private runtime tables: the reason tests use a fake runtime
  });
}

// ---- test helpers (not CUDA) -----------------------------------------------------------------------
// Re-reads FAKECUDA_* (resets FAKECUDA_FAIL counters, reopens FAKECUDA_LOG).
FAKECUDA_EXPORT void fakecuda_reload_config(void) {
  try {
    reload_config();
  } catch (...) {
  }
}

// The physical ordinal behind visible device `device` (CUDA_VISIBLE_DEVICES), or -1.
FAKECUDA_EXPORT int fakecuda_device_physical(int device) {
  try {
    return physical_ordinal(device);
  } catch (...) {
    return -1;
  }
}

// Most recent launch: copies the kernel name and up to max parameter values (each the
// little-endian value of its first 8 bytes). Returns the parameter count, or -1 if none.
FAKECUDA_EXPORT int fakecuda_last_launch(char* name, size_t name_len, uint64_t* params, size_t max) {
  std::lock_guard lock(g_launch_mutex);
  if (!g_launched) return -1;
  if (name && name_len) std::snprintf(name, name_len, "%s", g_last_name.c_str());
  for (size_t i = 0; params && i < max && i < g_last_params.size(); ++i) params[i] = g_last_params[i];
  return static_cast<int>(g_last_params.size());
}

}  // extern "C"
