#include "sweep_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "helper_scripts.h"
#include "policy_registry.h"
#include "spillway/output_file.h"
#include "spillway/size.h"

namespace spillway::cli {

namespace {

// The cell a row belongs to: the rows of one cell differ only in their policy.
using CellKey = std::tuple<std::string, std::string, std::string, std::uint64_t>;
CellKey cell_of(const sim::CellResult& r) { return {r.trace, r.allocator, r.link, r.capacity_bytes}; }

double ratio(std::uint64_t a, std::uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); }

// "-" for a ratio that cannot be given (0), else two decimals.
std::string ratio_text(double x) { return x == 0.0 ? std::string("-") : fmt::format("{:.2f}", x); }

// A policy a program can run under the shim (not the oracle, which knows the future).
bool runnable(const std::string& policy_spec) {
  const std::string_view name = std::string_view(policy_spec).substr(0, policy_spec.find(':'));
  const auto& names = policy_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A CSV field: quoted (quotes doubled) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string out = "\"";
  for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Calls per launch; 0 for a trace without launches.
double calls_per_launch(std::uint64_t calls, std::uint64_t launches) {
  return launches == 0 ? 0.0 : static_cast<double>(calls) / static_cast<double>(launches);
}

}  // namespace

std::string seconds(std::uint64_t ns) { return fmt::format("{:.3f} s", ns / 1e9); }
std::string gbytes(std::uint64_t b) { return fmt::format("{:.1f}", b / 1e9); }

std::vector<double> speedups_vs_demand(const std::vector<sim::CellResult>& rows) {
  std::map<CellKey, std::uint64_t> demand_ns;
  for (const auto& r : rows) {
    if (r.policy == "demand") demand_ns.emplace(cell_of(r), r.sim.time_ns);
  }
  std::vector<double> out;
  out.reserve(rows.size());
  for (const auto& r : rows) {
    const auto it = demand_ns.find(cell_of(r));
    out.push_back(it == demand_ns.end() ? 0.0 : ratio(it->second, r.sim.time_ns));
  }
  return out;
}

double slowdown_vs_unlimited(const sim::CellResult& row) { return ratio(row.sim.time_ns, row.sim.compute_ns); }

void print_table(std::ostream& out, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups) {
  auto capacity = [](const sim::CellResult& r) { return fmt::format("{} ({:.3f})", format_bytes(r.capacity_bytes), r.capacity_frac); };
  // (Each text column as wide as its widest entry, so that every row lines up with the header.)
  std::size_t tw = 5, cw = 8, pw = 6, aw = 9, lw = 4;
  for (const auto& r : rows) {
    tw = std::max(tw, r.trace.size());
    cw = std::max(cw, capacity(r).size());
    pw = std::max(pw, r.policy.size());
    aw = std::max(aw, r.allocator.size());
    lw = std::max(lw, r.link.size());
  }
  constexpr std::string_view kLine = "{:<{}}  {:>{}}  {:<{}}  {:<{}}  {:<{}}  {:>11}  {:>7}  {:>7}  {:>7}  {:>8}  {:>8}  {:>10}  {:>8}\n";
  out << fmt::format(kLine, "trace", tw, "capacity", cw, "policy", pw, "allocator", aw, "link", lw, "time", "xdemand", "xbound",
                     "xunlim", "H2D GB", "D2H GB", "faults", "pf acc");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::CellResult& r = rows[i];
    std::string acc = r.sim.prefetch_bytes == 0 ? std::string("-")
                                                : fmt::format("{:.1f}%", 100.0 * r.sim.prefetch_used_bytes / r.sim.prefetch_bytes);
    out << fmt::format(kLine, r.trace, tw, capacity(r), cw, r.policy, pw, r.allocator, aw, r.link, lw, seconds(r.sim.time_ns),
                       ratio_text(speedups[i]), ratio_text(ratio(r.sim.time_ns, r.bound_ns)), ratio_text(slowdown_vs_unlimited(r)),
                       gbytes(r.sim.h2d_bytes), gbytes(r.sim.d2h_bytes), r.sim.faults, acc);
  }
}

