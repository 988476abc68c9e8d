#include "spillway/report.h"

#include <fmt/format.h>

#include <vector>

#include "spillway/output_file.h"
#include "spillway/size.h"

namespace spillway {

namespace {

// Why what the Engine asked to prefetch and what the driver migrated differ: a prefetch of
// pages already on the GPU, or of pages never written (populated where they are, no copy),
// moves nothing that CUPTI counts (CUDA Runtime API, cudaMemPrefetchAsync: memory not yet
// populated "will be populated and mapped on the destination device"); a fault migrates
// bytes no prefetch asked for.
constexpr const char* kWhyAskedAndMigratedDiffer = "pages already resident or never written move nothing; faults migrate too";

// The driver's migrations were counted: fault feedback is on (CUPTI's unified-memory records
// in the shim, the simulator's own count there), or was on for a while and counted some.
bool migrations_counted(const Stats& s) {
  return !s.fault_feedback.starts_with("off") || s.migrated_to_gpu_bytes != 0 || s.migrated_to_host_bytes != 0;
}

// Where launches' extents come from under a framework's own allocator (docs/configuration.md,
// "When to use keep"): its allocator trace, else fault feedback, else the argument scan alone.
const char* extent_truth(const Stats& s) {
  if (s.framework_trace.starts_with("off: per-tensor")) return "per-tensor";
  if (s.framework_trace.starts_with("attached") || s.framework_trace == "simulator") return "allocator trace";
  return s.fault_feedback.starts_with("off") ? "argument scan" : "fault feedback";
}

std::string describe_extent_truth(const Stats& s) {
  const std::string truth = extent_truth(s);
  if (truth == "allocator trace") {
    return fmt::format("allocator trace ({}): {} segments, {} live tensors, {} tensor allocations, {} events refused",
                       s.framework_trace, s.framework_segments, s.framework_tensors, s.framework_tensor_allocs,
                       s.framework_events_refused);
  }
  return fmt::format("{} (allocator trace {}; fault feedback {})", truth, s.framework_trace, s.fault_feedback);
}

}  // namespace

std::string describe_calls(const Stats& s) {
  auto one = [](const CallSizes& c) {
    return fmt::format("{} (median {}, p90 {})", c.calls(), format_bytes(c.quantile(0.5)), format_bytes(c.quantile(0.9)));
  };
  const double per_launch = s.launches == 0 ? 0.0 : static_cast<double>(s.h2d_calls.calls()) / static_cast<double>(s.launches);
  const std::string batches = s.h2d_batches == 0 ? "" : fmt::format(" ({} of them in {} batches)", s.h2d_batched_ranges, s.h2d_batches);
  return fmt::format("H2D {}{}, {:.2f} per launch; D2H {}", one(s.h2d_calls), batches, per_launch, one(s.d2h_calls));
}

std::string exit_summary(const Stats& s, double wall_seconds) {
  const std::string over = s.peak_over_budget_bytes == 0
                               ? fmt::format("within the {} budget", format_bytes(s.budget_bytes))
                               : fmt::format("{} over the {} budget", format_bytes(s.peak_over_budget_bytes),
                                             format_bytes(s.budget_bytes));
  const bool counted = s.fault_feedback != "off" && !s.fault_feedback.starts_with("off:");
  const std::string faults =
      counted ? fmt::format("{} page faults", s.fault_records) : std::string("page faults not counted (fault feedback off)");
  std::string refused;
  if (s.allocations_refused > 0) {
    refused = fmt::format("; {} allocations refused by SPILLWAY_MAX_MANAGED = {}", s.allocations_refused,
                          format_bytes(s.max_managed_bytes));
  }
  return fmt::format("{:.1f} s, policy {}: peak {} managed, {}; prefetched {}, evicted {}; {}{} (SPILLWAY_LOG=info: the table)",
                     wall_seconds, s.policy, format_bytes(s.peak_managed_bytes), over, format_bytes(s.prefetch_to_gpu_bytes),
                     format_bytes(s.evict_to_cpu_bytes), faults, refused);
}

std::string stats_table(const Stats& s) {
  std::string out;
  auto row = [&out](std::string_view name, const std::string& value) {
    if (!out.empty()) out += '\n';
    out += fmt::format("  {:<28} {}", name, value);
  };
  out = fmt::format("report (policy {})", s.policy);
  row("allocations redirected", fmt::format("{}", s.allocations_redirected));
  row("allocations passed through", fmt::format("{} ({} excluded)", s.allocations_passed_through, s.allocations_excluded));
  row("allocations refused (cap)", fmt::format("{}", s.allocations_refused));
  row("frees", fmt::format("{} ({} stream-ordered)", s.frees, s.frees_deferred));
  row("peak managed", format_bytes(s.peak_managed_bytes));
  row("peak over budget", format_bytes(s.peak_over_budget_bytes));
  row("budget / managed cap", fmt::format("{} / {}", format_bytes(s.budget_bytes), format_bytes(s.max_managed_bytes)));
  if (s.outside_device_peak_bytes > 0) {
    row("other device memory", fmt::format("{} now, {} peak (budget {} at start)", format_bytes(s.outside_device_bytes),
                                           format_bytes(s.outside_device_peak_bytes), format_bytes(s.start_budget_bytes)));
  }
  if (s.launches_other_device > 0) {
    row("launches on other devices", fmt::format("{} of {} (left to the driver)", s.launches_other_device, s.launches));
  }
  // What the Engine asked to move and what the driver moved (kWhyAskedAndMigratedDiffer).
  row("prefetched to GPU", s.migrated_to_gpu_bytes == 0
                               ? format_bytes(s.prefetch_to_gpu_bytes)
                               : fmt::format("{} asked; the driver migrated {} ({})", format_bytes(s.prefetch_to_gpu_bytes),
                                             format_bytes(s.migrated_to_gpu_bytes), kWhyAskedAndMigratedDiffer));
  row("evicted to host", format_bytes(s.evict_to_cpu_bytes));
  row("move calls", describe_calls(s));
  row("advise calls", fmt::format("{}", s.advise_calls));
  row("fault feedback", s.fault_feedback == "off" || s.fault_feedback.starts_with("off:")
                            ? s.fault_feedback
                            : fmt::format("{}: {} faults, {} ranges refined, {} in / {} out migrated", s.fault_feedback,
                                          s.fault_records, s.refined_accesses, format_bytes(s.migrated_to_gpu_bytes),
                                          format_bytes(s.migrated_to_host_bytes)));
  if (std::string_view(extent_truth(s)) != "per-tensor") row("extents under the cache", describe_extent_truth(s));
  row("own state (peak / budget)", fmt::format("{} / {}", format_bytes(s.state_peak_bytes), format_bytes(s.state_budget_bytes)));
  if (s.backend_errors) row("driver calls refused", fmt::format("{}", s.backend_errors));
  if (s.devices.size() > 1) {  // (one device: the rows above are its own)
    for (const DeviceStats& d : s.devices) {
      row(fmt::format("device {}", d.device),
          fmt::format("budget {} of {}, {} launches, {} prefetched, {} evicted, {} live blocks", format_bytes(d.budget_bytes),
                      format_bytes(d.physical_total_bytes), d.launches, format_bytes(d.prefetch_to_gpu_bytes),
                      format_bytes(d.evict_to_cpu_bytes), format_bytes(d.live_block_bytes)));
    }
  }
  return out;
}

namespace {
nlohmann::json calls_json(const CallSizes& c) {
  return nlohmann::json{{"calls", c.calls()}, {"bytes_median", c.quantile(0.5)}, {"bytes_p90", c.quantile(0.9)}};
}

nlohmann::json devices_json(const std::vector<DeviceStats>& all) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceStats& d : all) {
    devices.push_back({{"device", d.device},
                       {"launches", d.launches},
                       {"prefetched_chunks", d.prefetched_chunks},
                       {"evicted_chunks", d.evicted_chunks},
                       {"dropped_prefetch_chunks", d.dropped_prefetch_chunks},
                       {"resident_chunks", d.resident_chunks},
                       {"bytes",
                        {{"budget", d.budget_bytes},
                         {"start_budget", d.start_budget_bytes},
                         {"outside_device_now", d.outside_device_bytes},
                         {"outside_device_peak", d.outside_device_peak_bytes},
                         {"gpu_total", d.physical_total_bytes},
                         {"live_blocks", d.live_block_bytes},
                         {"prefetched_to_gpu", d.prefetch_to_gpu_bytes},
                         {"evicted_to_host", d.evict_to_cpu_bytes}}}});
  }
  return devices;
}
}  // namespace

