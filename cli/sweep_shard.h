// A sweep split over several machines (docs/simulator.md, "Sweeps on several machines"):
// `spillway sweep --shard K/N` runs part K of N, and `spillway merge` joins the parts' CSVs
// into the CSV the whole sweep writes.
//
// A sweep's rows come in table order: traces, then links, capacities, allocator views, then
// policies. A group is one (trace, link, capacity, view): its policies share one lower bound
// and `demand`'s time (speedup_vs_demand), so a group is never split. Shard K of N runs the
// K-th of N contiguous stretches of groups, whose sizes differ by at most one; the shards'
// CSVs given to `merge` in the order 1..N are the whole sweep's CSV, byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "parse_errors.h"  // UsageError

namespace spillway::cli {

// Part `index` (1-based) of `count`.
struct Shard {
  std::size_t index = 1, count = 1;
};

// "K/N", 1 <= K <= N <= 1 000 000; empty: 1/1 (the whole sweep). Throws UsageError naming the
// value and the form accepted.
Shard parse_shard(const std::string& text);

// The groups [first, end) of `groups` that shard `s` runs: the s.index-th of s.count
// contiguous stretches, their sizes differing by at most one (empty when there are fewer
// groups than shards). Pure.
std::pair<std::size_t, std::size_t> shard_groups(Shard s, std::size_t groups);

// `spillway merge --csv OUT IN...`: the rows of the sweep CSVs `inputs`, in the order given,
// under one header, written to `output` (created or replaced whole: spillway/output_file.h).
// Throws UsageError for an input that cannot be read, whose first line is not the sweep's
// CSV header (`header`, without its newline), or that repeats a cell (trace, policy, view,
// link, capacity) an earlier row holds, naming the file and line; std::runtime_error when
// `output` cannot be written. Returns the number of rows written.
std::size_t merge_sweep_csvs(const std::vector<std::string>& inputs, const std::string& output, const std::string& header);

}  // namespace spillway::cli