namespace {

// (trace, allocator, link) -> capacity -> the index of the fastest runnable row; groups in
// sweep order.
struct Fastest {
  using Group = std::tuple<std::string, std::string, std::string>;
  std::vector<Group> order;
  std::map<Group, std::map<std::uint64_t, std::size_t>> cells;
};

Fastest fastest_runnable(const std::vector<sim::CellResult>& rows) {
  Fastest f;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::CellResult& r = rows[i];
    if (!runnable(r.policy)) continue;
    const auto group = std::make_tuple(r.trace, r.allocator, r.link);
    auto [it, fresh] = f.cells.try_emplace(group);
    if (fresh) f.order.push_back(group);
    auto [cell, first] = it->second.try_emplace(r.capacity_bytes, i);
    if (!first && r.sim.time_ns < rows[cell->second].sim.time_ns) cell->second = i;
  }
  return f;
}

}  // namespace

void print_best(std::ostream& out, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups) {
  const Fastest f = fastest_runnable(rows);
  for (const auto& group : f.order) {
    std::string line = fmt::format("best on {} ({}, {}):", std::get<0>(group), std::get<1>(group), std::get<2>(group));
    const char* sep = " ";
    // (Largest capacity first, as the user reads from "a little short" to "far short".)
    const auto& cells = f.cells.at(group);
    for (auto it = cells.rbegin(); it != cells.rend(); ++it, sep = "; ") {
      const sim::CellResult& r = rows[it->second];
      const std::string vs = speedups[it->second] == 0.0 ? std::string("demand not swept")
                                                         : fmt::format("{:.2f}x faster than demand", speedups[it->second]);
      line += fmt::format("{}at {:.3f} {}, {}", sep, r.capacity_frac, r.policy, vs);
    }
    out << line << '\n';
  }
}

void print_recommendations(std::ostream& out, const std::vector<sim::CellResult>& rows) {
  const Fastest f = fastest_runnable(rows);
  for (const auto& group : f.order) {
    const auto& cells = f.cells.at(group);
    // The policy as the sweep was given it (a name, or NAME:KEY=VALUE,...), so that tunables
    // left at their defaults resolve on the user's machine as they did in the sweep.
    std::map<std::string, std::size_t> wins;  // policy -> capacities it was fastest at
    for (const auto& [capacity, i] : cells) ++wins[rows[i].policy];
    std::string pick = rows[cells.begin()->second].policy;
    for (const auto& [policy, n] : wins) {
      if (n > wins.at(pick)) pick = policy;
    }
    out << fmt::format("recommended for {} ({}, {}): spillway run --policy '{}' (fastest at {} of {} capacities)\n",
                       std::get<0>(group), std::get<1>(group), std::get<2>(group), pick, wins.at(pick), cells.size());
  }
}

const std::string& sweep_csv_header() {
  // bound_ns: the two-direction bound (spillway/sim/bound.h); h2d_bound_ns: the bound before
  // it, max(compute, MIN_H2D / B_h2d); cut_bound_ns: the cut bound alone.
  static const std::string header =
      "trace,policy,allocator,link,capacity_bytes,capacity_frac,time_ns,compute_ns,bound_ns,h2d_bytes,d2h_bytes,faults,"
      "prefetch_bytes,prefetch_used_bytes,h2d_bound_ns,cut_bound_ns,h2d_call_bytes_median,h2d_call_bytes_p90,"
      "d2h_call_bytes_median,d2h_call_bytes_p90,h2d_calls_per_launch,policy_params,speedup_vs_demand,"
      "slowdown_vs_unlimited";
  return header;
}

