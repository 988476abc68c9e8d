// How a launch's arguments become its footprint (docs/design.md, "One launch, hook to Backend"). The
// shim's launch hook (interpose/hooks_launch.cpp) finds the pointers among a kernel's
// parameters that fall inside managed blocks; this rule turns them into the ranges the
// Engine and the Policy are given. It lives here, not in the hook, so that the simulator can
// give a trace's kernels exactly the footprint the shim would infer from their pointers
// (a framework's caching allocator hands out pointers into large segments).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "spillway/policy.h"

namespace spillway {

// A pointer argument `ptr` found inside the live block [base, end).
struct ArgumentHit {
  std::uint64_t ptr = 0;
  std::uint64_t base = 0;
  std::uint64_t end = 0;
};

// The extent given to a pointer into the middle of a block (ptr != base: a sub-allocation
// of a caching allocator's segment or arena), so that an arena pointer never drags in the
// whole arena: 64 MiB, in bytes.
inline constexpr std::uint64_t kInteriorExtent = 64ull << 20;

// The rule: for each pointer p found in block B, the range from p to the next pointer found
// in B by the same launch, else to B's end; a pointer into B's middle is further bounded to
// kInteriorExtent bytes. An Access is `inferred` (with its block's end) unless it is its whole block. Sorts `hits` by pointer (distinct pointers: the caller drops
// repeats) and writes one Access per hit, in pointer order, into `out`, which must hold
// hits.size(); returns how many were written. No allocation; thread-safe on distinct spans.
inline std::size_t footprint_of(std::span<ArgumentHit> hits, std::span<Access> out) {
  std::sort(hits.begin(), hits.end(), [](const ArgumentHit& a, const ArgumentHit& b) { return a.ptr < b.ptr; });
  std::size_t n = 0;
  for (std::size_t i = 0; i < hits.size() && n < out.size(); ++i) {
    const ArgumentHit& h = hits[i];
    std::uint64_t end = h.end;
    if (i + 1 < hits.size() && hits[i + 1].base == h.base) end = hits[i + 1].ptr;
    if (h.ptr != h.base) end = std::min(end, h.ptr + std::min(kInteriorExtent, h.end - h.ptr));
    const bool inferred = h.ptr != h.base || end != h.end;
    out[n++] = Access{h.ptr, end - h.ptr, false, inferred, inferred ? h.end : 0};
  }
  return n;
}

}  // namespace spillway
