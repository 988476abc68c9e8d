// threads T N: T threads allocate and free N device blocks in total (each thread keeps up to
// 4 live, sizes 256 B .. 64 KiB), checking every call; every 1024th block is written and
// read back. Prints "allocs=A frees=F failures=X".
#include <atomic>
#include <thread>

#include "common.h"

int main(int argc, char** argv) {
  int nthreads = argc > 1 ? std::atoi(argv[1]) : 16;
  long total = argc > 2 ? std::atol(argv[2]) : 1000000;
  CUcontext ctx = init_context();
  std::atomic<long> allocs{0}, frees{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ++failures;
      long mine = total / nthreads + (t < total % nthreads ? 1 : 0);
      std::vector<CUdeviceptr> live;
      unsigned x = 2654435761u * static_cast<unsigned>(t + 1);
      for (long i = 0; i < mine; ++i) {
        x = x * 1664525u + 1013904223u;
        size_t bytes = 256u << ((x >> 10) % 9);
        CUdeviceptr p = 0;
        if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS || p == 0) {
          ++failures;
          continue;
        }
        ++allocs;
        if (i % 1024 == 0) {
          unsigned v = 0;
          if (cuMemsetD32(p, static_cast<unsigned>(t), bytes / 4) != CUDA_SUCCESS ||
              cuMemcpyDtoH(&v, p + bytes - 4, 4) != CUDA_SUCCESS || v != static_cast<unsigned>(t))
            ++failures;
        }
        live.push_back(p);
        if (live.size() >= 4 || i == mine - 1) {
          for (CUdeviceptr q : live) {
            if (cuMemFree(q) == CUDA_SUCCESS) ++frees;
            else ++failures;
          }
          live.clear();
        }
      }
      for (CUdeviceptr q : live) {
        if (cuMemFree(q) == CUDA_SUCCESS) ++frees;
        else ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  std::printf("allocs=%ld frees=%ld failures=%ld\n", allocs.load(), frees.load(), failures.load());
  return failures == 0 && allocs == total && frees == total ? 0 : 1;
}
