// hostile_contexts MODE [ARGS]: correct driver-API programs that end contexts, use several
// devices and ask the driver about their memory (the context and pointer kinds of docs/reliability.md).
// Written with no knowledge of Spillway; each prints what it saw ("name=value" fields) and
// exits 0 unless a call it cannot go on without failed.
//   created N       a created context allocates 1 MiB first; then the primary context
//                   allocates four 4 MiB blocks and fills them; the created context is
//                   destroyed; N-1 more contexts are created, allocate 1 MiB each (never
//                   freed) and are destroyed. Prints "primary_ok=0|1" (the four blocks still
//                   hold their data), "later_ok=0|1" (a block allocated afterwards holds
//                   data) and "held=BYTES" (what the program holds at the end).
//   reset|release   the primary context allocates 4 MiB; a created context allocates 4 MiB
//                   and fills it; the primary context is reset (cuDevicePrimaryCtxReset) or
//                   released for the last time; then retained again, allocates and fills
//                   4 MiB. Prints "other_ok=0|1" (the created context's block still holds
//                   its data), "after_ok=0|1" and "held=BYTES".
//   devices         with two devices: each device's primary context allocates 4 MiB; the
//                   second block's device and context as cuPointerGetAttribute,
//                   cuPointerGetAttributes and the runtime's cudaPointerGetAttributes say:
//                   "ordinal=D ordinals=D runtime_device=D context_ok=0|1".
//   freed           two 4 MiB blocks are allocated and the first freed; every pointer
//                   attribute of the freed address, one by one and all at once, and its
//                   address range: "attr_K=RESULT[:VALUE]" fields, "all=RESULT:..." and
//                   "range=RESULT" (a value that is the freed address itself prints as "A").
//   meminfo         cuMemGetInfo's free figure before anything is allocated, with 256 MiB
//                   allocated in 32 MiB blocks, after they are all freed, and with 256 MiB
//                   allocated again: "free0=MiB free1=MiB free2=MiB free3=MiB".
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../programs/common.h"

namespace {

constexpr size_t kMiB = 1 << 20;

CUcontext primary(int ordinal) {
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

CUdeviceptr alloc_filled(size_t bytes, unsigned pattern) {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, bytes));
  CHECK(cuMemsetD32(p, pattern, bytes / 4));
  return p;
}

// Whether [p, p + bytes) still holds `pattern` at its first and last word (a failed read: no).
bool holds(CUdeviceptr p, size_t bytes, unsigned pattern) {
  unsigned first = 0, last = 0;
  if (cuMemcpyDtoH(&first, p, 4) != CUDA_SUCCESS || cuMemcpyDtoH(&last, p + bytes - 4, 4) != CUDA_SUCCESS) return false;
  return first == pattern && last == pattern;
}

// A created context that allocates `bytes` (never freed) and is destroyed; the context
// current before it is current again.
void short_lived_context(size_t bytes) {
  CUcontext c = nullptr;
  CHECK(cuCtxCreate(&c, nullptr, 0, 0));  // (made current)
  alloc_filled(bytes, 0x11111111u);
  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxDestroy(c));
}

int created(int n) {
  CHECK(cuInit(0));
  primary(0);
  CUcontext c = nullptr;
  CHECK(cuCtxCreate(&c, nullptr, 0, 0));
  alloc_filled(kMiB, 0x22222222u);  // (the created context allocates first)
  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped));
  std::vector<CUdeviceptr> blocks;
  for (unsigned i = 0; i < 4; ++i) blocks.push_back(alloc_filled(4 * kMiB, 0xa0000000u + i));
  CHECK(cuCtxDestroy(c));
  for (int i = 1; i < n; ++i) short_lived_context(kMiB);
  bool primary_ok = true;
  for (unsigned i = 0; i < 4; ++i) primary_ok = primary_ok && holds(blocks[i], 4 * kMiB, 0xa0000000u + i);
  CUdeviceptr later = 0;
  bool later_ok = cuMemAlloc(&later, 4 * kMiB) == CUDA_SUCCESS && cuMemsetD32(later, 7u, kMiB) == CUDA_SUCCESS &&
                  holds(later, 4 * kMiB, 7u);
  std::printf("primary_ok=%d later_ok=%d held=%zu\n", primary_ok, later_ok, (later_ok ? 5 : 4) * 4 * kMiB);
  return 0;
}

int end_primary(bool reset) {
  CHECK(cuInit(0));
  primary(0);
  alloc_filled(4 * kMiB, 0x33333333u);  // (the primary context allocates first)
  CUcontext c = nullptr;
  CHECK(cuCtxCreate(&c, nullptr, 0, 0));
  CUdeviceptr other = alloc_filled(4 * kMiB, 0x44444444u);
  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(reset ? cuDevicePrimaryCtxReset(0) : cuDevicePrimaryCtxRelease(0));
  CHECK(cuCtxPushCurrent(c));
  const bool other_ok = holds(other, 4 * kMiB, 0x44444444u);
  CHECK(cuCtxPopCurrent(&popped));
  if (reset) CHECK(cuDevicePrimaryCtxRelease(0));  // (the retain of primary(0))
  primary(0);
  CUdeviceptr after = 0;
  const bool after_ok = cuMemAlloc(&after, 4 * kMiB) == CUDA_SUCCESS &&
                        cuMemsetD32(after, 9u, kMiB) == CUDA_SUCCESS && holds(after, 4 * kMiB, 9u);
  std::printf("other_ok=%d after_ok=%d held=%zu\n", other_ok, after_ok, (after_ok ? 2 : 1) * 4 * kMiB);
  return 0;
}

