// capture: stream-ordered frees and allocations while a stream is being captured into a
// graph, as CUDA-graph users (PyTorch's CUDA graphs, TensorRT) do:
//   A = cuMemAllocAsync(s); sync
//   begin capture(s); cuMemFreeAsync(A, s); B = cuMemAllocAsync(s); cuMemFreeAsync(B, s); end capture
//   sync(s) (or, with "destroy_first", destroy s); one more cuMemAlloc/cuMemFree
// Prints "stream=S A=... B=..." and "captured" once the capture has ended.
#include "common.h"

int main(int argc, char** argv) {
  // "destroy_first": destroy the stream right after the capture, before any other call.
  bool destroy_first = argc > 1 && std::string(argv[1]) == "destroy_first";
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
  CHECK(cuGraphDestroy(graph));
  if (destroy_first) CHECK(cuStreamDestroy(s));
  else CHECK(cuStreamSynchronize(s));
  CUdeviceptr c = 0;
  CHECK(cuMemAlloc(&c, 4096));
  CHECK(cuMemFree(c));
  if (!destroy_first) CHECK(cuStreamDestroy(s));
  return 0;
}
