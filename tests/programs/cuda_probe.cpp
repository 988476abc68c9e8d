// cuda_probe: exit 0 if the CUDA driver (libcuda.so.1, found the normal way) initialises
// and has a device, 77 otherwise. Links nothing CUDA: it must not pick up the fake.
#include <dlfcn.h>

#include <cstdio>

int main() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return 77;
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  auto fake = dlsym(h, "fakecuda_reload_config");
  if (init == nullptr || count == nullptr || fake != nullptr) return 77;
  int n = 0;
  if (init(0) != 0 || count(&n) != 0 || n < 1) return 77;
  std::printf("devices=%d\n", n);
  return 0;
}