int devices() {
  CHECK(cuInit(0));
  primary(0);
  alloc_filled(4 * kMiB, 1u);
  CUcontext second = primary(1);
  CUdeviceptr p = alloc_filled(4 * kMiB, 2u);
  int ordinal = -1, ordinals = -1;
  CUcontext ctx = nullptr, ctxs = nullptr;
  CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
  CHECK(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p));
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT};
  void* data[] = {&ordinals, &ctxs};
  CHECK(cuPointerGetAttributes(2, attrs, data, p));
  // The runtime's view (cudaPointerAttributes begins: type, device, devicePointer, hostPointer).
  struct {
    int type;
    int device;
    void* device_pointer;
    void* host_pointer;
  } rt{0, -1, nullptr, nullptr};
  void* lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  auto get = lib ? reinterpret_cast<int (*)(void*, const void*)>(dlsym(lib, "cudaPointerGetAttributes")) : nullptr;
  if (get == nullptr || get(&rt, reinterpret_cast<const void*>(p)) != 0) rt.device = -99;
  std::printf("ordinal=%d ordinals=%d runtime_device=%d context_ok=%d\n", ordinal, ordinals, rt.device,
              ctx == second && ctxs == second);
  return 0;
}

constexpr CUpointer_attribute kAttributes[] = {
    CU_POINTER_ATTRIBUTE_CONTEXT,          CU_POINTER_ATTRIBUTE_MEMORY_TYPE,   CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
    CU_POINTER_ATTRIBUTE_HOST_POINTER,     CU_POINTER_ATTRIBUTE_BUFFER_ID,     CU_POINTER_ATTRIBUTE_IS_MANAGED,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_MAPPED,           CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
};
constexpr unsigned kAttributeCount = sizeof kAttributes / sizeof kAttributes[0];

int freed() {
  init_context();
  CUdeviceptr a = alloc_filled(4 * kMiB, 5u), b = alloc_filled(4 * kMiB, 6u);
  CHECK(cuMemFree(a));
  std::string out;
  unsigned long long values[kAttributeCount] = {};
  void* data[kAttributeCount];
  for (unsigned i = 0; i < kAttributeCount; ++i) {
    unsigned long long v = 0;
    const CUresult r = cuPointerGetAttribute(&v, kAttributes[i], a);
    out += "attr_" + std::to_string(kAttributes[i]) + "=" + std::to_string(r) + (r == CUDA_SUCCESS ? ":" + (v == a ? std::string("A") : std::to_string(v)) : "") + " ";
    values[i] = 0x5555;  // (what "all" leaves unwritten shows)
    data[i] = &values[i];
  }
  const CUresult all = cuPointerGetAttributes(kAttributeCount, const_cast<CUpointer_attribute*>(kAttributes), data, a);
  out += "all=" + std::to_string(all);
  for (unsigned long long v : values) out += ":" + (v == a ? std::string("A") : std::to_string(v));
  CUdeviceptr base = 0;
  size_t size = 0;
  out += " range=" + std::to_string(cuMemGetAddressRange(&base, &size, a + 4096));
  std::printf("%s\n", out.c_str());
  CHECK(cuMemFree(b));
  return 0;
}

size_t free_mib() {
  size_t free = 0, total = 0;
  CHECK(cuMemGetInfo(&free, &total));
  return free / kMiB;
}

int meminfo() {
  init_context();
  const size_t free0 = free_mib();
  std::vector<CUdeviceptr> blocks(8);
  for (CUdeviceptr& p : blocks) CHECK(cuMemAlloc(&p, 32 * kMiB));
  const size_t free1 = free_mib();
  for (CUdeviceptr p : blocks) CHECK(cuMemFree(p));
  const size_t free2 = free_mib();
  for (CUdeviceptr& p : blocks) CHECK(cuMemAlloc(&p, 32 * kMiB));
  const size_t free3 = free_mib();
  std::printf("free0=%zu free1=%zu free2=%zu free3=%zu\n", free0, free1, free2, free3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "created") return created(argc > 2 ? std::atoi(argv[2]) : 40);
  if (mode == "reset" || mode == "release") return end_primary(mode == "reset");
  if (mode == "devices") return devices();
  if (mode == "freed") return freed();
  if (mode == "meminfo") return meminfo();
  std::fprintf(stderr, "usage: hostile_contexts created [N] | reset | release | devices | freed | meminfo\n");
  return 2;
}