void write_csv(const std::string& path, const std::vector<sim::CellResult>& rows, const std::vector<double>& speedups) {
  OutputFile out(path);
  out.write(sweep_csv_header());
  out.write("\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::CellResult& r = rows[i];
    // (policy and policy_params hold commas when tunables are given: quoted, RFC 4180.)
    const CallSizes& in = r.engine.h2d_calls;
    const CallSizes& out_calls = r.engine.d2h_calls;
    // (A ratio that cannot be given is an empty field.)
    auto field = [](double x) { return x == 0.0 ? std::string() : fmt::format("{:.4f}", x); };
    out.write(fmt::format("{},{},{},{},{},{:.4f},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{},{},{}\n", r.trace,
                          csv_field(r.policy), r.allocator, r.link, r.capacity_bytes, r.capacity_frac, r.sim.time_ns,
                          r.sim.compute_ns, r.bound_ns, r.sim.h2d_bytes, r.sim.d2h_bytes, r.sim.faults, r.sim.prefetch_bytes,
                          r.sim.prefetch_used_bytes, r.h2d_bound_ns, r.cut_bound_ns, in.quantile(0.5), in.quantile(0.9),
                          out_calls.quantile(0.5), out_calls.quantile(0.9), calls_per_launch(in.calls(), r.engine.launches),
                          csv_field(r.policy_params), field(speedups[i]), field(slowdown_vs_unlimited(r))));
  }
  out.close();
}

namespace {

// Plots the CSV at `csv` to `plot` with scripts/plot_sweep.py; removes `tmp_csv` (when not
// empty) once the script has run.
void plot_sweep(const std::string& plot, const std::string& csv, const std::string& tmp_csv) {
  std::string script = find_helper_script("plot_sweep.py", "SPILLWAY_PLOT_SCRIPT");
  if (script.empty()) throw std::runtime_error("cannot find scripts/plot_sweep.py (set SPILLWAY_PLOT_SCRIPT)");
  const std::string python = helper_python();
  std::string cmd = fmt::format("{} {} {} {}", shell_quote(python), shell_quote(script), shell_quote(csv), shell_quote(plot));
  int rc = std::system(cmd.c_str());
  if (!tmp_csv.empty()) std::filesystem::remove(tmp_csv);
  if (rc != 0) {  // (the script said why on stderr; the table and the CSV are written)
    throw std::runtime_error(fmt::format("--plot {}: {} {} failed (its message is above)", plot, python, script));
  }
  std::cout << "plot: " << plot << '\n';
}

}  // namespace

void write_sweep_files(const std::string& csv_path, const std::string& plot, const std::vector<sim::CellResult>& results,
                       const std::vector<double>& speedups) {
  std::string csv = csv_path;
  std::string tmp_csv;
  if (!plot.empty() && csv.empty()) {
    tmp_csv = (std::filesystem::temp_directory_path() / fmt::format("spillway-sweep-{}.csv", getpid())).string();
    csv = tmp_csv;
  }
  if (!csv.empty()) write_csv(csv, results, speedups);
  if (!csv_path.empty()) std::cout << "CSV: " << csv_path << '\n';
  if (!plot.empty()) plot_sweep(plot, csv, tmp_csv);
}

void write_calls(const std::string& path, const std::vector<sim::MoveCall>& calls, const sim::LinkProfile& link) {
  OutputFile out(path);
  for (const sim::MoveCall& c : calls) {
    const auto flat = static_cast<std::uint64_t>(std::ceil(sim::call_ns(link, c.to, kChunkBytes))) * c.copied_chunks;
    out.write(fmt::format("{{\"to\": \"{}\", \"offset\": {}, \"bytes\": {}, \"copied_chunks\": {}, \"issue_ns\": {}, "
                          "\"charged_ns\": {}, \"flat_ns\": {}, \"batch\": {}}}\n",
                          c.to == Location::gpu ? "gpu" : "cpu", c.offset, c.bytes, c.copied_chunks, c.issue_ns, c.charged_ns,
                          flat, c.batch));
  }
  out.close();
}

std::string describe_ranges(const sim::CompiledTrace& t) {
  std::uint64_t chunks = 0;
  for (const auto& [first, n] : t.ranges) chunks += n;
  const std::uint64_t bytes = chunks * kChunkBytes;
  return fmt::format("sub-allocator: {} ranges, {} of managed memory for a peak footprint of {} ({:.1f}% more)\n", t.ranges.size(),
                     format_bytes(bytes), format_bytes(t.peak_bytes),
                     t.peak_bytes == 0 ? 0.0 : 100.0 * (double(bytes) / double(t.peak_bytes) - 1.0));
}

}  // namespace spillway::cli
