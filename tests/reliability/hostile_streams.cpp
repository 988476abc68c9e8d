// hostile_streams MODE [ARGS]: correct driver-API programs that free memory while streams,
// contexts and captures still hold work on it (the stream kinds of docs/reliability.md). Written with no
// knowledge of Spillway; each prints what it saw and exits 0 unless a call failed.
// "pending" below: the work issued before the free had not completed when the next
// allocation returned (run with FAKECUDA_ASYNC=1, where work completes only when something
// synchronises with it).
//   destroyed_stream [driver|runtime]  a 48 MiB block is filled by a kernel on a stream
//                     (non-blocking; the runtime's cudaStreamCreate: blocking), freed on it
//                     (cuMemFreeAsync / cudaFreeAsync) and the stream destroyed; in a second
//                     context 48 MiB are allocated and the context synchronised; the first
//                     context allocates 48 MiB; all is synchronised, and the first context
//                     allocates 48 MiB again. Prints "reused=0|1 pending=0|1 reused_later=0|1"
//                     ("reused": the first of those got the freed block; "pending": the
//                     kernel had not completed by then; "reused_later": the last got it).
//   other_context copy|carve  a second context on the device, with no launch of its own,
//                     either copies into a 48 MiB block of the first (cuMemcpyAsync on its
//                     legacy stream), or allocates a 48 MiB block itself and prefetches it
//                     there; the block is freed; the first context allocates 48 MiB until
//                     its range is full, and synchronises; the block's own context
//                     allocates 48 MiB; all is synchronised, and it allocates 48 MiB again.
//                     Prints "reused=0|1 pending=0|1 reused_later=0|1".
// (Each block is reused only by its own context, whose ranges it came from: the fence is
// recorded while another context is current, and that one synchronised, so that a fence that
// misses the pending work completes.)
//   open_capture nonblocking|blocking  a capture is begun on a stream of that kind, a
//                     kernel on a 4 MiB block X captured, and the capture left open; 40
//                     rounds of allocate 48 MiB + free run meanwhile (prints "rounds=N"); X
//                     is freed and 20 blocks of 4 MiB allocated (prints "x_reused=0|1"); the
//                     capture is ended. Run with a cap (SPILLWAY_MAX_MANAGED) of a few ranges.
//   idle_streams N    N non-blocking streams are created and left idle; a kernel runs on one
//                     more; between two cuDriverGetVersion calls (markers for the driver's
//                     log) an 8 MiB block the kernel used is freed and 8 MiB allocated.
//                     Prints "reused=0|1".
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "../programs/common.h"

