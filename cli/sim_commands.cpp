#include "sim_commands.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "policies.h"
#include "spillway/output_file.h"
#include "spillway/report.h"
#include "spillway/sim/simulator.h"
#include "spillway/size.h"
#include "spillway/trace.h"
#include "policy_registry.h"
#include "helper_scripts.h"
#include "sweep_report.h"
#include "sweep_shard.h"

namespace spillway::cli {

namespace {

namespace fs = std::filesystem;

struct CapacitySpec {
  std::string text;
  double fraction = 0;       // of the peak footprint, when bytes == 0
  std::uint64_t bytes = 0;
};

std::vector<std::string> split(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    std::size_t start = 0;
    while (start <= item.size()) {
      std::size_t comma = item.find(',', start);
      if (comma == std::string::npos) comma = item.size();
      std::string part = item.substr(start, comma - start);
      if (!part.empty()) out.push_back(part);
      start = comma + 1;
    }
  }
  return out;
}

// "0.5" (a fraction of the peak footprint), "50%", or a size with a unit ("24GiB").
CapacitySpec parse_capacity(const std::string& text) {
  CapacitySpec c;
  c.text = text;
  if (!text.empty() && text.back() == '%') {
    try {
      std::size_t used = 0;
      double v = std::stod(text.substr(0, text.size() - 1), &used);
      if (used == text.size() - 1 && v > 0 && v <= 1000) {
        c.fraction = v / 100;
        return c;
      }
    } catch (...) {
    }
    throw UsageError{fmt::format("invalid capacity '{}': expected a fraction of the peak (0.5), a percentage (50%) or a size (24GiB)", text)};
  }
  bool plain = text.find_first_not_of("0123456789.") == std::string::npos;
  if (plain) {
    try {
      std::size_t used = 0;
      double v = std::stod(text, &used);
      if (used == text.size() && v > 0 && v <= 10) {
        c.fraction = v;
        return c;
      }
    } catch (...) {
    }
  } else if (auto b = parse_size(text); b && *b > 0) {
    if (*b < kChunkBytes) throw UsageError{fmt::format("invalid capacity '{}': at least 2MiB (one chunk)", text)};
    c.bytes = *b;
    return c;
  }
  throw UsageError{fmt::format("invalid capacity '{}': expected a fraction of the peak in (0, 10] (0.5), a percentage (50%) or a size (24GiB)", text)};
}

}  // namespace

struct SimCommands::Options {
  CLI::App* sweep = nullptr;
  CLI::App* replay = nullptr;
  std::vector<std::string> traces;
  std::vector<std::string> policies;
  std::vector<std::string> capacities;
  std::vector<std::string> allocators;
  std::string link;  // comma-separated; empty: sweep pcie5,h200, replay pcie5
  std::string csv, plot, timeline, calls, shard;
  bool breakdown = false;
  int jobs = 0;
  bool quiet = false;
  bool recommend = false;
  // Parameter overrides (unset: the link profile's / the model's default).
  std::optional<double> h2d_gbps, d2h_gbps, fault_batch_us, fault_slowdown, density, remote_eff;
  std::optional<std::uint32_t> fault_batch_size;
  std::string fault_granularity;
  std::string fault_feedback = "on";
  std::string call_shape = "on";
  std::string state_memory;
  // replay
  std::string replay_trace, replay_policy, replay_capacity;
  // merge
  CLI::App* merge = nullptr;
  std::vector<std::string> merge_inputs;
  std::string merge_csv;

