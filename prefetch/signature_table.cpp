#include "signature_table.h"

#include <algorithm>
#include <functional>

#include "spillway/state_bytes.h"

namespace spillway::learned {

std::vector<std::uint32_t>* SignatureTable::kernel(std::string_view name) {
  return &names_[std::hash<std::string_view>{}(name)];
}

std::uint32_t SignatureTable::signature(std::vector<std::uint32_t>& by_position, std::uint32_t position) {
  while (by_position.size() <= position) {
    by_position.push_back(static_cast<std::uint32_t>(sigs_.size()));
    sigs_.emplace_back();
  }
  return by_position[position];
}

void SignatureTable::observe(std::uint32_t sig, bool dead, std::uint64_t distance, bool next_writes) {
  Outcomes& s = sigs_[sig];
  // EWMA, weight 1/4 to the newest outcome (as the durations).
  s.dead = 0.75 * s.dead + (dead ? 0.25 : 0.0);
  s.writes = s.writes < 0 ? (next_writes ? 1.0 : 0.0) : 0.75 * s.writes + (next_writes ? 0.25 : 0.0);
  if (dead) return;
  const double d = static_cast<double>(distance);
  s.reuse = s.reuse == 0 ? d : 0.75 * s.reuse + 0.25 * d;
}

std::uint64_t SignatureTable::guess_next_use(const ChunkInfo& info) const {
  if (info.sig == kNone) return 0;
  const Outcomes& sg = sigs_[info.sig];
  if (sg.dead > 0.5) return kFar;
  if (sg.reuse <= 0) return 0;
  // guess_factor (2) times the mean distance: a guess, ranked behind the exact predictions
  // of the history and not taken for a misprediction while the usual reuse may still come.
  return info.last_seq + std::max<std::uint64_t>(1, static_cast<std::uint64_t>(guess_factor_ * sg.reuse + 0.5));
}

std::uint64_t SignatureTable::heap_bytes() const {
  // (The by-position vectors hold one index per signature.)
  return hash_heap_bytes(names_) + sigs_.size() * sizeof(std::uint32_t) + vector_heap_bytes(sigs_);
}

}  // namespace spillway::learned
