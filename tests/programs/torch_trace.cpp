// torch_trace LIB MODE: a program whose device memory comes from a caching allocator that
// reports its events as PyTorch's does, the fake libc10_cuda.so at LIB (fake_c10_cuda.cpp),
// loaded RTLD_LOCAL as PyTorch's extension loads it. Modes:
//   follow   init; a 200 MiB segment with tensors A (10 MiB, 100 MiB in), B (4 KiB at the
//            segment's base) and C (1 MiB, 8 MiB in); fill_u32 on A through a pointer into
//            the segment's middle, its data checked; B freed at once, C freed with its
//            FREE_COMPLETED after its events (recordStream); then a 2 MiB segment with one
//            tensor, freed, and the segment released (empty_cache). Prints A=, SEG=.
//   uninit   the same first segment, the allocator not initialized (the tracker must not attach).
#include <cuda.h>
#include <dlfcn.h>

#include "common.h"

namespace {

struct FakeTorch {
  void (*init)(int);
  CUdeviceptr (*segment)(size_t);
  void (*alloc)(CUdeviceptr, size_t);
  void (*free)(CUdeviceptr, size_t, int);
  void (*events_done)(CUdeviceptr, size_t);
  int (*release_segment)(CUdeviceptr, size_t);
};

template <typename F>
void resolve(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  if (out == nullptr) {
    std::fprintf(stderr, "%s: not in the fake libc10_cuda.so\n", name);
    std::exit(1);
  }
}

FakeTorch load(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
    std::exit(1);
  }
  FakeTorch t{};
  resolve(lib, "fake_torch_init", t.init);
  resolve(lib, "fake_torch_segment", t.segment);
  resolve(lib, "fake_torch_alloc", t.alloc);
  resolve(lib, "fake_torch_free", t.free);
  resolve(lib, "fake_torch_events_done", t.events_done);
  resolve(lib, "fake_torch_release_segment", t.release_segment);
  return t;
}

void fill(CUdeviceptr p, unsigned long long count, unsigned value) {
  CUmodule module = nullptr;
  CUfunction f = nullptr;
  CHECK(cuModuleLoadData(&module, "fill_u32(8,8,4)"));
  CHECK(cuModuleGetFunction(&f, module, "fill_u32"));
  void* params[] = {&p, &count, &value};
  CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr));
  CHECK(cuCtxSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: torch_trace LIB follow|uninit\n");
    return 2;
  }
  const std::string mode = argv[2];
  FakeTorch torch = load(argv[1]);
  init_context();
  torch.init(mode != "uninit");
  constexpr size_t MiB = 1u << 20;
  const CUdeviceptr seg = torch.segment(200 * MiB);
  if (seg == 0) return 1;
  const CUdeviceptr a = seg + 100 * MiB, b = seg, c = seg + 8 * MiB;
  torch.alloc(a, 10 * MiB);
  torch.alloc(b, 4096);
  torch.alloc(c, MiB);
  fill(a, 10 * MiB / 4, 7);
  expect_word(a, 7);
  expect_word(a + 10 * MiB - 4, 7);
  torch.free(b, 4096, 1);
  torch.free(c, MiB, 0);
  torch.events_done(c, MiB);
  if (mode == "follow") {
    const CUdeviceptr small = torch.segment(2 * MiB);
    torch.alloc(small, 512);
    touch(small, 512);
    torch.free(small, 512, 1);
    if (torch.release_segment(small, 2 * MiB) != 0) return 1;
  }
  std::printf("A=%#llx\nSEG=%#llx\n", (unsigned long long)a, (unsigned long long)seg);
  return 0;
}