  void add_model_options(CLI::App* cmd) {
    cmd->add_option("--link", link,
                    cmd == sweep ? "link profiles, comma-separated: pcie3, pcie4, pcie5, c2c (assumed figures), h200 (measured on "
                                   "an H200) [pcie5,h200: the assumed and the measured side by side]"
                                 : "link profile: pcie3, pcie4, pcie5, c2c (assumed figures), h200 (measured on an H200) [pcie5]");
    cmd->add_option("--h2d-bandwidth", h2d_gbps, "override the link's host-to-GPU bandwidth, GB/s (1e9 B/s)");
    cmd->add_option("--d2h-bandwidth", d2h_gbps, "override the link's GPU-to-host bandwidth, GB/s");
    cmd->add_option("--call-shape", call_shape,
                    "on or off: a move call of several chunks runs at the rate the link's measured call shape gives its "
                    "length (h200; the other profiles have none), or every chunk as a 2 MiB call [on]");
    cmd->add_option("--fault-batch-us", fault_batch_us, "cost of one fault batch, us [the link's: 45, G10/UVMSmart; h200 13.8, measured]");
    cmd->add_option("--fault-batch-size", fault_batch_size, "faults per batch [256: uvm_perf_fault_batch_count]");
    cmd->add_option("--fault-granularity", fault_granularity, "fault granularity [64KiB: UVM big page]");
    cmd->add_option("--fault-slowdown", fault_slowdown, "fault-driven migration is this many times slower than a prefetch [the link's: 10; h200 1.47, measured]");
    cmd->add_option("--density-threshold", density, "density prefetcher threshold, 0-1 [0.51: uvm_perf_prefetch_threshold]");
    cmd->add_option("--remote-efficiency", remote_eff, "remote (zero-copy) access at this share of H2D bandwidth [1.0]");
    cmd->add_option("--fault-feedback", fault_feedback,
                    "on or off: report each kernel's faults to the policy, as CUPTI does in the shim (learned learns the "
                    "extents of pointers into segments from them) [on]");
    cmd->add_option("--state-memory", state_memory,
                    "the policy's state budget, as SPILLWAY_STATE_MEMORY in the shim: a size of at least 16MiB, or "
                    "'unlimited' [256MiB]");
  }

