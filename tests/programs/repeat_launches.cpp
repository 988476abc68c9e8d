// repeat_launches: a training-loop-like driver-API program. It allocates B device blocks of
// M MiB with cuMemAlloc and runs K iterations of the same sequence of kernel launches on one
// stream, walking through every block in order each iteration — a cyclic access pattern
// whose data can be made larger than the GPU (or the budget):
//   block 2j:   fill_u32(block[2j], words, k * 1000 + 2j)
//   block 2j+1: add_u32(block[2j+1], block[2j], block[2j], words)   (reads the previous block)
// Each iteration ends with a stream synchronize (as a loop that reads its loss does). At the
// end it checks the first and last word of every block. Kernels come from the fake driver's
// text images. Modes:
//   cycle B K [M]        one thread (M defaults to 8)
//   threads T B K [M]    T threads at once, each with its own stream and B blocks
//   streams S B K [M]    one thread, block pair j launched on stream j % S of S streams
// Prints "blocks=B bytes=<total> iterations=K" then "ok".
#include <cuda.h>

#include <thread>

#include "common.h"

namespace {

const char* kImage = "fill_u32(8,8,4);add_u32(8,8,8,8)";

struct Kernels {
  CUmodule module = nullptr;
  CUfunction fill = nullptr, add = nullptr;
};

Kernels load() {
  Kernels k;
  CHECK(cuModuleLoadData(&k.module, kImage));
  CHECK(cuModuleGetFunction(&k.fill, k.module, "fill_u32"));
  CHECK(cuModuleGetFunction(&k.add, k.module, "add_u32"));
  return k;
}

unsigned value_of(int iteration, int block) {
  return static_cast<unsigned>(iteration * 1000 + (block & ~1));
}

// One loop over `blocks` blocks of `bytes` each on `nstreams` new streams (block pair j on
// stream j % nstreams); returns false on wrong data.
bool loop(const Kernels& k, int blocks, int iterations, size_t bytes, int nstreams = 1) {
  std::vector<CUstream> streams(static_cast<size_t>(nstreams));
  for (auto& x : streams) CHECK(cuStreamCreate(&x, CU_STREAM_NON_BLOCKING));
  std::vector<CUdeviceptr> p(blocks);
  for (auto& x : p) CHECK(cuMemAlloc(&x, bytes));
  unsigned long long words = bytes / 4;
  for (int it = 0; it < iterations; ++it) {
    for (int i = 0; i < blocks; ++i) {
      CUstream s = streams[static_cast<size_t>(i / 2 % nstreams)];
      if (i % 2 == 0) {
        unsigned value = value_of(it, i);
        void* params[] = {&p[i], &words, &value};
        CHECK(cuLaunchKernel(k.fill, 1, 1, 1, 256, 1, 1, 0, s, params, nullptr));
      } else {
        void* params[] = {&p[i], &p[i - 1], &p[i - 1], &words};
        CHECK(cuLaunchKernel(k.add, 1, 1, 1, 256, 1, 1, 0, s, params, nullptr));
      }
    }
    for (CUstream x : streams) CHECK(cuStreamSynchronize(x));
  }
  bool ok = true;
  for (int i = 0; i < blocks; ++i) {
    unsigned want = value_of(iterations - 1, i) * (i % 2 ? 2u : 1u);
    unsigned first = 0, last = 0;
    CHECK(cuMemcpyDtoH(&first, p[i], 4));
    CHECK(cuMemcpyDtoH(&last, p[i] + bytes - 4, 4));
    if (first != want || last != want) {
      std::fprintf(stderr, "block %d: %u, %u; expected %u\n", i, first, last, want);
      ok = false;
    }
  }
  for (auto x : p) CHECK(cuMemFree(x));
  for (CUstream x : streams) CHECK(cuStreamDestroy(x));
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  const bool counted = mode == "threads" || mode == "streams";
  int threads = mode == "threads" && argc >= 5 ? std::atoi(argv[2]) : 1;
  int nstreams = mode == "streams" && argc >= 5 ? std::atoi(argv[2]) : 1;
  int first = counted ? 3 : 2;
  if ((mode != "cycle" && !counted) || argc < first + 2 || threads < 1 || nstreams < 1) {
    std::fprintf(stderr,
                 "usage: repeat_launches cycle BLOCKS ITERATIONS [MiB] | threads T BLOCKS ITERATIONS [MiB] | "
                 "streams S BLOCKS ITERATIONS [MiB]\n");
    return 2;
  }
  int blocks = std::atoi(argv[first]), iterations = std::atoi(argv[first + 1]);
  size_t bytes = (argc > first + 2 ? std::strtoull(argv[first + 2], nullptr, 10) : 8) << 20;
  if (blocks < 1 || iterations < 1 || bytes == 0) return 2;
  CUcontext ctx = init_context();
  Kernels k = load();
  std::printf("blocks=%d bytes=%llu iterations=%d\n", blocks * threads,
              static_cast<unsigned long long>(bytes) * blocks * threads, iterations);
  std::vector<int> ok(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      CHECK(cuCtxSetCurrent(ctx));
      ok[t] = loop(k, blocks, iterations, bytes, nstreams);
    });
  }
  for (auto& th : pool) th.join();
  for (int v : ok)
    if (!v) return 1;
  CHECK(cuModuleUnload(k.module));
  std::printf("ok\n");
  return 0;
}
