// What `spillway sweep` prints and writes: the table, the answer to "how much faster than
// plain unified memory, and which policy?", and the CSV (docs/simulator.md, "The sweep").
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "spillway/sim/simulator.h"

namespace spillway::cli {

// The table's units, shared with `spillway replay`'s lines: "12.345 s" from nanoseconds, and
// "1.2" (GB, 10^9 bytes) from bytes.
std::string seconds(std::uint64_t ns);
std::string gbytes(std::uint64_t bytes);

// For each row, the time of `demand` (the driver's demand paging alone: plain unified
// memory) in the same cell — trace, allocator view, link, capacity — divided by the row's
// time: how many times faster than demand. 0 where demand was not swept in that cell or a
// time is 0. Pure.
std::vector<double> speedups_vs_demand(const std::vector<sim::CellResult>& rows);

// The row's time divided by its compute time (its time with unlimited GPU memory: no
// transfer ever waited for). 0 for a trace without kernel time. Pure.
double slowdown_vs_unlimited(const sim::CellResult& row);

// The table, one line per cell; `speedups` is speedups_vs_demand(rows).
void print_table(std::ostream& out, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups);

// One line per trace (per allocator view and link where several were swept): at each
// capacity, the fastest policy a program can run (the oracle is left out: it knows the
// future) and how many times faster than demand it is.
void print_best(std::ostream& out, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups);

// One line per trace (per allocator view and link where several were swept): the runnable
// policy that was fastest in most of the trace's capacities (a tie: the one fastest at the
// smallest capacity), as the sweep was given it (a name or NAME:KEY=VALUE,...), which is what
// `spillway run --policy` takes:
//   recommended for T (none, pcie5): spillway run --policy 'learned' (fastest at 2 of 2 capacities)
void print_recommendations(std::ostream& out, const std::vector<sim::CellResult>& rows);

// The files a sweep writes: the CSV to `csv` (when not empty) and, with `plot` not empty, the
// plot of it (scripts/plot_sweep.py; from a temporary CSV when `csv` is empty), each named on
// standard output. Throws std::runtime_error when a file cannot be written or the plot script
// is missing or fails (its own message is on stderr).
void write_sweep_files(const std::string& csv, const std::string& plot, const std::vector<sim::CellResult>& results,
                       const std::vector<double>& speedups);

// The CSV's first line (its column names), without the newline.
const std::string& sweep_csv_header();

// The CSV (columns: docs/simulator.md). Throws std::runtime_error "cannot write PATH:
// REASON" (OutputFile) on any failure.
void write_csv(const std::string& path, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups);

// (replay --calls) Writes the move calls as JSON lines, one call a line: `to` ("gpu" or
// "cpu"), `offset` of its range from the trace's arena base and `bytes` (bytes),
// `copied_chunks`, `issue_ns`, `charged_ns` (the copy time the simulator charged) and
// `flat_ns` (the same chunks as 2 MiB calls on `link`) and `batch` (the batched prefetch the
// range belonged to, numbered from 1; 0: a call of its own); spillway-linkbench --schedule
// reads them in this key order. Throws std::runtime_error "cannot write PATH: REASON".
void write_calls(const std::string& path, const std::vector<sim::MoveCall>& calls, const sim::LinkProfile& link);

// (replay, `spillway` view) One line: the sub-allocator's ranges, the managed bytes they took
// and how much more that is than the trace's peak footprint (fragmentation), e.g.
//   sub-allocator: 12 ranges, 42.75 GiB of managed memory for a peak footprint of 42.62 GiB (0.3% more)
std::string describe_ranges(const sim::CompiledTrace& t);

}  // namespace spillway::cli