  // The links asked for, each once; none asked: `fallback`, or pcie5 alone when a link's
  // figure is replaced (--h2d-bandwidth ...: one link's figures).
  std::vector<std::string> link_names(const char* fallback) const {
    const bool replaced = h2d_gbps || d2h_gbps || fault_batch_us || fault_slowdown;
    const std::string asked = !link.empty() ? link : replaced ? "pcie5" : fallback;
    std::vector<std::string> names;
    for (const std::string& n : split(std::vector<std::string>{asked})) {
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    if (names.size() > 1 && replaced) {
      throw UsageError{"--h2d-bandwidth, --d2h-bandwidth, --fault-batch-us and --fault-slowdown replace one link's figures: "
                       "give one --link"};
    }
    return names;
  }

  // The model's parameters on link `name`, with every option given.
  sim::SimParams params(const std::string& name) const {
    sim::SimParams p = sim::default_params();
    auto l = sim::find_link(name);
    if (!l) throw UsageError{fmt::format("unknown link '{}': expected pcie3, pcie4, pcie5, c2c or h200", name)};
    p.link = *l;
    p.fault_slowdown = l->fault_slowdown;
    override_link(p);
    override_driver(p);
    override_policy_inputs(p);
    return p;
  }

 private:
  // Each model parameter within a range where the model means something (and its
  // arithmetic cannot overflow): the name, the value and the accepted range on error.
  static double in_range(const char* what, double v, double lo, double hi, const char* unit) {
    if (!std::isfinite(v) || v < lo || v > hi) {
      throw UsageError{fmt::format("{} {} is out of range: expected {} to {}{}", what, v, lo, hi, unit)};
    }
    return v;
  }

  // The link's bandwidths, call shape and fault batch cost; a figure replaced says so in its source.
  void override_link(sim::SimParams& p) const {
    if (h2d_gbps) p.link.h2d_bytes_per_s = in_range("--h2d-bandwidth", *h2d_gbps, 0.01, 100000, " GB/s") * 1e9;
    if (d2h_gbps) p.link.d2h_bytes_per_s = in_range("--d2h-bandwidth", *d2h_gbps, 0.01, 100000, " GB/s") * 1e9;
    if (h2d_gbps || d2h_gbps) p.link.sources.bandwidth = "set by --h2d-bandwidth/--d2h-bandwidth";
    if (call_shape == "off") {
      p.link.calls = {};
      p.link.sources.calls = "off (--call-shape off): every chunk moves as a 2 MiB call";
    } else if (call_shape != "on") {
      throw UsageError{fmt::format("invalid --call-shape '{}': expected on or off", call_shape)};
    }
    if (fault_batch_us) {
      p.link.fault_batch_ns = static_cast<std::uint64_t>(in_range("--fault-batch-us", *fault_batch_us, 0, 1e6, " us") * 1e3);
      p.link.sources.fault_batch = "set by --fault-batch-us";
    }
  }

  // The driver's fault handling and remote access.
  void override_driver(sim::SimParams& p) const {
    if (fault_batch_size) {
      if (*fault_batch_size == 0) throw UsageError{"--fault-batch-size must be positive"};
      p.fault_batch_size = *fault_batch_size;
    }
    if (!fault_granularity.empty()) {
      auto g = parse_size(fault_granularity);
      if (!g || *g == 0 || *g > kChunkBytes) throw UsageError{fmt::format("invalid --fault-granularity '{}': a size from 1 B to 2MiB", fault_granularity)};
      p.fault_granularity_bytes = *g;
    }
    if (fault_slowdown) {
      p.fault_slowdown = in_range("--fault-slowdown", *fault_slowdown, 1, 1000, "");
      p.link.sources.fault_slowdown = "set by --fault-slowdown";
    }
    if (density) p.density_threshold = in_range("--density-threshold", *density, 0, 1, "");
    if (remote_eff) p.remote_efficiency = in_range("--remote-efficiency", *remote_eff, 0.001, 1, "");  // (above 1 a copy engine would move more than the link: the bound assumes it cannot)
  }

  // What the policy is given: fault feedback and its state budget.
  void override_policy_inputs(sim::SimParams& p) const {
    if (fault_feedback == "on") p.fault_feedback = true;
    else if (fault_feedback == "off") p.fault_feedback = false;
    else throw UsageError{fmt::format("invalid --fault-feedback '{}': expected on or off", fault_feedback)};
    if (!state_memory.empty()) {  // (the shim's own rule and message: spillway::parse_state_memory)
      Config c;
      if (std::string err = set_option(c, "SPILLWAY_STATE_MEMORY", state_memory, policy_names()); !err.empty()) {
        throw UsageError{"--state-memory: " + err};
      }
      p.state_memory_bytes = c.state_memory;
    }
  }
};

SimCommands::SimCommands(CLI::App& app) : o_(std::make_unique<Options>()) {
  Options& o = *o_;
  o.sweep = app.add_subcommand("sweep",
                               "Simulate traces under each policy at each GPU capacity and print time against the lower bound.");
  o.sweep->add_option("traces", o.traces, "trace files (spillway-trace v1, .jsonl or .jsonl.gz)")->required();
  o.sweep->add_option("--policy", o.policies,
                      "policies, comma-separated, each NAME or NAME:KEY=VALUE[,KEY=VALUE...] (spillway policies lists the "
                      "tunables) [demand,advise,sequential,correlation,learned,oracle]");
  o.sweep->add_option("--capacity", o.capacities,
                      "GPU capacities: fractions of the trace's peak footprint (0.5), percentages, or sizes (24GiB) [0.667,0.5]")
      ->delimiter(',');
  o.sweep->add_option("--allocator", o.allocators,
                      "allocator views, comma-separated: none (one block per trace id), pytorch (PyTorch's caching "
                      "allocator: segments, pointers into them, no frees), spillway (per-tensor mode over the shim's "
                      "sub-allocator: exact extents, small tensors sharing chunks), pytorch-exact (pytorch with true extents: "
                      "the ceiling of extent learning), pytorch-tracked (pytorch with PyTorch's allocator trace) [none]")
      ->delimiter(',');
  o.sweep->add_option("--csv", o.csv, "write the results as CSV to FILE");
  o.sweep->add_option("--plot", o.plot, "plot the speed-up over demand and time / bound against capacity to FILE.png or FILE.svg (matplotlib)");
  o.sweep->add_option("--jobs,-j", o.jobs, "simulations run in parallel [number of CPUs]")->check(CLI::Range(1, 1024));
  o.sweep->add_flag("--quiet,-q", o.quiet, "no progress line");
  o.sweep->add_flag("--recommend", o.recommend,
                    "after the table, per trace: the policy fastest in most of its capacities, as a --policy value for "
                    "spillway run");
  o.sweep->add_option("--shard", o.shard,
                      "run only part K of N of the cells (K/N: each job of an array runs one; spillway merge joins their "
                      "CSVs) [1/1]");
  o.add_model_options(o.sweep);

  o.replay = app.add_subcommand("replay", "Simulate one trace under one policy at one capacity; optionally write a timeline.");
  o.replay->add_option("trace", o.replay_trace, "trace file")->required();
  o.replay->add_option("--policy", o.replay_policy, "policy: NAME or NAME:KEY=VALUE[,KEY=VALUE...] [demand]");
  o.replay->add_option("--capacity", o.replay_capacity, "GPU capacity: fraction of the peak, percentage or size [0.5]");
  o.replay->add_option("--allocator", o.allocators, "allocator view: none, pytorch, spillway, pytorch-exact or pytorch-tracked [none]");
  o.replay->add_option("--timeline", o.timeline, "write a Chrome/Perfetto trace-event timeline (JSON) to FILE");
  o.replay->add_option("--calls", o.calls,
                       "write the Engine's move calls to FILE, one JSON object a line, for spillway-linkbench --schedule "
                       "(replays them on a GPU against the call costs charged here)");
  o.replay->add_flag("--breakdown", o.breakdown,
                     "print the time by what was busy (compute alone, H2D alone, D2H alone, overlaps); keeps the timeline in memory");
  o.add_model_options(o.replay);

  o.merge = app.add_subcommand("merge", "Join the CSVs of a sweep run in parts (spillway sweep --shard K/N), given in order 1..N.");
  o.merge->add_option("csvs", o.merge_inputs, "the parts' CSVs, in order")->required();
  o.merge->add_option("--csv", o.merge_csv, "write the whole sweep's CSV to FILE")->required();
}

SimCommands::~SimCommands() = default;

bool SimCommands::parsed() const { return o_->sweep->parsed() || o_->replay->parsed() || o_->merge->parsed(); }

namespace {

std::uint64_t capacity_bytes(const CapacitySpec& c, const sim::CompiledTrace& t) {
  if (c.bytes != 0) return c.bytes / kChunkBytes * kChunkBytes;
  std::uint64_t b = static_cast<std::uint64_t>(c.fraction * static_cast<double>(t.peak_bytes)) / kChunkBytes * kChunkBytes;
  if (b == 0) {
    throw UsageError{fmt::format("capacity '{}' of {} (peak {}) is less than one 2 MiB chunk", c.text, t.name,
                                 format_bytes(t.peak_bytes))};
  }
  return b;
}

// Each spec checked against its policy's tunables (prefetch/policy_registry.h): the first
// bad one ends the command with its one-line message.
void check_policies(const std::vector<std::string>& policies) {
  for (const std::string& p : policies) {
    std::string error;
    if (!parse_policy_spec(p, true, &error)) throw UsageError{"--policy: " + error};
  }
}

std::vector<std::string> policy_list(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given)
    for (std::string& p : split_policy_list(g)) out.push_back(std::move(p));
  return out;
}

// The allocator views asked for ([none] when none are), or a UsageError naming the bad one.
std::vector<sim::AllocatorView> parse_views(const std::vector<std::string>& texts) {
  std::vector<sim::AllocatorView> views;
  for (const std::string& t : split(texts)) {
    auto v = sim::parse_allocator_view(t);
    if (!v) throw UsageError{fmt::format("unknown allocator view '{}': expected none, pytorch, spillway, pytorch-exact or pytorch-tracked", t)};
    if (std::find(views.begin(), views.end(), *v) == views.end()) views.push_back(*v);
  }
  if (views.empty()) views.push_back(sim::AllocatorView::none);
  return views;
}

// Why reading `path` failed, for the exception being handled (call inside a catch): a
// TraceError names FILE:LINE itself (status 2); anything else — memory running out — is
// prefixed with the file (status 1). Never throws: it is what keeps an exception from
// leaving a worker thread.
struct ReadFailure {
  std::string message;  // empty: no failure
  int status = 0;
};
ReadFailure read_failure(const std::string& path) noexcept {
  try {
    try {
      throw;
    } catch (const trace::TraceError& e) {
      return {e.what(), 2};
    } catch (const std::bad_alloc&) {
      return {path + ": out of memory while reading the trace", 1};
    } catch (const std::exception& e) {
      return {path + ": " + e.what(), 1};
    } catch (...) {
      return {path + ": unknown error while reading the trace", 1};
    }
  } catch (...) {  // (building the message ran out of memory)
    return {"out of memory", 1};
  }
}

// Runs `work` on up to `threads` threads, this one included, and waits for them. A thread
// the system refuses is left out (the others take its share), so that no exception meets a
// joinable std::thread; `work` itself must catch everything it throws.
template <class Work>
void run_in_parallel(std::size_t threads, Work& work) {
  std::vector<std::thread> pool;
  try {
    for (std::size_t j = 1; j < threads; ++j) pool.emplace_back(std::ref(work));
  } catch (const std::exception&) {  // (std::system_error, std::bad_alloc: fewer threads)
  }
  work();
  for (auto& t : pool) t.join();
}

int run_sweep(SimCommands::Options& o);
int run_replay(SimCommands::Options& o);

}  // namespace

