// Parameters of the simulated GPU and its link (docs/simulator.md). Every
// parameter has a default with its source, and `spillway sweep`/`replay` can set each one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spillway::sim {

// A host-GPU link. Bandwidths in bytes per second, per direction; latency in ns.
struct LinkProfile {
  std::string name;
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  // Cost of one fault batch (the driver's round trip per batch of replayable faults).
  std::uint64_t fault_batch_ns = 0;
  std::string source;  // where the figures come from
  // Fault-driven migration is this many times slower than an explicit prefetch on this link
  // (SimParams::fault_slowdown takes it; --fault-slowdown overrides). 10: the figure RAPIDS
  // and JAX maintainers report for cudaMallocManaged vs prefetch (docs/simulator.md); measured where
  // a profile was measured.
  double fault_slowdown = 10.0;
};

// pcie3, pcie4, pcie5, c2c, h200 (measured: docs/gpu-results.md). Thread-safe.
const std::vector<LinkProfile>& link_profiles();
// The profile called `name`, if any.
std::optional<LinkProfile> find_link(std::string_view name);

struct SimParams {
  // GPU memory the simulated GPU offers to managed memory, in bytes (whole 2 MiB chunks
  // count). The sweep sets it from a fraction of the trace's peak footprint.
  std::uint64_t capacity_bytes = 0;
  LinkProfile link;  // default: pcie5 (set by default_params())
  // Replayable faults the driver fetches per batch: uvm_perf_fault_batch_count, default 256
  // (kernel-open/nvidia-uvm/uvm_gpu_replayable_faults.c).
  std::uint32_t fault_batch_size = 256;
  // Fault granularity: the driver services faults in 64 KiB big-page regions
  // (UVM_PAGE_SIZE_64K, the default big page size; docs/simulator.md).
  std::uint64_t fault_granularity_bytes = 64 << 10;
  // Fault-driven migration moves data this many times slower than an explicit prefetch: the
  // link profile's (LinkProfile::fault_slowdown; 10 unless measured).
  double fault_slowdown = 10.0;
  // The density prefetcher: once more than this share of a 2 MiB block's 64 KiB regions has
  // faulted, the driver migrates the rest without further faults (uvm_perf_prefetch_threshold,
  // default 51, kernel-open/nvidia-uvm/uvm_perf_prefetch.c). Set 1.0 to disable.
  double density_threshold = 0.51;
  // Remote (zero-copy) access runs at this share of the link's bandwidth each way (docs/simulator.md,
  // "Advice": the kernel slows by the bytes it touches over link bandwidth); at most 1 (a copy
  // engine never moves more than the link: SimBackend takes min(1, this)).
  double remote_efficiency = 1.0;
  // Fault feedback: the SimBackend reports the chunks each kernel faulted
  // on (Backend::take_faults), as CUPTI's GPU page-fault records do in the shim, so a policy
  // that learns from faults (learned) sees them. `spillway sweep/replay --fault-feedback`.
  bool fault_feedback = true;
  // The policy's state budget, as SPILLWAY_STATE_MEMORY in the shim: the same
  // default, so the simulated policy forgets what the shim's would. UINT64_MAX: unbounded.
  // `spillway sweep/replay --state-memory`.
  std::uint64_t state_memory_bytes = 256ull << 20;
};

// Defaults: pcie5, the figures above, capacity 0 (to be set).
SimParams default_params();

}  // namespace spillway::sim
