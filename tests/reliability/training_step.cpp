// A program shaped like one step of a training job, written with no knowledge of Spillway:
// allocations of every driver family (cuMemAlloc, cuMemAllocPitch, cuMemAllocAsync,
// cuMemAllocFromPoolAsync on the default pool), pointer queries, memcpy writes, a kernel
// launch, checksums, async and plain frees, cuMemGetInfo. Used by the fault-injection matrix
// (fault_matrix_test): any driver call may fail (FAKECUDA_FAIL), and the program must then
// see a CUDA error code, handle it like a careful program, and never lose data.
//
// Output on stdout, one line per API call that failed: "fail <step> <code>", then
// "done blocks=<n> verified=<n>". Exit status: 0 when every failure was reported as a CUDA
// error and every block still held its bytes; 3 when a block lost its data; 4 when a call
// returned an invalid value (e.g. success with a null pointer); crashes show as signals.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

int g_status = 0;

bool ok(CUresult r, const char* step) {
  if (r == CUDA_SUCCESS) return true;
  std::printf("fail %s %d\n", step, static_cast<int>(r));
  return false;
}

struct Block {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;  // bytes written and checked
  bool async = false;
  unsigned seed = 0;
};

std::vector<unsigned> pattern(size_t bytes, unsigned seed) {
  std::vector<unsigned> v(bytes / 4);
  unsigned x = seed * 2654435761u + 1;
  for (auto& w : v) w = (x = x * 1664525u + 1013904223u);
  return v;
}

// Writes the block's pattern; false (after reporting) if the copy failed.
bool write(const Block& b) {
  std::vector<unsigned> p = pattern(b.bytes, b.seed);
  return ok(cuMemcpyHtoD(b.ptr, p.data(), b.bytes), "memcpy_htod");
}

// Reads the block back and compares. A failed read is an error reported, not lost data.
bool verify(const Block& b, int* verified) {
  std::vector<unsigned> back(b.bytes / 4, 0);
  if (!ok(cuMemcpyDtoH(back.data(), b.ptr, b.bytes), "memcpy_dtoh")) return false;
  if (back != pattern(b.bytes, b.seed)) {
    std::printf("corrupt block %#llx (%zu bytes)\n", static_cast<unsigned long long>(b.ptr), b.bytes);
    g_status = 3;
    return false;
  }
  ++*verified;
  return true;
}

}  // namespace

