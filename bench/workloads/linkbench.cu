// linkbench: measures the GPU<->host link as managed memory sees it, for the simulator's
// link profile (docs/simulator.md): explicit prefetch bandwidth each way (cuMemPrefetchAsync in
// 2 MiB and 64 KiB pieces), fault-driven migration throughput (a kernel streaming over data
// resident on the host), and the cost of a far fault (one touch per 2 MiB / 64 KiB, so the
// time is dominated by fault handling). Pinned cudaMemcpy is the reference.
//   linkbench [--bytes 4GiB]      (managed memory used: that many bytes, once)
//   linkbench --bytes N --matrix  the call-shape matrix instead, one JSON object: for each
//                 call size from 64 KiB to 512 MiB, each way, the bandwidth and the time per
//                 call of back-to-back cudaMemPrefetchAsync calls over the N GiB; then the same
//                 2 MiB pieces handed over in cudaMemPrefetchBatchAsync calls of 16 and 256
//                 ranges (CUDA 13), contiguous and every other chunk. The simulator's link
//                 model takes its per-call costs from these points (docs/simulator.md).
//   linkbench --bytes N --schedule FILE [--max-gib-moved M]
//                 replays the move calls `spillway replay --calls FILE` wrote (move_schedule.h)
//                 over N GiB of fresh managed memory, back to back on one stream: as the Engine
//                 issued them (a batched prefetch's ranges in one cudaMemPrefetchBatchAsync),
//                 then each as 2 MiB pieces; one JSON object with the time of each
//                 beside what the simulator charged (charged_ns, flat_ns). Calls past N GiB,
//                 and those after M GiB of copied chunks (default 64), are skipped.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "move_schedule.h"