int SimCommands::run() {
  try {
    if (o_->merge->parsed()) {
      const std::size_t rows = merge_sweep_csvs(o_->merge_inputs, o_->merge_csv, sweep_csv_header());
      std::cout << fmt::format("merged {} rows from {} files into {}\n", rows, o_->merge_inputs.size(), o_->merge_csv);
      return 0;
    }
    return o_->sweep->parsed() ? run_sweep(*o_) : run_replay(*o_);
  } catch (const UsageError& e) {
    std::cerr << "spillway: " << e.message << '\n';
    return 2;
  } catch (const trace::TraceError& e) {
    std::cerr << "spillway: " << e.what() << '\n';
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "spillway: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "spillway: " << e.what() << '\n';
    return 1;
  }
}

namespace {

// What a sweep runs, from its options (each checked in this order): the policies, the
// capacities, the model's parameters, the views; on how many threads.
struct SweepPlan {
  std::vector<std::string> policies;
  std::vector<CapacitySpec> caps;
  std::vector<sim::SimParams> links;  // the model's parameters on each link swept
  unsigned jobs = 1;
  bool progress = false;
  std::vector<sim::AllocatorView> views;
  // The groups (trace, link, capacity, view) this run simulates, [first_group, end_group) in
  // table order (--shard; sweep_shard.h).
  std::size_t first_group = 0, end_group = 0;
  std::size_t groups_per_trace() const { return links.size() * caps.size() * views.size(); }
  bool runs_trace(std::size_t t) const {
    return t * groups_per_trace() < end_group && (t + 1) * groups_per_trace() > first_group;
  }
};

// Refuses, before a long run, an output path that cannot be opened for writing.
void check_output_path(const char* option, const std::string& path) {
  if (std::string why = path.empty() ? "" : why_not_writable(path); !why.empty()) {
    throw UsageError{fmt::format("{} {}", option, why)};
  }
}

// A capacity of the whole peak footprint or more oversubscribes nothing: a bare number meant
// as a size (--capacity 4) is the usual cause, so the warning says how to give one.
void warn_if_not_oversubscribed(const CapacitySpec& cap) {
  if (cap.bytes != 0 || cap.fraction < 1.0) return;
  const bool bare = cap.text.find_first_not_of("0123456789.") == std::string::npos;
  std::cerr << fmt::format("spillway sweep: warning: --capacity {} is {}x the trace's peak footprint: nothing is "
                           "oversubscribed{}\n", cap.text, cap.fraction, bare ? fmt::format(" (a size takes a unit: {}GiB)", cap.text) : "");
}

SweepPlan plan_sweep(const SimCommands::Options& o) {
  SweepPlan plan;
  plan.policies = policy_list(o.policies);
  if (plan.policies.empty()) for (auto n : sim_policy_names()) plan.policies.emplace_back(n);
  check_policies(plan.policies);
  std::vector<std::string> cap_text = split(o.capacities);
  if (cap_text.empty()) cap_text = {"0.667", "0.5"};
  for (const std::string& c : cap_text) {
    plan.caps.push_back(parse_capacity(c));
    warn_if_not_oversubscribed(plan.caps.back());
  }
  for (const std::string& name : o.link_names("pcie5,h200")) plan.links.push_back(o.params(name));
  if (!o.plot.empty() && !(o.plot.ends_with(".png") || o.plot.ends_with(".svg") || o.plot.ends_with(".pdf"))) {
    throw UsageError{fmt::format("--plot '{}': the file name must end in .png, .svg or .pdf", o.plot)};
  }
  check_output_path("--csv", o.csv);
  check_output_path("--plot", o.plot);
  plan.jobs = o.jobs > 0 ? static_cast<unsigned>(o.jobs) : std::max(1u, std::thread::hardware_concurrency());
  plan.progress = !o.quiet && isatty(STDERR_FILENO);
  plan.views = parse_views(o.allocators);
  std::tie(plan.first_group, plan.end_group) = shard_groups(parse_shard(o.shard), o.traces.size() * plan.groups_per_trace());
  return plan;
}

// The sweep's traces, compiled: every trace in the `none` view (its bound and capacities:
// the true accesses) and in each other view asked for.
struct SweepTraces {
  std::vector<std::unique_ptr<sim::CompiledTrace>> truth;        // per trace, the `none` view
  std::vector<const sim::CompiledTrace*> compiled;              // views[v] of trace t: [t * views + v]
  std::vector<std::unique_ptr<sim::CompiledTrace>> other_views;  // those of `compiled` not in `truth`
};

// Reads and compiles the traces (in parallel). Returns the exit status of the first error in
// trace order, its message on stderr, or 0.
int compile_traces(const std::vector<std::string>& paths, const SweepPlan& plan, SweepTraces& out) {
  const std::vector<sim::AllocatorView>& views = plan.views;
  out.truth.resize(paths.size());
  out.compiled.resize(paths.size() * views.size());
  out.other_views.resize(paths.size() * views.size());
  std::vector<ReadFailure> errors(paths.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < paths.size();) {
      if (!plan.runs_trace(i)) continue;  // (another shard's)
      try {
        // (Each view streams the file: the events are never all in memory.)
        out.truth[i] = std::make_unique<sim::CompiledTrace>(sim::compile_file(paths[i]));
        for (std::size_t v = 0; v < views.size(); ++v) {
          if (views[v] == sim::AllocatorView::none) {
            out.compiled[i * views.size() + v] = out.truth[i].get();
            continue;
          }
          out.other_views[i * views.size() + v] = std::make_unique<sim::CompiledTrace>(sim::compile_file(paths[i], views[v]));
          out.compiled[i * views.size() + v] = out.other_views[i * views.size() + v].get();
        }
      } catch (...) {
        errors[i] = read_failure(paths[i]);
      }
    }
  };
  run_in_parallel(std::min<std::size_t>(plan.jobs, paths.size()), work);
  for (const ReadFailure& e : errors) {
    if (e.status != 0) {
      std::cerr << "spillway: " << e.message << '\n';
      return e.status;
    }
  }
  return 0;
}