int main() {
  // Without a context there is nothing to do: a careful program stops here, cleanly.
  auto give_up = [] {
    std::printf("done blocks=0 verified=0\n");
    return 0;
  };
  if (!ok(cuInit(0), "init")) return give_up();
  CUdevice dev = 0;
  if (!ok(cuDeviceGet(&dev, 0), "device_get")) return give_up();
  CUcontext ctx = nullptr;
  if (!ok(cuDevicePrimaryCtxRetain(&ctx, dev), "ctx_retain")) return give_up();
  if (!ok(cuCtxSetCurrent(ctx), "ctx_set")) return give_up();
  CUstream stream = nullptr;
  if (!ok(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream_create")) stream = nullptr;

  std::vector<Block> blocks;
  unsigned seed = 1;
  auto add = [&](CUresult r, const char* step, CUdeviceptr p, size_t bytes, bool async) {
    if (!ok(r, step)) return;
    if (p == 0) {
      std::printf("invalid %s: success with a null pointer\n", step);
      g_status = 4;
      return;
    }
    Block b{p, bytes, async, seed++};
    if (write(b)) blocks.push_back(b);
    else if (async) cuMemFreeAsync(p, stream);
    else cuMemFree(p);
  };

  for (size_t bytes : {size_t{1} << 20, size_t{3} << 20, size_t{4096}}) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, bytes);
    add(r, "alloc", p, bytes, false);
  }
  {
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CUresult r = cuMemAllocPitch(&p, &pitch, 1000, 64, 4);
    if (r == CUDA_SUCCESS && pitch < 1000) {
      std::printf("invalid alloc_pitch: pitch %zu < width\n", pitch);
      g_status = 4;
    }
    add(r, "alloc_pitch", p, r == CUDA_SUCCESS ? pitch * 64 : 0, false);
  }
  if (stream != nullptr) {
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocAsync(&p, 2 << 20, stream);
    add(r, "alloc_async", p, 2 << 20, true);
    CUmemoryPool pool = nullptr;
    if (ok(cuDeviceGetDefaultMemPool(&pool, dev), "default_pool")) {
      CUdeviceptr q = 0;
      r = cuMemAllocFromPoolAsync(&q, 1 << 20, pool, stream);
      add(r, "alloc_pool", q, 1 << 20, true);
    }
    if (!ok(cuStreamSynchronize(stream), "stream_sync_1")) {
    }
  }

  // Pointer queries, as frameworks do to classify tensors.
  for (const Block& b : blocks) {
    unsigned long long managed = 7;
    if (ok(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, b.ptr), "pointer_attr") && managed > 1) {
      std::printf("invalid pointer_attr: IS_MANAGED=%llu\n", managed);
      g_status = 4;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    if (ok(cuMemGetAddressRange(&base, &size, b.ptr + 8), "address_range") && (base != b.ptr || size < b.bytes)) {
      std::printf("invalid address_range for %#llx\n", static_cast<unsigned long long>(b.ptr));
      g_status = 4;
    }
  }
  {
    CUpointer_attribute attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned type = 0, managed = 0;
    void* data[2] = {&type, &managed};
    if (!blocks.empty()) ok(cuPointerGetAttributes(2, attrs, data, blocks[0].ptr), "pointer_attrs");
  }

  // A "kernel": fill part of a scratch block, then check the other blocks were not touched.
  CUmodule module = nullptr;
  CUfunction fill = nullptr;
  CUdeviceptr scratch = 0;
  if (ok(cuModuleLoadData(&module, "fill_u32(8,4,4)"), "module_load") &&
      ok(cuModuleGetFunction(&fill, module, "fill_u32"), "get_function") && ok(cuMemAlloc(&scratch, 1 << 16), "alloc_scratch")) {
    unsigned count = (1 << 16) / 4, value = 0xfeedu;
    void* params[] = {&scratch, &count, &value};
    if (ok(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), "launch") &&
        (stream == nullptr || ok(cuStreamSynchronize(stream), "stream_sync_2"))) {
      unsigned last = 0;
      if (ok(cuMemcpyDtoH(&last, scratch + (1 << 16) - 4, 4), "memcpy_dtoh") && last != value) {
        std::printf("corrupt scratch: kernel result lost\n");
        g_status = 3;
      }
    }
  }
  if (scratch != 0 && !ok(cuMemFree(scratch), "free_scratch")) ok(cuMemFree(scratch), "free_scratch_retry");
  if (module != nullptr) ok(cuModuleUnload(module), "module_unload");

  size_t free_b = 0, total_b = 0;
  if (ok(cuMemGetInfo(&free_b, &total_b), "mem_get_info") && (total_b == 0 || free_b > total_b)) {
    std::printf("invalid mem_get_info: free %zu total %zu\n", free_b, total_b);
    g_status = 4;
  }

  int verified = 0;
  for (const Block& b : blocks) verify(b, &verified);

  // Frees: async ones on the stream, the rest plainly. A failed free is retried once, as
  // a careful program (or a caching allocator's emptyCache) would; the block must still be
  // intact between the two attempts.
  for (const Block& b : blocks) {
    CUresult r = b.async && stream != nullptr ? cuMemFreeAsync(b.ptr, stream) : cuMemFree(b.ptr);
    if (!ok(r, b.async ? "free_async" : "free")) {
      int dummy = 0;
      verify(b, &dummy);
      r = b.async && stream != nullptr ? cuMemFreeAsync(b.ptr, stream) : cuMemFree(b.ptr);
      ok(r, b.async ? "free_async_retry" : "free_retry");
    }
  }
  if (stream != nullptr) {
    ok(cuStreamSynchronize(stream), "stream_sync_3");
    ok(cuStreamDestroy(stream), "stream_destroy");
  }
  std::printf("done blocks=%zu verified=%d\n", blocks.size(), verified);
  return g_status;
}
