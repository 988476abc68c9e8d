// Parameters of the simulated GPU and its link (docs/simulator.md). Every
// parameter has a default with its source, and `spillway sweep`/`replay` can set each one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/types.h"

namespace spillway::sim {

// One measured point of a link's call shape: a cuMemPrefetchAsync call moving `bytes` ran at
// `gb_per_s` (1e9 bytes per second), measured as a series of back-to-back calls on one stream.
struct CallPoint {
  std::uint64_t bytes;
  double gb_per_s;
};

// How a move call's time grows with its bytes, per direction (docs/simulator.md, "Move
// calls"). Only ratios within the measured run are used: a call of b bytes costs
// (2 MiB ÷ the profile's bandwidth) × t(b) ÷ t(2 MiB), t interpolated linearly between the
// points (below the smallest: the smallest's time; above the largest: the last segment's
// rate continued). So a 2 MiB call costs what the profile's bandwidth says, whatever run the
// shape came from. Empty: a call costs its bytes ÷ the bandwidth (no per-call cost).
// Each direction's points rise in bytes and in time, and include 2 MiB (checked by tests).
struct CallShape {
  std::vector<CallPoint> h2d, d2h;
  // Toward the GPU, a 2 MiB range of a cuMemPrefetchBatchAsync took this share of a single
  // 2 MiB call's time in the measured run (0: batches not measured, so the Engine issues
  // none: SimBackend::can_batch_prefetches). The difference, times the 2 MiB call's cost on
  // the profile, is the per-call overhead a range in a batch saves; assumed the same for
  // longer ranges (only 2 MiB ones were measured), and never below the bytes at the fastest
  // rate (peak_bytes_per_s), so the lower bound stays one (docs/simulator.md, "Move calls").
  double h2d_batch_share = 0;
};
// The time a range of `bytes` toward the GPU costs inside a batch of several, ns: call_ns
// less the overhead a batch saves, at least the bytes at peak_bytes_per_s. call_ns where the
// shape has no batch share.
struct LinkProfile;
double batched_call_ns(const LinkProfile& link, std::uint64_t bytes);

// Where each of a profile's figures comes from: "measured on ... (docs/...)", a paper or
// driver source, "assumed: why", or "set by --option" once the command line replaced it.
struct LinkSources {
  std::string bandwidth;       // h2d_bytes_per_s, d2h_bytes_per_s
  std::string calls;           // calls
  std::string fault_batch;     // fault_batch_ns
  std::string fault_slowdown;  // fault_slowdown
};

// A host-GPU link. Bandwidths in bytes per second, per direction, of a 2 MiB move call;
// latency in ns.
struct LinkProfile {
  std::string name;
  double h2d_bytes_per_s = 0;
  double d2h_bytes_per_s = 0;
  // Cost of one fault batch (the driver's round trip per batch of replayable faults).
  std::uint64_t fault_batch_ns = 0;
  // Fault-driven migration is this many times slower than an explicit prefetch on this link
  // (SimParams::fault_slowdown takes it; --fault-slowdown overrides). 10: the figure RAPIDS
  // and JAX maintainers report for cudaMallocManaged vs prefetch (docs/simulator.md); measured where
  // a profile was measured.
  double fault_slowdown = 10.0;
  CallShape calls;  // empty: no per-call cost
  LinkSources sources;
};

// pcie3, pcie4, pcie5, c2c, h200 (measured: docs/gpu-results.md). Thread-safe.
const std::vector<LinkProfile>& link_profiles();
// The profile called `name`, if any.
std::optional<LinkProfile> find_link(std::string_view name);

// The call shape's points toward `to` (gpu: H2D, cpu: D2H); empty without a shape.
const std::vector<CallPoint>& call_points(const LinkProfile& link, Location to);
// The bandwidth of a 2 MiB call toward `to`, bytes per second.
double bandwidth(const LinkProfile& link, Location to);

// Whether the profile's bandwidths were measured (their source says "measured ..."), not
// assumed or given on the command line.
bool is_measured(const LinkProfile& link);

// Time of one move call of `bytes` toward `to` (gpu: H2D, cpu: D2H) on `link`, in ns, not
// rounded. With an empty call shape (`--call-shape off` empties it): bytes ÷ bandwidth.
double call_ns(const LinkProfile& link, Location to, std::uint64_t bytes);
// The fastest any move call runs toward `to` on `link`, bytes per second: the supremum over
// call sizes b of b ÷ call_ns(b) (at a measured point or the last segment's rate), and never
// below the profile's bandwidth. Every transfer of the model (a call, a fault migration, a
// remote access) moves at most this fast, so the lower bound charges bytes at it
// (docs/simulator.md, "The lower bound").
double peak_bytes_per_s(const LinkProfile& link, Location to);
// The profile, each figure with its source, in a few lines (each ending in a newline), for
// the headers of `spillway sweep`/`replay` and `spillway info`. `fault_slowdown` is the one in
// force (SimParams::fault_slowdown).
std::string describe_link(const LinkProfile& link, double fault_slowdown);

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
