// no_cuda: a program that never touches CUDA but uses the dynamic linker the way plugins
// and wrappers do (dlsym with RTLD_DEFAULT and RTLD_NEXT, dlopen + dlsym). Its output must
// be the same with and without libspillway.so preloaded — including what it finds when it
// probes for the CUDA runtime and driver by name, as programs that detect CUDA do (the
// shim's own exports must not make them think CUDA is there).
#include <dlfcn.h>

#include <cstdio>
#include <initializer_list>

int main(int argc, char** argv) {
  auto put_default = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_DEFAULT, "puts"));
  auto put_next = reinterpret_cast<int (*)(const char*)>(dlsym(RTLD_NEXT, "puts"));
  if (put_default == nullptr || put_next == nullptr || put_default != put_next) {
    std::printf("puts lookup differs: %p %p\n", reinterpret_cast<void*>(put_default), reinterpret_cast<void*>(put_next));
    return 1;
  }
  put_default("hello through RTLD_DEFAULT");
  put_next("hello through RTLD_NEXT");
  void* libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  auto cosine = libm ? reinterpret_cast<double (*)(double)>(dlsym(libm, "cos")) : nullptr;
  std::printf("cos(0)=%g\n", cosine ? cosine(0.0) : -1.0);
  std::printf("missing=%p\n", dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere"));
  void* self = dlopen(nullptr, RTLD_NOW);
  for (const char* name : {"cudaMalloc", "cudaLaunchKernel", "cudaGetDriverEntryPoint", "cuMemAlloc_v2", "cuLaunchKernel",
                           "cuGetProcAddress_v2", "cuInit"}) {
    std::printf("probe %s default=%d self=%d\n", name, dlsym(RTLD_DEFAULT, name) != nullptr,
                self != nullptr && dlsym(self, name) != nullptr);
  }
  std::printf("argc=%d last=%s\n", argc, argv[argc - 1]);
  return 0;
}
