// runtime_paths: a CUDA runtime program built with nvcc's defaults (static libcudart),
// knowing nothing of Spillway. It allocates through every runtime path, launches a kernel
// on each block (directly and from a CUDA graph), checks the results, and reports whether
// each block is managed memory (cudaPointerGetAttributes).
//   runtime_paths --expect managed|device
// exits 0 when every result is right and every cudaMalloc* block is of the expected type.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("FAIL %s: %s\n", #call, cudaGetErrorName(e_));                           \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

__global__ void fill(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v + (unsigned)(i % 7);
}

static bool verify(const unsigned* dev, size_t n, unsigned v) {
  static unsigned host[1 << 16];
  size_t m = n < (1u << 16) ? n : (1u << 16);
  if (cudaMemcpy(host, dev, m * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (size_t i = 0; i < m; ++i)
    if (host[i] != v + (unsigned)(i % 7)) return false;
  return true;
}

static int failures = 0;

static void report(const char* path, const void* p, size_t n, unsigned v, bool expect_managed) {
  cudaPointerAttributes a{};
  bool managed = cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeManaged;
  bool ok = verify(static_cast<const unsigned*>(p), n, v);
  bool pass = ok && managed == expect_managed;
  if (!pass) ++failures;
  std::printf("%s %-28s %s, data %s\n", pass ? "PASS" : "FAIL", path, managed ? "managed" : "device", ok ? "ok" : "WRONG");
}

int main(int argc, char** argv) {
  bool expect_managed = argc == 3 && !std::strcmp(argv[1], "--expect") && !std::strcmp(argv[2], "managed");
  if (!(argc == 3 && !std::strcmp(argv[1], "--expect"))) {
    std::printf("usage: %s --expect managed|device\n", argv[0]);
    return 2;
  }
  const size_t n = 8u << 20;  // 32 MiB of unsigned
  unsigned *a, *b, *c, *m;
  size_t pitch = 0;
  CHECK(cudaMalloc(&a, n * 4));
  fill<<<256, 256>>>(a, n, 1);
  CHECK(cudaDeviceSynchronize());
  report("cudaMalloc", a, n, 1, expect_managed);

  CHECK(cudaMallocPitch(reinterpret_cast<void**>(&b), &pitch, 4096, n * 4 / 4096));
  fill<<<256, 256>>>(b, pitch / 4 * (n * 4 / 4096), 2);
  CHECK(cudaDeviceSynchronize());
  report("cudaMallocPitch", b, n, 2, expect_managed);

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMallocAsync(reinterpret_cast<void**>(&c), n * 4, s));
  fill<<<256, 256, 0, s>>>(c, n, 3);
  CHECK(cudaStreamSynchronize(s));
  report("cudaMallocAsync", c, n, 3, expect_managed);

  CHECK(cudaMallocManaged(&m, n * 4));
  fill<<<256, 256>>>(m, n, 4);
  CHECK(cudaDeviceSynchronize());
  report("cudaMallocManaged (as is)", m, n, 4, true);

  // A CUDA graph: capture a stream-ordered alloc, a kernel and a free, then replay.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  unsigned* g = nullptr;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  fill<<<256, 256, 0, s>>>(a, n, 5);
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaStreamSynchronize(s));
  report("kernel in a CUDA graph", a, n, 5, expect_managed);
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaError_t in_capture = cudaMallocAsync(reinterpret_cast<void**>(&g), n * 4, s);
  if (in_capture == cudaSuccess) {
    fill<<<256, 256, 0, s>>>(g, n, 6);
    in_capture = cudaFreeAsync(g, s);
  }
  cudaGraph_t graph2 = nullptr;
  cudaError_t end = cudaStreamEndCapture(s, &graph2);
  bool capture_ok = in_capture == cudaSuccess && end == cudaSuccess;
  if (capture_ok) {
    cudaGraphExec_t exec2;
    capture_ok = cudaGraphInstantiate(&exec2, graph2, 0) == cudaSuccess && cudaGraphLaunch(exec2, s) == cudaSuccess &&
                 cudaStreamSynchronize(s) == cudaSuccess;
  }
  if (!capture_ok) ++failures;
  std::printf("%s %-28s capture %s, end %s\n", capture_ok ? "PASS" : "FAIL", "alloc+free inside a capture",
              cudaGetErrorName(in_capture), cudaGetErrorName(end));
  cudaGetLastError();

  CHECK(cudaFreeAsync(c, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(m));
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "ALL PASSED", failures);
  return failures ? 1 : 0;
}
