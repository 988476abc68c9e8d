// libc10_cuda.so (in a torch/lib directory beside a torch/version.py): stands in for
// PyTorch's CUDA caching allocator, enough for the shim's tracker (interpose/torch_tracker.h)
// to attach as it would to torch 2.5's. What the shim relies on is laid out as 2.5 lays it
// out (docs/design.md's table): the exported `c10::cuda::CUDACachingAllocator::allocator`,
// the allocator's vtable with initialized() at byte 80 and attachAllocatorTraceTracker() at
// byte 240, the native allocator's methods under their own names in the symbol table, and
// TraceEntry's fields (action_ at 0, device_ at 4, addr_ at 8, stream_ at 32, size_ at 40).
//
// The program drives it through the C functions below, in the orders PyTorch's allocator
// reports (c10/cuda/CUDACachingAllocator.cpp): a new segment is cudaMalloc'd under the
// allocator's lock, then SEGMENT_ALLOC; a tensor's ALLOC; a free is FREE_REQUESTED then, at
// once or (a block used on other streams: recordStream) once its events have completed,
// FREE_COMPLETED; empty_cache() reports SEGMENT_FREE and cudaFrees the segment.
#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace c10::cuda::CUDACachingAllocator {

struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM };
  Action action_;
  std::int8_t device_;
  std::int64_t addr_;
  std::shared_ptr<void> context_;
  void* stream_;
  std::int64_t size_;
  std::uint64_t time_;
};
static_assert(offsetof(TraceEntry, addr_) == 8 && offsetof(TraceEntry, stream_) == 32 && offsetof(TraceEntry, size_) == 40);

// CUDAAllocator's vtable as torch 2.5 has it where the shim looks: slot 10 (byte 80)
// initialized(), slot 30 (byte 240) attachAllocatorTraceTracker(); the other slots pad.
#define PAD(n) virtual void pad##n() {}
struct CUDAAllocator {
  PAD(0) PAD(1) PAD(2) PAD(3) PAD(4) PAD(5) PAD(6) PAD(7) PAD(8) PAD(9)
  virtual bool initialized() = 0;
  PAD(11) PAD(12) PAD(13) PAD(14) PAD(15) PAD(16) PAD(17) PAD(18) PAD(19) PAD(20)
  PAD(21) PAD(22) PAD(23) PAD(24) PAD(25) PAD(26) PAD(27) PAD(28) PAD(29)
  virtual void attachAllocatorTraceTracker(std::function<void(const TraceEntry&)> tracker) = 0;
};
#undef PAD

namespace Native {

class NativeCachingAllocator : public CUDAAllocator {
 public:
  bool initialized() override { return initialized_; }
  void attachAllocatorTraceTracker(std::function<void(const TraceEntry&)> tracker) override {
    std::lock_guard lock(mutex_);
    trackers_.push_back(std::move(tracker));
  }

  void record(TraceEntry::Action action, std::uint64_t addr, std::uint64_t size) {
    TraceEntry e{action, 0, static_cast<std::int64_t>(addr), nullptr, nullptr, static_cast<std::int64_t>(size), 0};
    for (const auto& t : trackers_) t(e);
  }

  bool initialized_ = false;
  std::recursive_mutex mutex_;  // PyTorch's allocator lock: held across cudaMalloc and the reports
  std::vector<std::function<void(const TraceEntry&)>> trackers_;
};

}  // namespace Native

__attribute__((visibility("default"))) std::atomic<CUDAAllocator*> allocator;

}  // namespace c10::cuda::CUDACachingAllocator

namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;
c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator g_native;

}  // namespace

#define FAKE_TORCH extern "C" __attribute__((visibility("default")))

// The allocator object is set from the start (PyTorch's BackendInitializer); its per-device
// allocators exist once init() has run (`initialized`).
FAKE_TORCH void fake_torch_init(int initialized) {
  g_native.initialized_ = initialized != 0;
  c10::cuda::CUDACachingAllocator::allocator.store(&g_native);
}

// A new segment: cudaMalloc (the shim's hook) under the allocator's lock, then SEGMENT_ALLOC.
FAKE_TORCH CUdeviceptr fake_torch_segment(std::size_t bytes) {
  std::lock_guard lock(g_native.mutex_);
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) return 0;
  g_native.record(TraceEntry::SEGMENT_ALLOC, p, bytes);
  return p;
}

FAKE_TORCH void fake_torch_alloc(CUdeviceptr p, std::size_t bytes) {
  std::lock_guard lock(g_native.mutex_);
  g_native.record(TraceEntry::ALLOC, p, bytes);
}

// The program frees a tensor; `completed`: the block is back in the cache at once (no
// other stream used it), else FREE_COMPLETED waits for fake_torch_events_done().
FAKE_TORCH void fake_torch_free(CUdeviceptr p, std::size_t bytes, int completed) {
  std::lock_guard lock(g_native.mutex_);
  g_native.record(TraceEntry::FREE_REQUESTED, p, bytes);
  if (completed) g_native.record(TraceEntry::FREE_COMPLETED, p, bytes);
}

FAKE_TORCH void fake_torch_events_done(CUdeviceptr p, std::size_t bytes) {
  std::lock_guard lock(g_native.mutex_);
  g_native.record(TraceEntry::FREE_COMPLETED, p, bytes);
}

// empty_cache(): a segment no tensor holds goes back to the driver.
FAKE_TORCH int fake_torch_release_segment(CUdeviceptr p, std::size_t bytes) {
  std::lock_guard lock(g_native.mutex_);
  g_native.record(TraceEntry::SEGMENT_FREE, p, bytes);
  return cuMemFree(p) == CUDA_SUCCESS ? 0 : 1;
}
