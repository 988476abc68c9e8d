// InstantBackend: a Backend for tests and benchmarks of the Engine and the Policies in
// which every call succeeds at once and costs nothing. Allocations get addresses on whole
// 2 MiB chunks from a counter (as a caching allocator would place them); events are
// complete as soon as they are recorded. Subclass it to record what the Engine asks for.
// Not thread-safe.
#pragma once

#include <cstdint>

#include "spillway/backend.h"

namespace spillway::test_support {

class InstantBackend : public Backend {
 public:
  // `gpu_bytes`: total and free GPU memory reported; `host_bytes`: host RAM reported.
  explicit InstantBackend(std::uint64_t gpu_bytes = 80ull << 30, std::uint64_t host_bytes = 1ull << 40)
      : gpu_(gpu_bytes), host_(host_bytes) {}

  Result memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override {
    *free_bytes = *total_bytes = gpu_;
    return {};
  }
  std::uint64_t host_memory_bytes() override { return host_; }
  bool concurrent_managed_access() override { return true; }
  int current_device() override { return 0; }
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override {
    *addr = next_;
    next_ += (bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
    return {};
  }
  Result free_managed(std::uint64_t) override { return {}; }
  Result prefetch(std::uint64_t, std::uint64_t, Location, int) override { return {}; }
  Result advise(std::uint64_t, std::uint64_t, Advice, Location, int) override { return {}; }
  Result capture_status(StreamHandle, bool* capturing) override {
    *capturing = false;
    return Result{};
  }
  Result record_event(StreamHandle, EventHandle* event) override {
    *event = 1;
    return {};
  }
  Result event_done(EventHandle) override { return {}; }
  void destroy_event(EventHandle) override {}
  Result wait_event(EventHandle) override { return {}; }

 private:
  std::uint64_t gpu_;
  std::uint64_t host_;
  std::uint64_t next_ = 1ull << 40;
};

}  // namespace spillway::test_support
