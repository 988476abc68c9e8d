// per_tensor: a program that allocates the way a framework in its per-tensor mode does (one
// cuMemAlloc per tensor, freed as soon as it dies), or the way PyTorch's caching allocator
// does (a few large segments, tensors at offsets inside them, nothing freed). Ordinary
// driver-API code; it checks its own data and prints what the tests compare.
//
//   per_tensor reuse        a kernel on a non-blocking stream writes tensor A; A is freed
//                           while that work is pending (run with FAKECUDA_ASYNC=1); prints
//                           A=, B= (an allocation of A's size right after the free),
//                           pending_after_free=1 if the stream's work was still pending when
//                           the free returned, makes and frees 1100 small tensors, prints
//                           pending_before_sync (the stream's work still pending), then
//                           synchronizes the context and allocates (synchronizing every 32)
//                           until A's address comes back: reused=1 (or 0 after 1024 tries)
//   per_tensor discard N    N rounds: a live tensor L (4 MiB) and small live tensors keep a
//                           pattern while large and small tensors around them are made,
//                           written and freed; checks L and the small ones after every round
//   per_tensor training N   N iterations of a forward/backward-like pattern: activations of
//                           many sizes allocated in order, consumed in reverse, freed; every
//                           tensor checked before its free
//   per_tensor segments N   the caching allocator's way: two segments (2 MiB, 20 MiB), tensors
//                           at offsets, N iterations of kernels on them; nothing freed until exit
//   per_tensor arena N      an arena's way (XLA's BFC allocator, a large cached segment): one
//                           100 MiB allocation, an 80 MiB tensor at offset 20 MiB in it, and
//                           three other 50 MiB tensors; N iterations of a kernel writing the
//                           arena tensor, then one writing each other tensor, 15 ms apart (so
//                           that CUPTI's records are delivered in between); checks all at the end.
//                           `arena N profile`: after the second iteration a profiler appears:
//                           loads libcupti.so.13 globally and calls cuptiSubscribe found with
//                           dlsym(RTLD_DEFAULT), as a profiler linked to libcupti would reach it;
//                           prints subscribed=<its CUptiResult>
//   per_tensor weights N    inference's way: three 16 MiB weight tensors copied in from the
//                           host (cuMemcpyHtoD, as a framework loads a checkpoint), then N
//                           iterations of one kernel per weight that reads it and writes its
//                           own 16 MiB activation (add_u32: act = w + w), 15 ms apart; after
//                           iteration N/2 a kernel no earlier iteration ran writes weight 0
//                           anew (fill_u32). Checks every activation after every iteration
//                           and prints weights=<base>,<bytes> and acts=<base>,<bytes> per tensor
//   per_tensor gather N     nine 4 MiB tensors, each followed by a live 2 MiB tensor no kernel
//                           uses (so no two of the nine share a move call), N rounds of three
//                           kernels t[3g] = t[3g+1] + t[3g+2] (g = 0, 1, 2), each reading
//                           tensors apart from one another; checks all nine at the end
//   per_tensor threads T N  T threads, each N rounds of allocate / launch / check / free on its
//                           own non-blocking stream
//   per_tensor capture K    while a non-blocking stream is captured (relaxed mode; K = plain:
//                           cuStreamBeginCapture, to_graph: cuStreamBeginCaptureToGraph into a
//                           graph captured before), 40 tensors of 8 MiB are made and freed;
//                           prints "captured" after the capture ends, then 40 more
// Prints "ok" when every check passed.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "common.h"

