// `learned`'s signature table: what follows a touch by one (kernel name, argument position)
// — the signature, the launch-level counterpart of a load's program counter in SHiP (Wu et
// al., MICRO 2011) and Hawkeye (Jain & Lin, ISCA 2016). Learned from every chunk: when it is
// touched again (reuse after a distance in launches), whether its block is freed first
// (dead), and whether the next touch writes. Used to guess a chunk's next use where the
// history says nothing. Not thread-safe (the Engine serialises the policy's calls).
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "learned_records.h"

namespace spillway::learned {

class SignatureTable {
 public:
  // EWMAs of what followed a touch by one signature (weight 1/4 to the newest outcome).
  struct Outcomes {
    double reuse = 0;    // reuse distance, launches (0: none seen)
    double dead = 0;     // "freed before the next touch" (0..1)
    double writes = -1;  // "the next touch writes" (0..1; a free counts as no write), -1: none seen
  };

  // `guess_factor`: LearnedParams::guess_factor.
  explicit SignatureTable(double guess_factor) : guess_factor_(guess_factor) {}

  // A kernel's signatures by argument position, found by its name's hash (an execution id
  // implies the name, so the caller hashes it once per id). The address is stable.
  std::vector<std::uint32_t>* kernel(std::string_view name);
  // The signature of argument `position` among a kernel's `by_position`, added if new.
  std::uint32_t signature(std::vector<std::uint32_t>& by_position, std::uint32_t position);
  // One outcome of a touch by `sig`: freed first (dead), or touched again after `distance`
  // launches by a touch that writes or not.
  void observe(std::uint32_t sig, bool dead, std::uint64_t distance, bool next_writes = false);
  const Outcomes& operator[](std::uint32_t sig) const { return sigs_[sig]; }
  // The next use of a chunk guessed from the signature of its last touch (a launch seq):
  // kFar when such data is mostly freed first, 0 when nothing is known.
  std::uint64_t guess_next_use(const ChunkInfo& info) const;
  std::uint64_t heap_bytes() const;

 private:
  double guess_factor_;
  // Hash of a kernel name -> its signatures by argument position (indices in sigs_).
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> names_;
  std::vector<Outcomes> sigs_;
};

}  // namespace spillway::learned
