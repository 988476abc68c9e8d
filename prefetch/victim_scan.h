// Belady's choice over a set of resident chunks ordered by next use: the unpinned chunk used
// furthest in the future. Shared by the policies that rank residency by next use (`oracle`
// with the true future, `learned` with the predicted one).
#pragma once

#include <iterator>
#include <utility>

#include "spillway/policy.h"

namespace spillway {

// `resident`: an ordered set of (next use, chunk). Sets *victim to the unpinned chunk with the
// furthest next use and returns true, or returns false when every chunk is pinned. Within one
// launch the Engine asks again and again while the chunks passed stay pinned or leave, so the
// scan resumes below `*hint` when `*hint_valid` (the caller clears it at each launch).
template <class Set>
bool furthest_unpinned(const Set& resident, const VictimQuery& query, typename Set::value_type* hint, bool* hint_valid,
                       ChunkIndex* victim) {
  auto it = *hint_valid ? std::make_reverse_iterator(resident.upper_bound(*hint)) : resident.rbegin();
  for (; it != resident.rend(); ++it) {
    if (!query.pinned(it->second)) {
      *victim = it->second;
      *hint = *it;
      *hint_valid = true;
      return true;
    }
  }
  return false;
}

}  // namespace spillway