namespace {

struct Kernels {
  CUmodule module = nullptr;
  CUfunction fill = nullptr;
  CUfunction add = nullptr;
};

Kernels load() {
  Kernels k;
  CHECK(cuModuleLoadData(&k.module, "fill_u32(8,8,4);add_u32(8,8,8,8)"));
  CHECK(cuModuleGetFunction(&k.fill, k.module, "fill_u32"));
  CHECK(cuModuleGetFunction(&k.add, k.module, "add_u32"));
  return k;
}

void fill(const Kernels& k, CUdeviceptr p, size_t bytes, unsigned value, CUstream s) {
  size_t n = bytes / 4;
  void* params[] = {&p, &n, &value};
  CHECK(cuLaunchKernel(k.fill, 1, 1, 1, 128, 1, 1, 0, s, params, nullptr));
}

// Whether every word of [p, p + bytes) holds `value` (reads the whole range).
bool holds(CUdeviceptr p, size_t bytes, unsigned value) {
  std::vector<unsigned> words(bytes / 4);
  CHECK(cuMemcpyDtoH(words.data(), p, bytes));
  return std::all_of(words.begin(), words.end(), [&](unsigned w) { return w == value; });
}

int reuse(const Kernels& k) {
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t bytes = 256 << 10;
  CUdeviceptr a = 0, b = 0;
  CHECK(cuMemAlloc(&a, bytes));
  fill(k, a, bytes, 7, s);
  CHECK(cuMemFree(a));
  const bool pending = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
  CHECK(cuMemAlloc(&b, bytes));
  std::printf("A=%#llx\nB=%#llx\npending_after_free=%d\n", (unsigned long long)a, (unsigned long long)b, pending ? 1 : 0);
  CHECK(cuMemFree(b));
  for (int i = 0; i < 1100; ++i) {  // more short-lived tensors while the stream is busy
    CUdeviceptr c = 0;
    CHECK(cuMemAlloc(&c, 4096));
    CHECK(cuMemFree(c));
  }
  std::printf("pending_before_sync=%d\n", cuStreamQuery(s) == CUDA_ERROR_NOT_READY ? 1 : 0);
  CHECK(cuCtxSynchronize());
  std::vector<CUdeviceptr> held;
  bool reused = false;
  for (int i = 0; i < 1024 && !reused; ++i) {
    if (i % 32 == 31) CHECK(cuCtxSynchronize());  // (as a training loop does once a step)
    CUdeviceptr c = 0;
    CHECK(cuMemAlloc(&c, bytes));
    held.push_back(c);
    reused = c == a;
  }
  std::printf("reused=%d\n", reused ? 1 : 0);
  for (CUdeviceptr c : held) CHECK(cuMemFree(c));
  CHECK(cuStreamDestroy(s));
  return 0;
}

int discard(const Kernels& k, int rounds) {
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t big = 4 << 20;
  CUdeviceptr live = 0;
  CHECK(cuMemAlloc(&live, big));
  fill(k, live, big, 0x11111111u, s);
  std::vector<CUdeviceptr> small(16);
  for (size_t i = 0; i < small.size(); ++i) {
    CHECK(cuMemAlloc(&small[i], 8192));
    fill(k, small[i], 8192, 0x2000u + unsigned(i), s);
  }
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::pair<CUdeviceptr, size_t>> temp;
    for (int i = 0; i < 12; ++i) {
      const size_t bytes = i % 3 == 0 ? (size_t(2 + i % 5) << 20) : size_t(4096 * (1 + i));
      CUdeviceptr p = 0;
      CHECK(cuMemAlloc(&p, bytes));
      fill(k, p, bytes, 0x3000u + unsigned(i), s);
      temp.emplace_back(p, bytes);
    }
    for (auto& [p, bytes] : temp) CHECK(cuMemFree(p));
    CHECK(cuStreamSynchronize(s));
    if (!holds(live, big, 0x11111111u)) {
      std::fprintf(stderr, "round %d: the live 4 MiB tensor lost its data\n", r);
      return 1;
    }
    for (size_t i = 0; i < small.size(); ++i) {
      if (!holds(small[i], 8192, 0x2000u + unsigned(i))) {
        std::fprintf(stderr, "round %d: small live tensor %zu lost its data\n", r, i);
        return 1;
      }
    }
  }
  for (CUdeviceptr p : small) CHECK(cuMemFree(p));
  CHECK(cuMemFree(live));
  CHECK(cuStreamDestroy(s));
  return 0;
}

int training(const Kernels& k, int iterations) {
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t sizes[] = {3 << 20, 512, 96 << 10, 1 << 20, 6 << 20, 40 << 10, 2 << 20, 700 << 10};
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::pair<CUdeviceptr, size_t>> acts;
    for (int layer = 0; layer < 16; ++layer) {  // forward: activations in order
      const size_t bytes = sizes[layer % 8];
      CUdeviceptr p = 0;
      CHECK(cuMemAlloc(&p, bytes));
      fill(k, p, bytes, unsigned(it * 100 + layer), s);
      acts.emplace_back(p, bytes);
    }
    CHECK(cuStreamSynchronize(s));
    for (int layer = 15; layer >= 0; --layer) {  // backward: consumed in reverse, freed
      auto [p, bytes] = acts[layer];
      if (!holds(p, bytes, unsigned(it * 100 + layer))) {
        std::fprintf(stderr, "iteration %d: activation %d lost its data\n", it, layer);
        return 1;
      }
      CHECK(cuMemFree(p));
    }
  }
  CHECK(cuStreamDestroy(s));
  return 0;
}