// One simulation of the sweep: indices into the traces, links, views, capacities and policies.
struct Cell {
  std::size_t trace, link, view, cap, policy;
};

// Runs a sweep's cells on plan.jobs threads, the costliest first; the results keep the
// table's order (traces, then links, capacities, views, policies).
class CellRunner {
 public:
  CellRunner(const SweepPlan& plan, const SweepTraces& traces) : plan_(plan), traces_(traces) {
    const std::size_t n = traces.truth.size(), links = plan.links.size(), caps = plan.caps.size(), views = plan.views.size();
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t l = 0; l < links; ++l)
        for (std::size_t c = 0; c < caps; ++c)
          for (std::size_t v = 0; v < views; ++v) {
            const std::size_t group = ((t * links + l) * caps + c) * views + v;
            if (group < plan.first_group || group >= plan.end_group) continue;
            for (std::size_t p = 0; p < plan.policies.size(); ++p) cells_.push_back({t, l, v, c, p});
          }
    bounds_ = std::vector<sim::LowerBound>(n * links * caps);
    view_bounds_ = std::vector<sim::LowerBound>(n * links * caps * views);
    bound_once_ = std::vector<std::once_flag>(n * links * caps);
    view_once_ = std::vector<std::once_flag>(n * links * caps * views);
    results_.resize(cells_.size());
  }

  std::size_t cells() const { return cells_.size(); }
  // Runs every cell; rethrows on this thread what the first failing cell threw.
  std::vector<sim::CellResult> run();

 private:
  const sim::CompiledTrace& viewed(const Cell& c) const { return *traces_.compiled[c.trace * plan_.views.size() + c.view]; }
  std::vector<std::size_t> costliest_first() const;
  void run_one(std::size_t i);

  const SweepPlan& plan_;
  const SweepTraces& traces_;
  std::vector<Cell> cells_;
  // The bound of each (trace, link, capacity), shared by its policies: that of the `none` view (the
  // true accesses), and under a view that places several tensors in one chunk the smaller of
  // it and the bound of that view's placement (sim::view_bound).
  std::vector<sim::LowerBound> bounds_, view_bounds_;
  std::vector<std::once_flag> bound_once_, view_once_;
  std::vector<sim::CellResult> results_;
  std::atomic<std::size_t> done_{0};
  std::mutex print_mutex_;
};

