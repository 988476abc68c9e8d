// mem_limits CASE ...:
//   sizes S1 S2 ...   cuMemAlloc each size in turn (48M, 4096, 1G ...), keeping them; prints
//                     "alloc SIZE -> RC" per allocation, frees what it got
//   double_device     allocates twice cuDeviceTotalMem in 8 blocks, writes and reads each;
//                     prints "allocated=BYTES of=TOTAL"; exit 0 only if all succeeded
//   meminfo           cuMemGetInfo with valid and NULL arguments; "free=F total=T" then
//                     "null_both=RC null_free=RC null_total=RC"
#include "common.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string c = argv[1];
  init_context();
  if (c == "sizes") {
    std::vector<CUdeviceptr> got;
    for (int i = 2; i < argc; ++i) {
      size_t n = parse_bytes(argv[i]);
      CUdeviceptr p = 0;
      CUresult r = cuMemAlloc(&p, n);
      std::printf("alloc %s -> %d\n", argv[i], r);
      if (r == CUDA_SUCCESS) {
        touch(p, n < 4096 ? n : 4096);
        got.push_back(p);
      }
    }
    for (CUdeviceptr p : got) CHECK(cuMemFree(p));
    return 0;
  }
  if (c == "double_device") {
    size_t total = 0;
    CHECK(cuDeviceTotalMem(&total, 0));
    const size_t block = total / 4;
    std::vector<CUdeviceptr> got;
    size_t allocated = 0;
    CUresult last = CUDA_SUCCESS;
    for (int i = 0; i < 8; ++i) {
      CUdeviceptr p = 0;
      last = cuMemAlloc(&p, block);
      if (last != CUDA_SUCCESS) break;
      touch(p, block);
      got.push_back(p);
      allocated += block;
    }
    std::printf("allocated=%zu of=%zu last=%d\n", allocated, 2 * total, last);
    for (CUdeviceptr p : got) CHECK(cuMemFree(p));
    return allocated == 8 * block ? 0 : 2;
  }
  if (c == "meminfo") {
    size_t free = 0, total = 0;
    CHECK(cuMemGetInfo(&free, &total));
    std::printf("free=%zu total=%zu\n", free, total);
    CUresult both = cuMemGetInfo(nullptr, nullptr);
    CUresult no_free = cuMemGetInfo(nullptr, &total);
    CUresult no_total = cuMemGetInfo(&free, nullptr);
    std::printf("null_both=%d null_free=%d null_total=%d\n", both, no_free, no_total);
    return 0;
  }
  return 2;
}