namespace {

constexpr size_t kBig = 48 << 20;

CUcontext primary0() {
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

// The shared runtime's few calls this program makes (dlopen'ed: the program links only the driver).
struct Runtime {
  int (*stream_create)(CUstream*) = nullptr;
  int (*stream_destroy)(CUstream) = nullptr;
  int (*malloc_)(void**, size_t) = nullptr;
  int (*free_async)(void*, CUstream) = nullptr;
};

Runtime load_runtime() {
  void* rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (rt == nullptr) {
    std::fprintf(stderr, "no runtime: %s\n", dlerror());
    std::exit(2);
  }
  Runtime r;
  r.stream_create = reinterpret_cast<int (*)(CUstream*)>(dlsym(rt, "cudaStreamCreate"));
  r.stream_destroy = reinterpret_cast<int (*)(CUstream)>(dlsym(rt, "cudaStreamDestroy"));
  r.malloc_ = reinterpret_cast<int (*)(void**, size_t)>(dlsym(rt, "cudaMalloc"));
  r.free_async = reinterpret_cast<int (*)(void*, CUstream)>(dlsym(rt, "cudaFreeAsync"));
  if (!r.stream_create || !r.stream_destroy || !r.malloc_ || !r.free_async) std::exit(2);
  return r;
}

#define RT_CHECK(call)                                                             \
  do {                                                                             \
    if (int rt_r_ = (call); rt_r_ != 0) {                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #call, rt_r_); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// The next two modes free a block while work that may use it is pending, then allocate in
// another context, which records the fence of the freed block there (and the shim's own
// streams with it), synchronise that context and allocate again: a reuse of the block while
// the work is still pending is the bug ("reused=1 pending=1"); a reuse after it completed
// (the synchronisation waited for it through the fence) or none is right.
// `recorder` allocates 48 MiB `fillers` times (the last finds no room: a fence is recorded
// there) and synchronises; `owner`, the freed block's context, allocates 48 MiB (is it the
// freed block, while `pending`?); `complete` synchronises the work; `owner` allocates again.
void reuse_after_fence(CUcontext owner, CUcontext recorder, int fillers, CUdeviceptr freed,
                       const std::function<bool()>& pending, const std::function<void()>& complete) {
  std::vector<CUdeviceptr> blocks(static_cast<size_t>(fillers) + 2);
  CUcontext popped = nullptr;
  CHECK(cuCtxPushCurrent(recorder));
  for (int i = 0; i < fillers; ++i) CHECK(cuMemAlloc(&blocks[static_cast<size_t>(i)], kBig));
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxPopCurrent(&popped));
  CHECK(cuCtxPushCurrent(owner));
  CUdeviceptr& r = blocks[static_cast<size_t>(fillers)];
  CUdeviceptr& t = blocks[static_cast<size_t>(fillers) + 1];
  CHECK(cuMemAlloc(&r, kBig));
  const bool still_pending = pending();
  CHECK(cuCtxPopCurrent(&popped));
  complete();
  CHECK(cuCtxPushCurrent(owner));
  CHECK(cuMemAlloc(&t, kBig));
  CHECK(cuCtxPopCurrent(&popped));
  std::printf("reused=%d pending=%d reused_later=%d\n", r == freed, still_pending, t == freed);
  for (CUdeviceptr b : blocks) CHECK(cuMemFree(b));
}

// Every context's work completes (as a program does before it destroys one of them; the fake
// driver runs queued work only when a synchronisation covers it).
void sync_all(std::initializer_list<CUcontext> contexts) {
  CUcontext popped = nullptr;
  for (CUcontext c : contexts) {
    CHECK(cuCtxPushCurrent(c));
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxPopCurrent(&popped));
  }
}

CUcontext created_context() {
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext c = nullptr;
  CHECK(cuCtxCreate(&c, nullptr, 0, dev));
  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped));
  return c;
}

int destroyed_stream(bool runtime) {
  primary0();
  CUfunction f = load_fill();
  Runtime rt = runtime ? load_runtime() : Runtime{};
  CUstream s = nullptr;
  CUdeviceptr p = 0;
  if (runtime) {
    RT_CHECK(rt.stream_create(&s));
    void* v = nullptr;
    RT_CHECK(rt.malloc_(&v, kBig));
    p = reinterpret_cast<CUdeviceptr>(v);
  } else {
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&p, kBig));
  }
  CUevent after_fill = nullptr;
  CHECK(cuEventCreate(&after_fill, CU_EVENT_DISABLE_TIMING));
  fill(f, s, p, kBig, 7);
  CHECK(cuEventRecord(after_fill, s));
  if (runtime) {
    RT_CHECK(rt.free_async(reinterpret_cast<void*>(p), s));
    RT_CHECK(rt.stream_destroy(s));
  } else {
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuStreamDestroy(s));
  }
  CUcontext other = created_context(), first = nullptr;
  CHECK(cuCtxGetCurrent(&first));
  reuse_after_fence(
      first, other, 1, p, [&] { return cuEventQuery(after_fill) == CUDA_ERROR_NOT_READY; },
      [] { CHECK(cuCtxSynchronize()); });
  sync_all({first, other});
  CHECK(cuCtxDestroy(other));
  return 0;
}

