// launches: kernel launches of every form, as an ordinary driver-API program makes them
// (kernels from the fake's text images; against a GPU only the modes without data checks
// make sense). Modes:
//   args      three blocks; fill_u32(A,...) with kernelParams; a kernel taking a 24-byte
//             struct by value {count, B + 2 MiB, 7}; add_u32(C, A, A, n) through
//             cuLaunchKernelEx with a CU_LAUNCH_PARAM_BUFFER; a cooperative launch on B.
//             Prints A=, B=, C= (addresses) and checks the data.
//   capture   fill_u32(A) launched on stream s while s is captured; the graph is
//             instantiated and launched twice on s. Prints A=, stream=.
//   cycle N K K blocks of 8 MiB, N iterations launching fill_u32 on each in turn on a created
//             stream; checks the data at the end. Prints stream=.
//   threads T N  T threads, each with its own stream and two 4 MiB blocks, N launches of
//             add/fill each; every thread checks its data.
#include <cuda.h>

#include <thread>

#include "common.h"

namespace {

const char* kImage = "fill_u32(8,8,4);add_u32(8,8,8,8);struct_k(24);coop_k(8,8)";

struct Kernels {
  CUmodule module = nullptr;
  CUfunction fill = nullptr, add = nullptr, by_value = nullptr, coop = nullptr;
};

Kernels load() {
  Kernels k;
  CHECK(cuModuleLoadData(&k.module, kImage));
  CHECK(cuModuleGetFunction(&k.fill, k.module, "fill_u32"));
  CHECK(cuModuleGetFunction(&k.add, k.module, "add_u32"));
  CHECK(cuModuleGetFunction(&k.by_value, k.module, "struct_k"));
  CHECK(cuModuleGetFunction(&k.coop, k.module, "coop_k"));
  return k;
}

void fill(const Kernels& k, CUdeviceptr p, unsigned long long count, unsigned value, CUstream s) {
  void* params[] = {&p, &count, &value};
  CHECK(cuLaunchKernel(k.fill, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
}

int args() {
  Kernels k = load();
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK(cuMemAlloc(&a, 4 << 20));
  CHECK(cuMemAlloc(&b, 6 << 20));
  CHECK(cuMemAlloc(&c, 1 << 20));
  std::printf("A=%#llx B=%#llx C=%#llx\n", (unsigned long long)a, (unsigned long long)b, (unsigned long long)c);
  unsigned long long n = (1 << 20) / 4;
  fill(k, a, n, 5, nullptr);
  struct {
    unsigned long long count;
    CUdeviceptr inner;
    unsigned long long seven;
  } s{n, b + (2 << 20), 7};
  void* sp[] = {&s};
  CHECK(cuLaunchKernel(k.by_value, 1, 1, 1, 32, 1, 1, 0, nullptr, sp, nullptr));
  struct {
    CUdeviceptr dst, x, y;
    unsigned long long count;
  } buf{c, a, a, n};
  size_t size = sizeof buf;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 32;
  cfg.blockDimY = cfg.blockDimZ = 1;
  CHECK(cuLaunchKernelEx(&cfg, k.add, nullptr, extra));
  CUdeviceptr bb = b;
  unsigned long long zero = 0;
  void* cp[] = {&bb, &zero};
  CHECK(cuLaunchCooperativeKernel(k.coop, 1, 1, 1, 32, 1, 1, 0, nullptr, cp));
  CHECK(cuCtxSynchronize());
  expect_word(c, 10);
  expect_word(c + (n - 1) * 4, 10);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  CHECK(cuMemFree(c));
  std::printf("ok\n");
  return 0;
}

int capture() {
  Kernels k = load();
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0;
  CHECK(cuMemAlloc(&a, 4 << 20));
  std::printf("A=%#llx stream=%#llx\n", (unsigned long long)a, (unsigned long long)(uintptr_t)s);
  fill(k, a, 1024, 1, s);  // before the capture: observed normally
  CHECK(cuStreamSynchronize(s));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fill(k, a, 1024, 2, s);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph));
  std::printf("captured\n");
  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK(cuGraphLaunch(exec, s));
  CHECK(cuGraphLaunch(exec, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  expect_word(a, 1);  // the fake does not replay graphs
  CHECK(cuMemFree(a));
  CHECK(cuStreamDestroy(s));
  std::printf("ok\n");
  return 0;
}

int cycle(int iterations, int blocks) {
  Kernels k = load();
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::printf("stream=%#llx\n", (unsigned long long)(uintptr_t)s);
  std::vector<CUdeviceptr> p(blocks);
  for (auto& x : p) CHECK(cuMemAlloc(&x, 8 << 20));
  for (int it = 0; it < iterations; ++it) {
    for (int i = 0; i < blocks; ++i) fill(k, p[i], (8 << 20) / 4, it * 100 + i, s);
  }
  CHECK(cuStreamSynchronize(s));
  for (int i = 0; i < blocks; ++i) expect_word(p[i] + (8 << 20) - 4, (iterations - 1) * 100 + i);
  for (auto x : p) CHECK(cuMemFree(x));
  CHECK(cuStreamDestroy(s));
  std::printf("ok\n");
  return 0;
}

int threads(int count, int launches) {
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  Kernels k = load();
  std::vector<std::thread> pool;
  std::vector<int> failed(count, 0);
  for (int t = 0; t < count; ++t) {
    pool.emplace_back([&, t] {
      CHECK(cuCtxSetCurrent(ctx));
      CUstream s = nullptr;
      CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      CUdeviceptr x = 0, y = 0;
      CHECK(cuMemAlloc(&x, 4 << 20));
      CHECK(cuMemAlloc(&y, 4 << 20));
      unsigned long long n = (4 << 20) / 4;
      for (int i = 0; i < launches; ++i) {
        fill(k, x, n, t * 1000 + i, s);
        void* params[] = {&y, &x, &x, &n};
        CHECK(cuLaunchKernel(k.add, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
      }
      CHECK(cuStreamSynchronize(s));
      unsigned got = 0;
      CHECK(cuMemcpyDtoH(&got, y + (n - 1) * 4, 4));
      if (got != 2u * (t * 1000 + launches - 1)) failed[t] = 1;
      CHECK(cuMemFree(x));
      CHECK(cuMemFree(y));
      CHECK(cuStreamDestroy(s));
    });
  }
  for (auto& th : pool) th.join();
  for (int f : failed)
    if (f) {
      std::fprintf(stderr, "a thread read back wrong data\n");
      return 1;
    }
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: launches args|capture|cycle N K|threads T N\n");
    return 2;
  }
  init_context();
  std::string mode = argv[1];
  if (mode == "args") return args();
  if (mode == "capture") return capture();
  if (mode == "cycle" && argc >= 4) return cycle(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "threads" && argc >= 4) return threads(std::atoi(argv[2]), std::atoi(argv[3]));
  std::fprintf(stderr, "unknown mode\n");
  return 2;
}
