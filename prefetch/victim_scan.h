// Belady's choice over a set of resident chunks ordered by next use: the unpinned chunk used
// furthest in the future. Shared by the policies that rank residency by next use (`oracle`
// with the true future, `learned` with the predicted one).
#pragma once

#include <iterator>
#include <type_traits>
#include <utility>

#include "spillway/policy.h"

namespace spillway {

// `resident`: an ordered set of (next use, chunk), or an ordered map keyed by it. Sets *victim
// to the unpinned chunk with the furthest next use and returns true, or returns false when
// every chunk is pinned. Within one launch the Engine asks again and again while the chunks
// passed stay pinned or leave, so the scan resumes below `*hint` when `*hint_valid` (the
// caller clears it at each launch).
template <class Ranked>
bool furthest_unpinned(const Ranked& resident, const VictimQuery& query, typename Ranked::key_type* hint,
                       bool* hint_valid, ChunkIndex* victim) {
  auto key = [](const auto& entry) -> const typename Ranked::key_type& {
    if constexpr (std::is_same_v<typename Ranked::key_type, typename Ranked::value_type>) return entry;
    else return entry.first;
  };
  auto it = *hint_valid ? std::make_reverse_iterator(resident.upper_bound(*hint)) : resident.rbegin();
  for (; it != resident.rend(); ++it) {
    const ChunkIndex chunk = key(*it).second;
    if (!query.pinned(chunk)) {
      *victim = chunk;
      *hint = key(*it);
      *hint_valid = true;
      return true;
    }
  }
  return false;
}

}  // namespace spillway
