// multi_device MODE: a program that uses several GPUs, as multi-GPU frameworks do.
//  devices  two devices from one process (JAX's local devices, device_map="auto"): 6 blocks
//           of 8 MiB on each ("blocks0=a,b,..", "blocks1=.."), cycled 3 times with fill_u32 on
//           a stream of each device's primary context; then device 1 fills device 0's first
//           block (a tensor used from another GPU); every block's data is checked.
//  fence    a free from another context: a 4 MiB block of device 1 is filled on device 1's
//           legacy stream and freed from device 0 while that work may be pending (run with
//           FAKECUDA_ASYNC=1); device 0 is synchronized and a 4 MiB allocation made on device
//           1 (the block's own): "reused=1" if it got the freed block's address,
//           "device1_done=1" if device 1's work has completed by then (a reuse before it would
//           let the old kernel write into the new block).
//  rank     one torchrun worker: the device is LOCAL_RANK (unset: 0), or 0 when
//           CUDA_VISIBLE_DEVICES names the worker's GPU; 6 blocks of 8 MiB cycled 3 times and
//           checked ("device=N").
#include "common.h"

namespace {

constexpr size_t kBlock = 8 << 20;
constexpr int kBlocks = 6, kPasses = 3;

CUcontext primary(int ordinal) {
  CUdevice dev = 0;
  CHECK(cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  return ctx;
}

bool holds(CUdeviceptr p, size_t bytes, unsigned value) {
  unsigned first = 0, last = 0;
  CHECK(cuMemcpyDtoH(&first, p, 4));
  CHECK(cuMemcpyDtoH(&last, p + bytes - 4, 4));
  if (first == value && last == value) return true;
  std::fprintf(stderr, "block %#llx holds %u/%u, not %u\n", (unsigned long long)p, first, last, value);
  return false;
}

std::vector<CUdeviceptr> make_blocks(const char* label) {
  std::vector<CUdeviceptr> blocks(kBlocks);
  std::string line = std::string(label) + "=";
  for (CUdeviceptr& b : blocks) {
    CHECK(cuMemAlloc(&b, kBlock));
    line += std::to_string(b) + (&b == &blocks.back() ? "" : ",");
  }
  std::printf("%s\n", line.c_str());
  return blocks;
}

int devices() {
  CUcontext ctx[2] = {primary(0), primary(1)};
  CUfunction f[2];
  CUstream s[2];
  std::vector<CUdeviceptr> blocks[2];
  for (int d = 0; d < 2; ++d) {
    CHECK(cuCtxSetCurrent(ctx[d]));
    f[d] = load_fill();
    CHECK(cuStreamCreate(&s[d], CU_STREAM_NON_BLOCKING));
    blocks[d] = make_blocks(d == 0 ? "blocks0" : "blocks1");
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int d = 0; d < 2; ++d) {
      CHECK(cuCtxSetCurrent(ctx[d]));
      for (int i = 0; i < kBlocks; ++i) fill(f[d], s[d], blocks[d][i], kBlock, 100u * (d + 1) + i);
    }
  }
  CHECK(cuCtxSetCurrent(ctx[1]));
  fill(f[1], s[1], blocks[0][0], kBlock, 999);  // device 0's tensor, used from device 1
  bool ok = true;
  for (int d = 0; d < 2; ++d) {
    CHECK(cuCtxSetCurrent(ctx[d]));
    CHECK(cuStreamSynchronize(s[d]));
  }
  for (int d = 0; d < 2; ++d) {
    CHECK(cuCtxSetCurrent(ctx[d]));
    for (int i = 0; i < kBlocks; ++i) ok &= holds(blocks[d][i], kBlock, d == 0 && i == 0 ? 999u : 100u * (d + 1) + i);
    for (CUdeviceptr b : blocks[d]) CHECK(cuMemFree(b));
  }
  if (!ok) return 1;
  std::printf("ok\n");
  return 0;
}

int fence() {
  constexpr size_t kBytes = 4 << 20;
  CUcontext ctx0 = primary(0), ctx1 = primary(1);
  CHECK(cuCtxSetCurrent(ctx1));
  CUfunction f = load_fill();
  CUdeviceptr b = 0;
  CHECK(cuMemAlloc(&b, kBytes));
  fill(f, nullptr, b, kBytes, 7);  // on device 1's legacy stream: pending until something waits for it
  CHECK(cuCtxSetCurrent(ctx0));
  CHECK(cuMemFree(b));
  CHECK(cuCtxSynchronize());  // device 0's work, and whatever it waits for
  CHECK(cuCtxSetCurrent(ctx1));
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc(&p, kBytes));
  const CUresult device1 = cuStreamQuery(nullptr);
  std::printf("reused=%d device1_done=%d\n", p == b, device1 == CUDA_SUCCESS);
  CHECK(cuMemFree(p));
  std::printf("ok\n");
  return 0;
}

int rank() {
  const char* local = std::getenv("LOCAL_RANK");
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const int device = visible != nullptr && *visible != '\0' ? 0 : local != nullptr ? std::atoi(local) : 0;
  CHECK(cuCtxSetCurrent(primary(device)));
  std::printf("device=%d\n", device);
  CUfunction f = load_fill();
  CUstream s = nullptr;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<CUdeviceptr> blocks = make_blocks("blocks");
  for (int pass = 0; pass < kPasses; ++pass) {
    for (int i = 0; i < kBlocks; ++i) fill(f, s, blocks[i], kBlock, 10u * pass + i);
  }
  CHECK(cuStreamSynchronize(s));
  bool ok = true;
  for (int i = 0; i < kBlocks; ++i) ok &= holds(blocks[i], kBlock, 10u * (kPasses - 1) + i);
  for (CUdeviceptr b : blocks) CHECK(cuMemFree(b));
  if (!ok) return 1;
  std::printf("ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  CHECK(cuInit(0));
  const std::string mode = argv[1];
  if (mode == "devices") return devices();
  if (mode == "fence") return fence();
  if (mode == "rank") return rank();
  return 2;
}
