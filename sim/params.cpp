#include "spillway/sim/params.h"

namespace spillway::sim {

const std::vector<LinkProfile>& link_profiles() {
  static const std::vector<LinkProfile> profiles{
      // G10 (MICRO 2023) simulator configuration: PCIe 3.0 x16 at 15.754 GB/s and 45 us per
      // far fault (the UVMSmart figure). Kept identical for comparison with G10's results.
      {"pcie3", 15.754e9, 15.754e9, 45'000, "G10 (MICRO'23) simulator: 15.754 GB/s, 45 us far fault"},
      // PCIe 4.0 x16: 31.5 GB/s raw, ~25 GB/s achievable by cudaMemcpy/prefetch (docs/simulator.md, "Parameters").
      // Fault batch cost: G10/UVMSmart's 45 us (the driver's software path, not the link).
      {"pcie4", 25e9, 25e9, 45'000, "PCIe 4.0 x16 ~25 GB/s achievable; 45 us fault batch (G10)"},
      // PCIe 5.0 x16: 63 GB/s raw, ~50 GB/s achievable (docs/simulator.md, "Parameters").
      {"pcie5", 50e9, 50e9, 45'000, "PCIe 5.0 x16 ~50 GB/s achievable; 45 us fault batch (G10)"},
      // Grace Hopper NVLink-C2C, measured ~375 GB/s H2D and ~297 GB/s D2H (docs/simulator.md, "Parameters").
      {"c2c", 375e9, 297e9, 45'000, "NVLink-C2C measured 375/297 GB/s; 45 us fault batch (G10)"},
      // h200: measured on an NVIDIA H200 (driver 580.159.04, Firecracker VM) with
      // bench/workloads/linkbench.cu, 2026-11-29 (docs/gpu-results.md): cuMemPrefetchAsync
      // in 2 MiB pieces moved 14.30 GB/s host->GPU and 7.67 GB/s GPU->host (pinned memcpy:
      // 55 GB/s each way); one touch per 2 MiB of host-resident data cost 13.8 us; a kernel
      // streaming over host-resident data migrated it by faults at 9.74 GB/s, i.e. 14.30/9.74
      // = 1.47 times slower than prefetching (the density prefetcher turns a stream of faults
      // into whole-2-MiB migrations), not the 10 assumed elsewhere.
      {"h200", 14.30e9, 7.67e9, 13'800,
       "measured on an H200: managed prefetch 14.30/7.67 GB/s, 13.8 us per far fault, fault streaming 9.74 GB/s (docs/gpu-results.md)",
       14.30 / 9.74},
  };
  return profiles;
}

std::optional<LinkProfile> find_link(std::string_view name) {
  for (const LinkProfile& p : link_profiles()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

SimParams default_params() {
  SimParams p;
  p.link = *find_link("pcie5");
  p.fault_slowdown = p.link.fault_slowdown;
  return p;
}

}  // namespace spillway::sim