int other_context(bool copy) {
  CUcontext a = primary0();
  CUdeviceptr first = 0, src = 0, p = 0;
  CHECK(cuMemAlloc(&first, 4096));  // (the first context's allocation)
  CHECK(cuMemAlloc(&src, 1 << 20));
  if (copy) CHECK(cuMemAlloc(&p, kBig));
  CUcontext b = created_context();
  CHECK(cuCtxPushCurrent(b));
  if (copy) {
    CHECK(cuMemcpyAsync(p, src, 1 << 20, nullptr));
  } else {
    CHECK(cuMemAlloc(&p, kBig));
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    CHECK(cuMemPrefetchAsync(p, 1 << 20, loc, 0, nullptr));
    CHECK(cuMemFree(p));
  }
  CUcontext popped = nullptr;
  CHECK(cuCtxPopCurrent(&popped));
  if (copy) CHECK(cuMemFree(p));
  // (The first context records the fence and synchronises: the other's work is pending.)
  bool pending_seen = false;
  auto other_pending = [&] {
    CHECK(cuCtxPushCurrent(b));
    pending_seen = cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY;
    CHECK(cuCtxPopCurrent(&popped));
    return pending_seen;
  };
  auto complete = [&] {
    CHECK(cuCtxPushCurrent(b));
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxPopCurrent(&popped));
  };
  // (A copy: the block is the first context's, whose range is full at once; a carve: the
  // first context's range fills at its second 48 MiB.)
  reuse_after_fence(copy ? a : b, a, copy ? 1 : 2, p, other_pending, complete);
  CHECK(cuMemFree(src));
  CHECK(cuMemFree(first));
  sync_all({a, b});
  CHECK(cuCtxDestroy(b));
  return 0;
}

int open_capture(bool blocking) {
  primary0();
  CUfunction f = load_fill();
  CUstream c = nullptr;
  CHECK(cuStreamCreate(&c, blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
  CUdeviceptr x = 0;
  CHECK(cuMemAlloc(&x, 4 << 20));
  CHECK(cuStreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_RELAXED));
  fill(f, c, x, 4 << 20, 3);  // captured: the graph would write x when launched
  int rounds = 0;
  for (int i = 0; i < 40; ++i) {
    CUdeviceptr b = 0;
    if (cuMemAlloc(&b, kBig) != CUDA_SUCCESS) break;
    CHECK(cuMemFree(b));
    ++rounds;
  }
  std::printf("rounds=%d\n", rounds);
  CHECK(cuMemFree(x));
  std::vector<CUdeviceptr> small;
  bool x_reused = false;
  for (int i = 0; i < 20; ++i) {
    CUdeviceptr s = 0;
    if (cuMemAlloc(&s, 4 << 20) != CUDA_SUCCESS) break;
    x_reused = x_reused || s == x;
    small.push_back(s);
  }
  std::printf("x_reused=%d\n", x_reused);
  for (CUdeviceptr s : small) CHECK(cuMemFree(s));
  CUgraph g = nullptr;
  CHECK(cuStreamEndCapture(c, &g));
  CHECK(cuGraphDestroy(g));
  CHECK(cuStreamDestroy(c));
  return 0;
}

int idle_streams(int n) {
  primary0();
  CUfunction f = load_fill();
  std::vector<CUstream> idle(static_cast<size_t>(n));
  for (CUstream& s : idle) CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUstream busy = nullptr;
  CHECK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  constexpr size_t kBlock = 8 << 20;
  CUdeviceptr p = 0, q = 0;
  CHECK(cuMemAlloc(&p, kBlock));
  fill(f, busy, p, kBlock, 1);
  CHECK(cuStreamSynchronize(busy));
  fill(f, busy, p, kBlock, 2);
  int version = 0;
  CHECK(cuDriverGetVersion(&version));  // marker: the measured free and reuse begin
  CHECK(cuMemFree(p));
  CHECK(cuMemAlloc(&q, kBlock));
  CHECK(cuDriverGetVersion(&version));  // marker: they end
  std::printf("reused=%d\n", q == p);
  CHECK(cuStreamSynchronize(busy));
  CHECK(cuMemFree(q));
  for (CUstream s : idle) CHECK(cuStreamDestroy(s));
  CHECK(cuStreamDestroy(busy));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  CHECK(cuInit(0));
  const std::string mode = argv[1];
  const std::string arg = argc > 2 ? argv[2] : "";
  if (mode == "destroyed_stream") return destroyed_stream(arg == "runtime");
  if (mode == "other_context") return other_context(arg == "copy");
  if (mode == "open_capture") return open_capture(arg == "blocking");
  if (mode == "idle_streams") return idle_streams(arg.empty() ? 2000 : std::atoi(arg.c_str()));
  return 2;
}