#define CHECK(call)                                                                 \
  do {                                                                              \
    cudaError_t e_ = (call);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "linkbench: %s: %s\n", #call, cudaGetErrorString(e_));   \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

__global__ void touch_stride(const unsigned char* p, size_t bytes, size_t stride, unsigned* sink) {
  unsigned acc = 0;
  for (size_t off = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * stride; off < bytes;
       off += (size_t)gridDim.x * blockDim.x * stride)
    acc += p[off];
  if (acc == 0xdeadbeef) *sink = acc;
}

__global__ void stream_read(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc ^= p[i].x ^ p[i].w;
  if (acc == 0xdeadbeef) *sink = acc;
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

static void to_host(unsigned char* p, size_t bytes) {
  // First-touch on the host and make sure nothing is left on the GPU.
  CHECK(cudaMemPrefetchAsync(p, bytes, cudaMemLocation{cudaMemLocationTypeHost, 0}, 0, 0));
  CHECK(cudaDeviceSynchronize());
  std::memset(p, 1, bytes);
}

// Each way once over `bytes` (host first): back-to-back prefetches of `piece` bytes, or
// batches of `batch` pieces `gap` pieces apart (gap 1: contiguous). Prints the fields
// "<name>_h2d_GBps", "<name>_h2d_us_per_call" and the same for d2h, where a call is one
// driver call (a batch is one call). Only the pieces moved count as bytes.
static void shape(const char* name, unsigned char* p, size_t bytes, size_t piece, size_t batch, size_t gap,
                  cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int dev) {
  const cudaMemLocation where[2] = {{cudaMemLocationTypeDevice, dev}, {cudaMemLocationTypeHost, 0}};
  const char* way[2] = {"h2d", "d2h"};
  to_host(p, bytes);
  for (int w = 0; w < 2; ++w) {
    size_t calls = 0, moved = 0;
    void* ptrs[256];
    size_t sizes[256];
    CHECK(cudaEventRecord(e0, s));
    for (size_t off = 0; off + piece <= bytes;) {
      if (batch == 0) {
        CHECK(cudaMemPrefetchAsync(p + off, piece, where[w], 0, s));
        off += piece;
        moved += piece;
      } else {
        size_t n = 0;
        for (; n < batch && off + piece <= bytes; ++n, off += piece * gap) {
          ptrs[n] = p + off;
          sizes[n] = piece;
        }
        size_t loc_index = 0;
        cudaMemLocation loc = where[w];
        CHECK(cudaMemPrefetchBatchAsync(ptrs, sizes, n, &loc, &loc_index, 1, 0, s));
        moved += n * piece;
      }
      ++calls;
    }
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    const double ms = elapsed_ms(e0, e1);
    std::printf(", \"%s_%s_GBps\": %.2f, \"%s_%s_us_per_call\": %.1f", name, way[w], moved / 1e9 / (ms / 1e3), name,
                way[w], ms * 1e3 / calls);
  }
}

static int matrix(unsigned char* p, size_t bytes, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, int dev) {
  char name[64];
  for (size_t piece : {size_t(64) << 10, size_t(2) << 20, size_t(8) << 20, size_t(32) << 20, size_t(128) << 20,
                       size_t(512) << 20}) {
    std::snprintf(name, sizeof name, "prefetch_%zuKiB", piece >> 10);
    shape(name, p, bytes, piece, 0, 1, s, e0, e1, dev);
  }
  for (size_t batch : {size_t(16), size_t(256)}) {
    for (size_t gap : {size_t(1), size_t(2)}) {
      std::snprintf(name, sizeof name, "batch%zu_2048KiB_%s", batch, gap == 1 ? "contiguous" : "every_other");
      shape(name, p, bytes, size_t(2) << 20, batch, gap, s, e0, e1, dev);
    }
  }
  std::printf("}\n");
  return 0;
}

// One pass of the schedule over fresh managed memory (never touched, as the simulator's chunks
// start; the driver's own evictions and fault migrations are not in the schedule, so what is
// where can still differ): each call whole, or as 2 MiB pieces. Returns the milliseconds.
static double replay_pass(const move_schedule::Schedule& sched, size_t bytes, bool pieces, cudaStream_t s, cudaEvent_t e0,
                          cudaEvent_t e1, int dev) {
  unsigned char* p;
  CHECK(cudaMallocManaged(&p, bytes));
  const cudaMemLocation gpu{cudaMemLocationTypeDevice, dev}, host{cudaMemLocationTypeHost, 0};
  CHECK(cudaEventRecord(e0, s));
  std::vector<void*> ptrs;
  std::vector<size_t> sizes;
  for (size_t i = 0, j = 0; i < sched.calls.size(); i = j) {
    j = move_schedule::batch_end(sched.calls, i);
    const move_schedule::Call& c = sched.calls[i];
    if (pieces) {
      for (auto [off, n] : move_schedule::chunk_pieces(c)) CHECK(cudaMemPrefetchAsync(p + off, n, c.to_gpu ? gpu : host, 0, s));
      j = i + 1;
    } else if (j - i == 1) {
      CHECK(cudaMemPrefetchAsync(p + c.offset, c.bytes, c.to_gpu ? gpu : host, 0, s));
    } else {  // a batched prefetch, as the Engine issued it (toward the GPU only)
      ptrs.clear();
      sizes.clear();
      for (size_t k = i; k < j; ++k) ptrs.push_back(p + sched.calls[k].offset), sizes.push_back(sched.calls[k].bytes);
      size_t loc_index = 0;
      cudaMemLocation loc = gpu;
      CHECK(cudaMemPrefetchBatchAsync(ptrs.data(), sizes.data(), j - i, &loc, &loc_index, 1, 0, s));
    }
  }
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  const double ms = elapsed_ms(e0, e1);
  CHECK(cudaFree(p));
  return ms;
}

static int schedule(const char* path, const char* name, size_t bytes, size_t max_moved, cudaStream_t s, cudaEvent_t e0,
                    cudaEvent_t e1, int dev) {
  const move_schedule::Schedule sched = move_schedule::read(path, bytes, max_moved);
  if (!sched.error.empty() || sched.calls.empty()) {
    std::fprintf(stderr, "linkbench: %s\n", sched.error.empty() ? "no call of the schedule fits --bytes" : sched.error.c_str());
    return 2;
  }
  std::printf("{\"device\": \"%s\", \"bytes\": %zu", name, bytes);
  const double whole = replay_pass(sched, bytes, false, s, e0, e1, dev);
  const double pieces = replay_pass(sched, bytes, true, s, e0, e1, dev);
  std::printf(", \"schedule\": \"%s\", \"calls\": %zu, \"batches\": %llu, \"skipped_calls\": %llu, \"h2d_calls\": %llu, "
              "\"d2h_calls\": %llu, \"copied_GiB\": %.2f, \"as_issued_ms\": %.1f, \"as_issued_charged_ms\": %.1f, "
              "\"as_2MiB_pieces_ms\": %.1f, \"as_2MiB_pieces_charged_ms\": %.1f, \"measured_gain\": %.3f, "
              "\"charged_gain\": %.3f}\n",
              path, sched.calls.size(), (unsigned long long)sched.batches, (unsigned long long)sched.skipped, (unsigned long long)sched.h2d_calls,
              (unsigned long long)sched.d2h_calls, sched.copied_bytes / double(1ull << 30), whole, sched.charged_ns / 1e6,
              pieces, sched.flat_ns / 1e6, whole > 0 ? pieces / whole : 0.0,
              sched.charged_ns ? double(sched.flat_ns) / sched.charged_ns : 0.0);
  return 0;
}

int main(int argc, char** argv) {
  size_t bytes = 4ull << 30, max_moved = 64ull << 30;
  bool call_matrix = false;
  const char* schedule_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 10) << 30;
    } else if (!std::strcmp(argv[i], "--matrix")) {
      call_matrix = true;
    } else if (!std::strcmp(argv[i], "--schedule") && i + 1 < argc) {
      schedule_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--max-gib-moved") && i + 1 < argc) {
      max_moved = std::strtoull(argv[++i], nullptr, 10) << 30;
    } else {
      std::fprintf(stderr, "linkbench: unknown argument '%s' (accepted: --bytes GiB, --matrix, --schedule FILE, "
                   "--max-gib-moved GiB)\n", argv[i]);
      return 2;
    }
  }
  if (bytes == 0 || bytes > (32ull << 30)) {
    std::fprintf(stderr, "linkbench: --bytes takes 1 to 32 (GiB of managed memory)\n");
    return 2;
  }
  int dev = 0;
  CHECK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  if (schedule_path != nullptr) return schedule(schedule_path, prop.name, bytes, max_moved, s, e0, e1, dev);
  std::printf("{\"device\": \"%s\", \"bytes\": %zu", prop.name, bytes);
  unsigned char* p;
  unsigned* sink;
  CHECK(cudaMallocManaged(&p, bytes));
  CHECK(cudaMalloc(&sink, 4));
  const cudaMemLocation gpu{cudaMemLocationTypeDevice, dev}, host{cudaMemLocationTypeHost, 0};
  double gb = bytes / 1e9;
  if (call_matrix) return matrix(p, bytes, s, e0, e1, dev);

  for (size_t piece : {size_t(2) << 20, size_t(64) << 10}) {
    to_host(p, bytes);
    CHECK(cudaEventRecord(e0, s));
    for (size_t off = 0; off < bytes; off += piece) CHECK(cudaMemPrefetchAsync(p + off, piece, gpu, 0, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    double h2d = gb / (elapsed_ms(e0, e1) / 1e3);
    CHECK(cudaEventRecord(e0, s));
    for (size_t off = 0; off < bytes; off += piece) CHECK(cudaMemPrefetchAsync(p + off, piece, host, 0, s));
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    double d2h = gb / (elapsed_ms(e0, e1) / 1e3);
    std::printf(", \"prefetch_%zuKiB_h2d_GBps\": %.2f, \"prefetch_%zuKiB_d2h_GBps\": %.2f", piece >> 10, h2d, piece >> 10, d2h);
  }

  // Fault-driven migration: a kernel streams over data that sits on the host.
  to_host(p, bytes);
  CHECK(cudaEventRecord(e0, s));
  stream_read<<<prop.multiProcessorCount * 4, 512, 0, s>>>(reinterpret_cast<const uint4*>(p), bytes / 16, sink);
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  std::printf(", \"fault_stream_GBps\": %.2f", gb / (elapsed_ms(e0, e1) / 1e3));
  // Same data now resident: the kernel's own speed.
  CHECK(cudaEventRecord(e0, s));
  stream_read<<<prop.multiProcessorCount * 4, 512, 0, s>>>(reinterpret_cast<const uint4*>(p), bytes / 16, sink);
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  std::printf(", \"resident_stream_GBps\": %.2f", gb / (elapsed_ms(e0, e1) / 1e3));

  // Sparse touches: one byte per stride; time per touched stride ~ far-fault cost.
  for (size_t stride : {size_t(2) << 20, size_t(64) << 10}) {
    to_host(p, bytes);
    CHECK(cudaEventRecord(e0, s));
    touch_stride<<<prop.multiProcessorCount, 128, 0, s>>>(p, bytes, stride, sink);
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    double ms = elapsed_ms(e0, e1);
    std::printf(", \"touch_every_%zuKiB_us_per_touch\": %.2f, \"touch_every_%zuKiB_GBps\": %.2f", stride >> 10,
                ms * 1e3 / (bytes / stride), stride >> 10, gb / (ms / 1e3));
  }

  // Reference: pinned host memory, cudaMemcpyAsync, 256 MiB.
  size_t ref = 256u << 20;
  void *h, *d;
  CHECK(cudaMallocHost(&h, ref));
  CHECK(cudaMalloc(&d, ref));
  CHECK(cudaEventRecord(e0, s));
  CHECK(cudaMemcpyAsync(d, h, ref, cudaMemcpyHostToDevice, s));
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  double ph2d = ref / 1e9 / (elapsed_ms(e0, e1) / 1e3);
  CHECK(cudaEventRecord(e0, s));
  CHECK(cudaMemcpyAsync(h, d, ref, cudaMemcpyDeviceToHost, s));
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  double pd2h = ref / 1e9 / (elapsed_ms(e0, e1) / 1e3);
  std::printf(", \"pinned_memcpy_h2d_GBps\": %.2f, \"pinned_memcpy_d2h_GBps\": %.2f}\n", ph2d, pd2h);
  return 0;
}