int segments(const Kernels& k, int iterations) {
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr small = 0, large = 0;
  CHECK(cuMemAlloc(&small, 2 << 20));
  CHECK(cuMemAlloc(&large, 20 << 20));
  for (int it = 0; it < iterations; ++it) {
    for (int t = 0; t < 8; ++t) {  // tensors at offsets inside the segments
      fill(k, small + t * (256 << 10), 64 << 10, unsigned(it * 10 + t), s);
      fill(k, large + t * (2 << 20), 1 << 20, unsigned(it * 10 + t + 1000), s);
    }
    CHECK(cuStreamSynchronize(s));
    for (int t = 0; t < 8; ++t) {
      if (!holds(small + t * (256 << 10), 64 << 10, unsigned(it * 10 + t)) ||
          !holds(large + t * (2 << 20), 1 << 20, unsigned(it * 10 + t + 1000))) {
        std::fprintf(stderr, "iteration %d: tensor %d lost its data\n", it, t);
        return 1;
      }
    }
  }
  size_t size = 0;
  CUdeviceptr base = 0;
  CHECK(cuMemGetAddressRange(&base, &size, large + (5 << 20)));
  std::printf("segment_range=%s\n", base == large && size == (20u << 20) ? "exact" : "wrong");
  CHECK(cuMemFree(large));
  CHECK(cuMemFree(small));
  CHECK(cuStreamDestroy(s));
  return base == large && size == (20u << 20) ? 0 : 1;
}

int capture(const std::string& kind) {
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUgraph first = nullptr, graph = nullptr;
  if (kind == "to_graph") {
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuStreamEndCapture(s, &first));
    CHECK(cuStreamBeginCaptureToGraph(s, first, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_RELAXED));
  } else {
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  }
  auto churn = [] {
    for (int i = 0; i < 40; ++i) {
      CUdeviceptr p = 0;
      CHECK(cuMemAlloc(&p, 8 << 20));
      CHECK(cuMemFree(p));
    }
  };
  churn();
  CHECK(cuStreamEndCapture(s, &graph));
  std::printf("captured\n");
  churn();
  CHECK(cuGraphDestroy(graph));
  if (first != nullptr && first != graph) CHECK(cuGraphDestroy(first));
  CHECK(cuStreamDestroy(s));
  return 0;
}

int threads(const Kernels& k, int nthreads, int rounds) {
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < nthreads; ++t) {
    pool.emplace_back([&, t] {
      CHECK(cuCtxSetCurrent(ctx));
      CUstream s = nullptr;
      CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      std::mt19937 rng(t);
      std::vector<std::pair<CUdeviceptr, size_t>> mine;
      for (int r = 0; r < rounds; ++r) {
        const size_t bytes = rng() % 8 == 0 ? (size_t(1 + rng() % 3) << 20) : 512 * (1 + rng() % 64);
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc(&p, bytes));
        fill(k, p, bytes, unsigned(t << 20 | r), s);
        mine.emplace_back(p, bytes);
        if (mine.size() > 24 || rng() % 3 == 0) {
          const size_t i = rng() % mine.size();
          CHECK(cuStreamSynchronize(s));
          auto [q, n] = mine[i];
          std::vector<unsigned> first(1);
          CHECK(cuMemcpyDtoH(first.data(), q, 4));
          // (the value written last into q: its round is not kept, so check the thread's tag)
          if ((first[0] >> 20) != unsigned(t)) failures.fetch_add(1);
          CHECK(cuMemFree(q));
          mine.erase(mine.begin() + static_cast<long>(i));
        }
      }
      for (auto& [q, n] : mine) CHECK(cuMemFree(q));
      CHECK(cuStreamSynchronize(s));
      CHECK(cuStreamDestroy(s));
    });
  }
  for (auto& th : pool) th.join();
  std::printf("failures=%d\n", failures.load());
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace

int weights(const Kernels& k, int iterations) {
  constexpr size_t kBytes = 16 << 20;
  CUdeviceptr w[3] = {}, act[3] = {};
  for (int i = 0; i < 3; ++i) {
    CHECK(cuMemAlloc(&w[i], kBytes));
    CHECK(cuMemAlloc(&act[i], kBytes));
    std::printf("weights=%llu,%zu acts=%llu,%zu\n", static_cast<unsigned long long>(w[i]), kBytes,
                static_cast<unsigned long long>(act[i]), kBytes);
    std::vector<unsigned> host(kBytes / 4, unsigned(i + 1));
    CHECK(cuMemcpyHtoD(w[i], host.data(), kBytes));
  }
  unsigned value[3] = {1, 2, 3};
  size_t n = kBytes / 4;
  for (int it = 0; it < iterations; ++it) {
    for (int i = 0; i < 3; ++i) {
      void* params[] = {&act[i], &w[i], &w[i], &n};
      CHECK(cuLaunchKernel(k.add, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
    }
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < 3; ++i) {
      if (!holds(act[i], kBytes, 2 * value[i])) {
        std::fprintf(stderr, "iteration %d: activation %d is not twice weight %d\n", it, i, i);
        return 1;
      }
    }
    if (it == iterations / 2) {  // a write the history has never seen
      value[0] = 77;
      fill(k, w[0], kBytes, value[0], nullptr);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
  }
  for (int i = 0; i < 3; ++i) {
    CHECK(cuMemFree(w[i]));
    CHECK(cuMemFree(act[i]));
  }
  return 0;
}

int gather(const Kernels& k, int rounds) {
  constexpr size_t kBytes = 4 << 20, kSpacer = 2 << 20;
  CUdeviceptr t[9] = {}, spacer[9] = {};
  for (int i = 0; i < 9; ++i) {
    CHECK(cuMemAlloc(&t[i], kBytes));
    CHECK(cuMemAlloc(&spacer[i], kSpacer));
    fill(k, t[i], kBytes, unsigned(i + 1), nullptr);
  }
  size_t n = kBytes / 4;
  for (int r = 0; r < rounds; ++r) {
    for (int g = 0; g < 3; ++g) {
      void* params[] = {&t[3 * g], &t[3 * g + 1], &t[3 * g + 2], &n};
      CHECK(cuLaunchKernel(k.add, 1, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr));
    }
  }
  CHECK(cuCtxSynchronize());
  for (int i = 0; i < 9; ++i) {
    const unsigned want = i % 3 == 0 ? unsigned(i + 2 + i + 3) : unsigned(i + 1);
    if (!holds(t[i], kBytes, want)) {
      std::fprintf(stderr, "tensor %d does not hold %u\n", i, want);
      return 1;
    }
    CHECK(cuMemFree(t[i]));
    CHECK(cuMemFree(spacer[i]));
  }
  return 0;
}

int arena(const Kernels& k, int iterations, bool profile) {
  constexpr size_t MiB = 1 << 20;
  CUdeviceptr arena = 0;
  CHECK(cuMemAlloc(&arena, 100 * MiB));
  const CUdeviceptr tensor = arena + 20 * MiB;
  CUdeviceptr others[3] = {};
  for (CUdeviceptr& o : others) CHECK(cuMemAlloc(&o, 50 * MiB));
  for (int it = 0; it < iterations; ++it) {
    fill(k, tensor, 80 * MiB, unsigned(it + 1), nullptr);
    for (int o = 0; o < 3; ++o) fill(k, others[o], 50 * MiB, unsigned(1000 * (o + 1) + it), nullptr);
    CHECK(cuCtxSynchronize());
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    if (profile && it == 1) {
      void* cupti = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
      using Subscribe = int (*)(void**, void*, void*);
      auto subscribe = cupti != nullptr ? reinterpret_cast<Subscribe>(dlsym(RTLD_DEFAULT, "cuptiSubscribe")) : nullptr;
      void* handle = nullptr;
      std::printf("subscribed=%d\n", subscribe != nullptr ? subscribe(&handle, nullptr, nullptr) : -1);
    }
  }
  if (!holds(tensor, 80 * MiB, unsigned(iterations))) {
    std::fprintf(stderr, "the arena tensor lost its data\n");
    return 1;
  }
  for (int o = 0; o < 3; ++o) {
    if (!holds(others[o], 50 * MiB, unsigned(1000 * (o + 1) + iterations - 1))) {
      std::fprintf(stderr, "tensor %d lost its data\n", o);
      return 1;
    }
    CHECK(cuMemFree(others[o]));
  }
  CHECK(cuMemFree(arena));
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const int n = argc > 2 ? std::atoi(argv[2]) : 0;
  const std::string kind = argc > 2 ? argv[2] : "";
  const bool capture_mode = mode == "capture" && (kind == "plain" || kind == "to_graph");
  if (mode != "reuse" && !capture_mode &&
      (n <= 0 || (mode != "discard" && mode != "training" && mode != "segments" && mode != "threads" && mode != "arena" &&
                  mode != "weights" && mode != "gather"))) {
    std::fprintf(stderr,
                 "usage: per_tensor reuse | discard N | training N | segments N | arena N | weights N | gather N | threads T N | capture "
                 "plain|to_graph\n");
    return 2;
  }
  init_context();
  Kernels k = load();
  int rc = 0;
  if (mode == "reuse") rc = reuse(k);
  if (mode == "discard") rc = discard(k, n);
  if (mode == "training") rc = training(k, n);
  if (mode == "segments") rc = segments(k, n);
  if (mode == "arena") rc = arena(k, n, argc > 3 && std::string(argv[3]) == "profile");
  if (mode == "weights") rc = weights(k, n);
  if (mode == "gather") rc = gather(k, n);
  if (mode == "threads") rc = threads(k, n, argc > 3 ? std::atoi(argv[3]) : 100);
  if (mode == "capture") rc = capture(kind);
  CHECK(cuModuleUnload(k.module));
  if (rc == 0) std::printf("ok\n");
  return rc;
}