// The costliest cells first (more chunk touches; oracle and correlation do the most work per
// touch) so that no long cell is left alone at the end.
std::vector<std::size_t> CellRunner::costliest_first() const {
  std::vector<std::size_t> order(cells_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto cost = [&](const Cell& c) {
    const std::string& p = plan_.policies[c.policy];
    double weight = p == "oracle" ? 4 : p == "correlation" || p == "learned" ? 2.5 : p == "sequential" ? 1.5 : 1;
    return static_cast<double>(viewed(c).touches.size()) * weight;
  };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost(cells_[a]) > cost(cells_[b]); });
  return order;
}

void CellRunner::run_one(std::size_t i) {
  const Cell& cell = cells_[i];
  const sim::CompiledTrace& truth = *traces_.truth[cell.trace];  // the `none` view: bound and capacity
  const sim::CompiledTrace& t = viewed(cell);
  sim::SimParams p = plan_.links[cell.link];
  std::size_t key = (cell.trace * plan_.links.size() + cell.link) * plan_.caps.size() + cell.cap;
  p.capacity_bytes = capacity_bytes(plan_.caps[cell.cap], truth);
  std::call_once(bound_once_[key], [&] { bounds_[key] = sim::lower_bound(truth, p); });
  const std::size_t vkey = key * plan_.views.size() + cell.view;
  std::call_once(view_once_[vkey], [&] { view_bounds_[vkey] = sim::view_bound(bounds_[key], t, p); });
  results_[i] = sim::run_cell(t, plan_.policies[cell.policy], p, nullptr, &view_bounds_[vkey]);
  std::size_t finished = ++done_;
  if (plan_.progress) {
    std::lock_guard lock(print_mutex_);
    std::cerr << fmt::format("\r\033[Kspillway sweep: {}/{} cells ({} {} {})", finished, cells_.size(), t.name,
                             plan_.policies[cell.policy], plan_.caps[cell.cap].text)
              << std::flush;
  }
}

