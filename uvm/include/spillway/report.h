// The statistics report printed at exit (SPILLWAY_LOG=info) and written as JSON
// (SPILLWAY_REPORT=path).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "spillway/engine.h"

namespace spillway {

// The Engine's move calls in one line: "H2D N (median B, p90 B), R per launch; D2H N (median
// B, p90 B)" — calls to Backend::prefetch per direction, their bytes (CallSizes::quantile) and
// H2D calls per launch seen. The shim's report and `spillway replay` print it.
std::string describe_calls(const Stats& stats);
// The exit line (SPILLWAY_SUMMARY, printed at the default log level): wall time, policy,
// peak managed bytes and how far over the budget, bytes prefetched and evicted, page faults
// where fault feedback counted them, allocations refused by the cap. One line, no newline;
// `wall_seconds` is the time since the shim loaded.
std::string exit_summary(const Stats& stats, double wall_seconds);
// A short human table, one "name  value" line per row, no trailing newline; with more than
// one device, a row per device after the totals.
std::string stats_table(const Stats& stats);
// The same figures as JSON: {"policy": ..., "allocations": {...}, "bytes": {...}, ...,
// "devices": [{"device": ordinal, "launches", ..., "bytes": {...}}, ...]} (the top level's
// figures are the sums over "devices", except "launches", which also counts the launches no
// device planned (launches_other_device), and "outside_device_peak", the sum of each device's
// peak: an upper bound of the peak of the sum); byte counts are integers in bytes. "calls":
// {"h2d": {"calls", "bytes_median", "bytes_p90"}, "d2h": {...}} (describe_calls()).
nlohmann::json stats_json(const Stats& stats);
// Writes stats_json() to `path` (replacing it). Returns an empty string, or a one-line
// error naming the file and the reason. Never throws.
std::string write_report(const std::string& path, const Stats& stats);

}  // namespace spillway
