// The sizes of the Engine's move calls (Backend::prefetch, one per run of chunks and block:
// docs/design.md, "One launch"), kept as a histogram so that the shim's report and the
// simulator's sweep state the same figures: how many calls, and the median and 90th
// percentile bytes per call. The call's size is what decides how well the driver fills the
// link: nvidia-uvm's uvm_migrate.c walks a prefetch one 2 MiB VA block at a time and
// pipelines copy and map only across the blocks of one call (docs/design.md, "One launch").
//
// Log-linear buckets, as HdrHistogram keeps them: sizes below 32 bytes exactly, larger ones in
// 16 buckets per power of two, so a quantile is rounded down by less than 1/16 of its value
// and is exact for every size with at most 5 significant bits — every multiple of 2 MiB up to
// 32 chunks (64 MiB), every power of two. Memory: 8 bytes per bucket up to the largest size
// added (at most 976 buckets, 7.8 KiB). Not thread-safe: the owner serialises calls.
#pragma once

#include <cstdint>
#include <vector>

namespace spillway {

class CallSizes {
 public:
  // Counts one call of `bytes` (> 0; a call of 0 bytes is not counted).
  void add(std::uint64_t bytes);
  // Adds every call counted in `other`.
  void merge(const CallSizes& other);
  // Calls counted.
  std::uint64_t calls() const { return calls_; }
  // The nearest-rank `q`-quantile (0 < q <= 1; 0.5: the median) of the calls' bytes, rounded
  // down to its bucket's lower end; 0 when no call was counted.
  std::uint64_t quantile(double q) const;
  // Heap bytes held (spillway/state_bytes.h).
  std::uint64_t state_bytes() const { return counts_.capacity() * sizeof(std::uint64_t); }

  // The bucket of `bytes` and the smallest size in a bucket (exposed for tests).
  static std::uint32_t bucket_of(std::uint64_t bytes);
  static std::uint64_t lower_end(std::uint32_t bucket);

 private:
  std::vector<std::uint64_t> counts_;  // by bucket, up to the largest used
  std::uint64_t calls_ = 0;
};

}  // namespace spillway