std::vector<sim::CellResult> CellRunner::run() {
  const std::vector<std::size_t> order = costliest_first();
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  // (Everything a cell throws is caught here and rethrown on this thread after the join.)
  auto work = [&] {
    for (std::size_t n; (n = next++) < cells_.size();) {
      try {
        run_one(order[n]);
      } catch (...) {
        next = cells_.size();
        std::lock_guard lock(print_mutex_);
        if (!failure) failure = std::current_exception();
        return;
      }
    }
  };
  run_in_parallel(std::min<std::size_t>(plan_.jobs, cells_.size()), work);
  if (plan_.progress) std::cerr << "\r\033[K" << std::flush;
  if (failure) std::rethrow_exception(failure);
  return std::move(results_);
}

int run_sweep(SimCommands::Options& o) {
  auto start = std::chrono::steady_clock::now();
  const SweepPlan plan = plan_sweep(o);
  SweepTraces traces;
  if (int status = compile_traces(o.traces, plan, traces); status != 0) return status;
  CellRunner runner(plan, traces);
  const std::vector<sim::CellResult> results = runner.run();
  const std::vector<double> speedups = speedups_vs_demand(results);
  std::string names;
  for (const sim::SimParams& p : plan.links) {
    std::cout << sim::describe_link(p.link, p.fault_slowdown);
    names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", p.link.name, sim::is_measured(p.link) ? "measured" : "assumed figures");
  }
  print_table(std::cout, results, speedups);
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("{} simulations on {} in {:.2f} s wall, {} jobs; capacity = the simulated GPU's memory (fraction of "
                           "the trace's peak footprint), xdemand = how many times faster than "
                           "demand (plain unified memory), xbound = time / the two-direction lower bound (docs/simulator.md), "
                           "xunlim = time / compute (how many times slower than with unlimited GPU memory), pf acc = the "
                           "prefetched chunks a kernel used\n",
                           runner.cells(), names, wall, plan.jobs);
  print_best(std::cout, results, speedups);
  if (o.recommend) print_recommendations(std::cout, results);
  write_sweep_files(o.csv, o.plot, results, speedups);
  return 0;
}

