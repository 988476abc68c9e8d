// outside_memory nccl LIBRARY | vmm: device memory the program holds beside its managed data.
// 8 blocks of 8 MiB are cycled 3 times with fill_u32 on a created stream while 16 MiB of
// other device memory lives — a buffer from the NCCL-like LIBRARY (ncclMemAlloc, dlopened as
// frameworks dlopen NCCL), or VMM physical memory (cuMemCreate, reserved and mapped as
// PyTorch's expandable segments do) — then the other memory is released ("released" on
// stdout, after the stream is synchronized) and the blocks are cycled 3 times more. Checks
// the blocks' data at the end.
#include <dlfcn.h>

#include "common.h"

namespace {

constexpr size_t kBlock = 8 << 20, kOther = 16 << 20;
constexpr int kBlocks = 8, kPasses = 3;

void cycle(CUfunction fill, CUstream s, const std::vector<CUdeviceptr>& blocks, unsigned base) {
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int i = 0; i < kBlocks; ++i) {
      CUdeviceptr p = blocks[i];
      unsigned long long count = kBlock / 4;
      unsigned value = base + static_cast<unsigned>(i);
      void* params[] = {&p, &count, &value};
      CHECK(cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
    }
  }
  CHECK(cuStreamSynchronize(s));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  init_context();
  CUmodule module = nullptr;
  CHECK(cuModuleLoadData(&module, "fill_u32(8,8,4)"));
  CUfunction fill = nullptr;
  CHECK(cuModuleGetFunction(&fill, module, "fill_u32"));
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUdeviceptr> blocks(kBlocks);
  for (CUdeviceptr& b : blocks) CHECK(cuMemAlloc(&b, kBlock));

  void* nccl_buffer = nullptr;
  int (*nccl_free)(void*) = nullptr;
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  if (mode == "nccl" && argc > 2) {
    void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      std::fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    auto nccl_alloc = reinterpret_cast<int (*)(void**, size_t)>(dlsym(h, "ncclMemAlloc"));
    nccl_free = reinterpret_cast<int (*)(void*)>(dlsym(h, "ncclMemFree"));
    if (nccl_alloc == nullptr || nccl_free == nullptr || nccl_alloc(&nccl_buffer, kOther) != 0) return 1;
    std::printf("nccl_buffer=%#llx nccl_managed=%u\n", (unsigned long long)reinterpret_cast<CUdeviceptr>(nccl_buffer),
                is_managed(reinterpret_cast<CUdeviceptr>(nccl_buffer)));
  } else if (mode == "vmm") {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CHECK(cuMemCreate(&handle, kOther, &prop, 0));
    std::printf("nccl_buffer=0\n");
    CHECK(cuMemAddressReserve(&va, kOther, 0, 0, 0));
    CHECK(cuMemMap(va, kOther, 0, handle, 0));
  } else {
    return 2;
  }

  cycle(fill, s, blocks, 100);
  if (nccl_buffer != nullptr) {
    if (nccl_free(nccl_buffer) != 0) return 1;
  } else {
    CHECK(cuMemUnmap(va, kOther));
    CHECK(cuMemRelease(handle));
    CHECK(cuMemAddressFree(va, kOther));
  }
  std::printf("released\n");
  std::fflush(stdout);
  cycle(fill, s, blocks, 200);
  for (int i = 0; i < kBlocks; ++i) {
    unsigned first = 0, last = 0;
    CHECK(cuMemcpyDtoH(&first, blocks[i], 4));
    CHECK(cuMemcpyDtoH(&last, blocks[i] + kBlock - 4, 4));
    if (first != 200u + i || last != 200u + i) {
      std::fprintf(stderr, "block %d holds %u/%u\n", i, first, last);
      return 1;
    }
  }
  for (CUdeviceptr b : blocks) CHECK(cuMemFree(b));
  std::printf("ok\n");
  return 0;
}
