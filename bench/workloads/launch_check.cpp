// spillway-launch-check: launch observation on a real GPU (its kernels are PTX for sm_90,
// so it needs a Hopper GPU and the real driver).
//   spillway-launch-check perf|work
//   perf: 10000 live 4 KiB blocks, 20000 empty launches of fill_u32(p, 0, 0) with two managed
//         pointers; prints launch_ns (mean CPU time per cuLaunchKernel call).
//   work: 6 blocks of 1 GiB cycled 3 times (fill_u32 + struct_k with an interior pointer in a
//         by-value struct), a captured graph launched twice; checks the data.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"  // tests/programs: CHECK, init_context
#include "fill_ptx.h"

using spillway::bench::kFillLoop;

const std::string kPtx = spillway::bench::ptx_header("sm_90") + spillway::bench::kFillU32Entry + kFillLoop +
                         R"(.visible .entry struct_k(.param .align 8 .b8 sp0[24])
{
  .reg .pred %p<2>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd2, [sp0];
  ld.param.u64 %rd1, [sp0+8];
  ld.param.u64 %rd8, [sp0+16];
  cvt.u32.u64 %r1, %rd8;
)" + kFillLoop;


CUfunction g_fill, g_struct;

void fill(CUdeviceptr p, unsigned long long n, unsigned v, CUstream s) {
  void* params[] = {&p, &n, &v};
  CHECK(cuLaunchKernel(g_fill, 1024, 1, 1, 256, 1, 1, 0, s, params, nullptr));
}

unsigned word(CUdeviceptr p) {
  unsigned v = 0;
  CHECK(cuMemcpyDtoH(&v, p, 4));
  return v;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "work";
  init_context();
  CUmodule m;
  char log[4096] = {0};
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* vals[] = {log, (void*)(uintptr_t)sizeof log};
  auto load_ex = reinterpret_cast<CUresult (*)(CUmodule*, const void*, unsigned, CUjit_option*, void**)>(
      dlsym(RTLD_DEFAULT, "cuModuleLoadDataEx"));
  if ((load_ex ? load_ex(&m, kPtx.c_str(), 2, opts, vals) : cuModuleLoadData(&m, kPtx.c_str())) != CUDA_SUCCESS) {
    std::fprintf(stderr, "ptx: %s\n", log);
    return 1;
  }
  CHECK(cuModuleGetFunction(&g_fill, m, "fill_u32"));
  CHECK(cuModuleGetFunction(&g_struct, m, "struct_k"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  if (mode == "perf") {
    std::vector<CUdeviceptr> live(10000);
    for (auto& p : live) CHECK(cuMemAlloc(&p, 4096));
    CUdeviceptr a = live[3000], b = live[7000];
    unsigned long long n = 0;
    unsigned v = 0;
    void* params[] = {&a, &n, &v};
    (void)b;
    for (int i = 0; i < 2000; ++i) CHECK(cuLaunchKernel(g_fill, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
    CHECK(cuStreamSynchronize(s));
    std::vector<double> per;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 5000; ++i) CHECK(cuLaunchKernel(g_fill, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr));
      auto t1 = std::chrono::steady_clock::now();
      CHECK(cuStreamSynchronize(s));
      per.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / 5000);
    }
    std::sort(per.begin(), per.end());
    std::printf("launch_ns median=%.0f min=%.0f\n", per[per.size() / 2], per[0]);
    for (auto p : live) CHECK(cuMemFree(p));
    return 0;
  }
  const size_t bytes = 1ull << 30;
  std::vector<CUdeviceptr> blk(6);
  for (auto& p : blk) CHECK(cuMemAlloc(&p, bytes));
  for (size_t i = 0; i < blk.size(); ++i) std::printf("block%zu=%#llx\n", i, (unsigned long long)blk[i]);
  auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < 3; ++it) {
    for (size_t i = 0; i < blk.size(); ++i) {
      fill(blk[i], bytes / 4, it * 10 + i, s);
      struct { unsigned long long n; CUdeviceptr inner; unsigned long long v; } st{(64ull << 20) / 4, blk[i] + (256ull << 20), 7};
      void* sp[] = {&st};
      CHECK(cuLaunchKernel(g_struct, 1024, 1, 1, 256, 1, 1, 0, s, sp, nullptr));
    }
  }
  CHECK(cuStreamSynchronize(s));
  auto t1 = std::chrono::steady_clock::now();
  int bad = 0;
  for (size_t i = 0; i < blk.size(); ++i) {
    if (word(blk[i]) != 20 + i || word(blk[i] + bytes - 4) != 20 + i || word(blk[i] + (256ull << 20)) != 7) ++bad;
  }
  std::printf("cycle_ms=%.1f bad=%d\n", std::chrono::duration<double, std::milli>(t1 - t0).count(), bad);
  // A captured graph.
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fill(blk[0], 1 << 20, 99, s);
  CUgraph g;
  CHECK(cuStreamEndCapture(s, &g));
  CUgraphExec ge;
  CHECK(cuGraphInstantiateWithFlags(&ge, g, 0));
  CHECK(cuGraphLaunch(ge, s));
  CHECK(cuGraphLaunch(ge, s));
  CHECK(cuStreamSynchronize(s));
  if (word(blk[0]) != 99) ++bad;
  std::printf("graph_ok=%d\n", word(blk[0]) == 99);
  CHECK(cuGraphExecDestroy(ge));
  CHECK(cuGraphDestroy(g));
  for (auto p : blk) CHECK(cuMemFree(p));
  std::printf("%s\n", bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
