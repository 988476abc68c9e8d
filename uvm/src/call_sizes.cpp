#include "spillway/call_sizes.h"

#include <bit>
#include <cmath>

namespace spillway {

namespace {
constexpr unsigned kSubBits = 4;                 // 16 buckets per power of two
constexpr std::uint64_t kExact = 2u << kSubBits;  // sizes below 32 bytes have a bucket each
}  // namespace

std::uint32_t CallSizes::bucket_of(std::uint64_t bytes) {
  if (bytes < kExact) return static_cast<std::uint32_t>(bytes);
  // bytes = (16 + m) << shift with 0 <= m < 16, shift >= 1; buckets of one shift are 16 apart.
  const unsigned top = 63u - static_cast<unsigned>(std::countl_zero(bytes));  // >= 5
  const unsigned shift = top - kSubBits;
  const std::uint64_t m = (bytes >> shift) & ((1u << kSubBits) - 1);
  return static_cast<std::uint32_t>(kExact + (shift - 1) * (1u << kSubBits) + m);
}

std::uint64_t CallSizes::lower_end(std::uint32_t bucket) {
  if (bucket < kExact) return bucket;
  const std::uint32_t above = bucket - static_cast<std::uint32_t>(kExact);
  const unsigned shift = above / (1u << kSubBits) + 1;
  const std::uint64_t m = above % (1u << kSubBits);
  return ((1ull << kSubBits) + m) << shift;
}

void CallSizes::add(std::uint64_t bytes) {
  if (bytes == 0) return;
  const std::uint32_t b = bucket_of(bytes);
  if (b >= counts_.size()) counts_.resize(b + 1, 0);
  ++counts_[b];
  ++calls_;
}

void CallSizes::merge(const CallSizes& other) {
  if (other.counts_.size() > counts_.size()) counts_.resize(other.counts_.size(), 0);
  for (std::size_t b = 0; b < other.counts_.size(); ++b) counts_[b] += other.counts_[b];
  calls_ += other.calls_;
}

std::uint64_t CallSizes::quantile(double q) const {
  if (calls_ == 0) return 0;
  // Nearest rank: the ceil(q * n)-th smallest call, 1-based.
  const double want = std::ceil(q * static_cast<double>(calls_));
  const std::uint64_t rank = want < 1 ? 1 : want > static_cast<double>(calls_) ? calls_ : static_cast<std::uint64_t>(want);
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < counts_.size(); ++b) {
    seen += counts_[b];
    if (seen >= rank) return lower_end(static_cast<std::uint32_t>(b));
  }
  return lower_end(static_cast<std::uint32_t>(counts_.size() - 1));
}

}  // namespace spillway
