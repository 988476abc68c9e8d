// capture MODE: stream-ordered frees and allocations while a stream is being captured into a
// graph, as CUDA-graph users (PyTorch's CUDA graphs, TensorRT) do:
//   A = cuMemAllocAsync(s); sync
//   begin capture(s); cuMemFreeAsync(A, s); B = cuMemAllocAsync(s); cuMemFreeAsync(B, s); end capture
// A is freed by the graph (a free node: A lives until the graph runs); B is the graph's own
// (a memory node: the driver's, for the graph's lifetime). Then, by MODE:
//   (none)         destroy the graph unlaunched, sync(s)
//   destroy_first  destroy the graph unlaunched, destroy s at once
//   launch         instantiate, C = cuMemAlloc (as large as A, while the exec lives), launch
//                  the exec on s, sync(s), D = cuMemAlloc (as large), destroy exec and graph
// and one more cuMemAlloc/cuMemFree. Prints "stream=S A=... B=...", "captured" once the
// capture has ended, and in `launch` mode "C=... D=...". Exit 1 if C is A's address: the
// graph would write into C when it runs.
#include "common.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  init_context();
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0;
  CHECK(cuMemAllocAsync(&a, 1 << 20, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuMemFreeAsync(a, s));
  CHECK(cuMemAllocAsync(&b, 1 << 20, s));
  CHECK(cuMemFreeAsync(b, s));
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph));
  std::printf("stream=%#llx A=%#llx B=%#llx\n", (unsigned long long)(uintptr_t)s, (unsigned long long)a,
              (unsigned long long)b);
  std::printf("captured\n");
  if (mode == "launch") {
    CUgraphExec exec = nullptr;
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CUdeviceptr c = 0, d = 0;
    CHECK(cuMemAlloc(&c, 1 << 20));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemAlloc(&d, 1 << 20));
    std::printf("C=%#llx D=%#llx\n", (unsigned long long)c, (unsigned long long)d);
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuMemFree(c));
    CHECK(cuMemFree(d));
    if (c == a) {
      std::fprintf(stderr, "C got A's address while the graph that frees A had not run\n");
      return 1;
    }
  }
  CHECK(cuGraphDestroy(graph));
  if (mode == "destroy_first") CHECK(cuStreamDestroy(s));
  else CHECK(cuStreamSynchronize(s));
  CUdeviceptr c = 0;
  CHECK(cuMemAlloc(&c, 4096));
  CHECK(cuMemFree(c));
  if (mode != "destroy_first") CHECK(cuStreamDestroy(s));
  return 0;
}
