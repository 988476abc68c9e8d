// ipc N: cuMemAlloc 1 MiB and ask N times for an IPC handle; prints "ipc=RC" per call.
#include "common.h"

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 3;
  init_context();
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, 1 << 20));
  for (int i = 0; i < n; ++i) {
    CUipcMemHandle h{};
    std::printf("ipc=%d\n", cuIpcGetMemHandle(&h, p));
  }
  CHECK(cuMemFree(p));
  return 0;
}