int run_replay(SimCommands::Options& o) {
  std::string policy = o.replay_policy.empty() ? "demand" : o.replay_policy;
  check_policies({policy});
  CapacitySpec cap = parse_capacity(o.replay_capacity.empty() ? "0.5" : o.replay_capacity);
  const std::vector<std::string> links = o.link_names("pcie5");
  if (links.size() != 1) throw UsageError{"replay takes one --link (spillway sweep runs several)"};
  sim::SimParams p = o.params(links[0]);
  std::vector<sim::AllocatorView> views = parse_views(o.allocators);
  if (views.size() != 1) throw UsageError{"replay takes one --allocator view"};
  check_output_path("--timeline", o.timeline);
  check_output_path("--calls", o.calls);
  sim::CompiledTrace truth = sim::compile_file(o.replay_trace);
  sim::CompiledTrace viewed = views[0] == sim::AllocatorView::none ? sim::CompiledTrace{} : sim::compile_file(o.replay_trace, views[0]);
  const sim::CompiledTrace& t = views[0] == sim::AllocatorView::none ? truth : viewed;
  p.capacity_bytes = capacity_bytes(cap, truth);
  const sim::LowerBound bound = sim::view_bound(sim::lower_bound(truth, p), t, p);
  std::vector<sim::Span> spans;  // (kept only when asked for: they grow with the trace)
  const bool keep_spans = !o.timeline.empty() || o.breakdown || !o.calls.empty();
  sim::CellResult r = sim::run_cell(t, policy, p, keep_spans ? &spans : nullptr, &bound);
  std::cout << sim::describe_link(p.link, p.fault_slowdown);
  print_table(std::cout, {r}, {0.0});
  const auto& s = r.sim;
  std::cout << fmt::format(
      "kernels {}, compute {}, peak footprint {}; stalls: faults {} ({} batches), waiting for prefetches {}\n"
      "prefetched {} GB ({} GB used), read remotely {} GB, driver evictions {} chunks, engine evictions {} chunks\n"
      "lower bound {} (cut bound {} over {} cuts; H2D bound {}: MIN's {} misses, {} GB over the link)\n",
      t.kernel_count, seconds(t.compute_ns), format_bytes(t.peak_bytes), seconds(s.fault_stall_ns), s.fault_batches,
      seconds(s.wait_ns), gbytes(s.prefetch_bytes), gbytes(s.prefetch_used_bytes), gbytes(s.remote_bytes), s.driver_evictions,
      r.engine.evicted_chunks, seconds(r.bound_ns), seconds(r.cut_bound_ns), bound.cut.cuts.size(), seconds(r.h2d_bound_ns),
      r.min_fetch.chunks, gbytes(r.min_fetch.bytes));
  std::cout << describe_calls(r.engine) << "\n";
  if (views[0] == sim::AllocatorView::spillway) std::cout << describe_ranges(t);
  if (o.breakdown) std::cout << "time by what was busy: " << sim::describe(sim::breakdown(spans)) << "\n";
  if (!o.calls.empty()) {
    write_calls(o.calls, r.calls, p.link);
    std::cout << "calls: " << o.calls << " (" << r.calls.size() << " move calls)\n";
  }
  if (!o.timeline.empty()) {
    sim::write_timeline(o.timeline, t, r, spans);
    std::cout << "timeline: " << o.timeline << " (" << spans.size() << " spans; open in ui.perfetto.dev)\n";
  }
  return 0;
}

}  // namespace

}  // namespace spillway::cli