nlohmann::json stats_json(const Stats& s) {
  return nlohmann::json{
      {"policy", s.policy},
      {"allocations",
       {{"redirected", s.allocations_redirected},
        {"passed_through", s.allocations_passed_through},
        {"excluded", s.allocations_excluded},
        {"refused", s.allocations_refused},
        {"frees", s.frees},
        {"frees_deferred", s.frees_deferred}}},
      {"bytes",
       {{"managed_now", s.managed_bytes},
        {"live_blocks", s.live_block_bytes},
        {"peak_managed", s.peak_managed_bytes},
        {"peak_over_budget", s.peak_over_budget_bytes},
        {"budget", s.budget_bytes},
        {"start_budget", s.start_budget_bytes},
        {"outside_device_now", s.outside_device_bytes},
        {"outside_device_peak", s.outside_device_peak_bytes},
        {"max_managed", s.max_managed_bytes},
        {"gpu_total", s.physical_total_bytes},
        {"prefetched_to_gpu", s.prefetch_to_gpu_bytes},
        {"evicted_to_host", s.evict_to_cpu_bytes}}},
      {"suballocator",
       {{"range_bytes", s.suballocator_range_bytes},
        {"ranges", s.suballocator_ranges},
        {"fences", s.fences},
        {"discarded", s.discarded_bytes}}},
      {"fault_feedback",
       {{"state", s.fault_feedback},
        {"faults", s.fault_records},
        {"refined_accesses", s.refined_accesses},
        {"migrated_to_gpu", s.migrated_to_gpu_bytes},
        {"migrated_to_host", s.migrated_to_host_bytes}}},
      {"framework_trace",
       {{"state", s.framework_trace},
        {"extents_from", extent_truth(s)},
        {"segments", s.framework_segments},
        {"live_tensors", s.framework_tensors},
        {"tensor_allocs", s.framework_tensor_allocs},
        {"events_refused", s.framework_events_refused}}},
      {"state_memory",
       {{"now", s.state_bytes},
        {"peak", s.state_peak_bytes},
        {"budget", s.state_budget_bytes}}},
      {"prefetch_reconciliation",
       {{"asked_to_gpu", s.prefetch_to_gpu_bytes},
        {"driver_migrated_to_gpu", migrations_counted(s) ? nlohmann::json(s.migrated_to_gpu_bytes) : nlohmann::json()},
        {"counted_by", migrations_counted(s) ? "fault feedback (" + s.fault_feedback + ")"
                                             : "not counted: fault feedback " + s.fault_feedback},
        {"why_they_differ", kWhyAskedAndMigratedDiffer}}},
      {"calls", {{"h2d", calls_json(s.h2d_calls)},
                 {"d2h", calls_json(s.d2h_calls)},
                 {"h2d_batches", {{"batches", s.h2d_batches}, {"ranges", s.h2d_batched_ranges}}}}},
      {"launches", s.launches},
      {"launches_other_device", s.launches_other_device},
      {"advise_calls", s.advise_calls},
      {"driver_calls_refused", s.backend_errors},
      {"devices", devices_json(s.devices)},
  };
}

std::string write_report(const std::string& path, const Stats& stats) {
  try {
    OutputFile out(path);
    out.write(stats_json(stats).dump(2) + '\n');
    out.close();
    return {};
  } catch (const std::exception& e) {  // (OutputFile's "cannot write PATH: ...", or bad_alloc)
    return fmt::format("SPILLWAY_REPORT: {}", e.what());
  }
}

}  // namespace spillway
