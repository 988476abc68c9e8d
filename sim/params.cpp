#include "spillway/sim/params.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "spillway/size.h"

namespace spillway::sim {

namespace {

constexpr const char* kG10FaultBatch = "G10, MICRO'23, and UVMSmart: 45 us per far fault, charged per batch";
constexpr const char* kAssumedSlowdown =
    "assumed: the RAPIDS and JAX maintainers' figure for demand paging against explicit prefetch; not measured here";
constexpr const char* kNoCallShape =
    "assumed: no per-call cost, a call costs its bytes / the bandwidth; the call shape was not measured on this link";

// The H200's call shape: `spillway-linkbench --bytes 4 --matrix`, 4 GiB of managed memory
// moved in back-to-back cuMemPrefetchAsync calls of each size on one stream, one run on
// 2026-12-04 (docs/gpu-results.md, "Call shape").
CallShape h200_call_shape() {
  return CallShape{
      .h2d = {{64 << 10, 1.76}, {2 << 20, 18.95}, {8 << 20, 24.29}, {32 << 20, 37.48}, {128 << 20, 43.90}, {512 << 20, 48.98}},
      .d2h = {{64 << 10, 3.82}, {2 << 20, 13.86}, {8 << 20, 15.36}, {32 << 20, 17.34}, {128 << 20, 18.01}, {512 << 20, 17.91}},
      // 16 x 2 MiB ranges apart (every other chunk, as the Engine's batches mostly are: ranges
      // that meet inside one allocation go as one call) in one cuMemPrefetchBatchAsync: 1 582
      // us, against 111 us a single 2 MiB call (contiguous ones: 1 515 us; the smaller saving
      // is taken).
      .h2d_batch_share = 1582.0 / 16.0 / 111.0,
  };
}

LinkProfile assumed(std::string name, double h2d, double d2h, std::string bandwidth_source) {
  return LinkProfile{.name = std::move(name),
                     .h2d_bytes_per_s = h2d,
                     .d2h_bytes_per_s = d2h,
                     .fault_batch_ns = 45'000,
                     .fault_slowdown = 10.0,
                     .calls = {},
                     .sources = {std::move(bandwidth_source), kNoCallShape, kG10FaultBatch, kAssumedSlowdown}};
}

double point_ns(const CallPoint& p) { return static_cast<double>(p.bytes) / p.gb_per_s; }

// The measured run's time for a call of `bytes`, ns: interpolated between the points, the
// smallest's time below it, the last segment continued above the largest. Exact at a point.
double shape_ns(const std::vector<CallPoint>& pts, std::uint64_t bytes) {
  if (pts.size() == 1) return point_ns(pts.front()) * static_cast<double>(bytes) / static_cast<double>(pts.front().bytes);
  if (bytes <= pts.front().bytes) return point_ns(pts.front());
  std::size_t i = 1;
  while (i + 1 < pts.size() && pts[i].bytes < bytes) ++i;
  if (pts[i].bytes == bytes) return point_ns(pts[i]);
  const double a = point_ns(pts[i - 1]), b = point_ns(pts[i]);
  return a + (b - a) * static_cast<double>(bytes - pts[i - 1].bytes) / static_cast<double>(pts[i].bytes - pts[i - 1].bytes);
}

// The model's rate at each measured size, toward `to`: "64 KiB 1.33, 2 MiB 14.30, ... GB/s".
std::string describe_shape(const LinkProfile& link, Location to) {
  std::string out;
  for (const CallPoint& p : call_points(link, to)) {
    out += fmt::format("{}{} {:.2f}", out.empty() ? "" : ", ", format_bytes(p.bytes),
                       static_cast<double>(p.bytes) / call_ns(link, to, p.bytes));
  }
  return out + " GB/s";
}

}  // namespace

const std::vector<LinkProfile>& link_profiles() {
  static const std::vector<LinkProfile> profiles{
      // G10 (MICRO 2023) simulator configuration: PCIe 3.0 x16 at 15.754 GB/s and 45 us per
      // far fault (the UVMSmart figure). Kept identical for comparison with G10's results.
      assumed("pcie3", 15.754e9, 15.754e9, "G10's simulator, MICRO'23: PCIe 3.0 x16, kept for comparison with its results"),
      // PCIe 4.0 x16: 31.5 GB/s raw, ~25 GB/s achievable by cudaMemcpy/prefetch (docs/simulator.md, "Parameters").
      assumed("pcie4", 25e9, 25e9, "assumed: PCIe 4.0 x16, ~25 GB/s achievable by a pinned copy; not measured for prefetch"),
      // PCIe 5.0 x16: 63 GB/s raw, ~50 GB/s achievable (docs/simulator.md, "Parameters").
      assumed("pcie5", 50e9, 50e9, "assumed: PCIe 5.0 x16, ~50 GB/s achievable by a pinned copy; not measured for prefetch"),
      // Grace Hopper NVLink-C2C, measured ~375 GB/s H2D and ~297 GB/s D2H (docs/simulator.md, "Parameters").
      assumed("c2c", 375e9, 297e9, "Grace Hopper NVLink-C2C copies, published measurements; not measured for prefetch"),
      // h200: measured on an NVIDIA H200 (driver 580.159.04, Firecracker VM) with
      // bench/workloads/linkbench.cu, 2026-11-29 (docs/gpu-results.md): cuMemPrefetchAsync
      // in 2 MiB pieces moved 14.30 GB/s host->GPU and 7.67 GB/s GPU->host (pinned memcpy:
      // 55 GB/s each way); one touch per 2 MiB of host-resident data cost 13.8 us; a kernel
      // streaming over host-resident data migrated it by faults at 9.74 GB/s, i.e. 14.30/9.74
      // = 1.47 times slower than prefetching (the density prefetcher turns a stream of faults
      // into whole-2-MiB migrations), not the 10 assumed elsewhere. The call shape is from a
      // later run on the same machine (h200_call_shape()).
      LinkProfile{
          .name = "h200",
          .h2d_bytes_per_s = 14.30e9,
          .d2h_bytes_per_s = 7.67e9,
          .fault_batch_ns = 13'800,
          .fault_slowdown = 14.30 / 9.74,
          .calls = h200_call_shape(),
          .sources = {"measured between host and GPU on an H200 machine, driver 580.159.04, 2026-11-29: cuMemPrefetchAsync "
                      "in 2 MiB calls; docs/gpu-results.md",
                      "measured on the same H200, 2026-12-04, linkbench --matrix; used as ratios to its 2 MiB call; above "
                      "512 MiB assumed: the 128-512 MiB segment's rate continues; docs/gpu-results.md, \"Call shape\"",
                      "measured on the same H200: 13.8 us per touch of 2 MiB of host-resident data, far fault + density "
                      "prefetch; docs/gpu-results.md",
                      "measured on the same H200: fault-driven streaming 9.74 GB/s against 14.30 prefetching; "
                      "docs/gpu-results.md"},
      },
  };
  return profiles;
}

std::optional<LinkProfile> find_link(std::string_view name) {
  for (const LinkProfile& p : link_profiles()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

const std::vector<CallPoint>& call_points(const LinkProfile& link, Location to) {
  return to == Location::gpu ? link.calls.h2d : link.calls.d2h;
}

double bandwidth(const LinkProfile& link, Location to) {
  return to == Location::gpu ? link.h2d_bytes_per_s : link.d2h_bytes_per_s;
}

bool is_measured(const LinkProfile& link) { return link.sources.bandwidth.starts_with("measured"); }

double call_ns(const LinkProfile& link, Location to, std::uint64_t bytes) {
  const double chunk_ns = static_cast<double>(kChunkBytes) * 1e9 / bandwidth(link, to);
  const std::vector<CallPoint>& pts = call_points(link, to);
  if (pts.empty()) return static_cast<double>(bytes) * 1e9 / bandwidth(link, to);
  return chunk_ns * (shape_ns(pts, bytes) / shape_ns(pts, kChunkBytes));
}

double peak_bytes_per_s(const LinkProfile& link, Location to) {
  double peak = bandwidth(link, to);
  const std::vector<CallPoint>& pts = call_points(link, to);
  if (pts.empty()) return peak;
  // b / call_ns(b) is monotone on each linear piece (and rises to the smallest point, whose
  // time is constant below it), so its supremum is at a point or the last piece's limit.
  for (const CallPoint& p : pts) peak = std::max(peak, static_cast<double>(p.bytes) * 1e9 / call_ns(link, to, p.bytes));
  if (pts.size() >= 2) {
    const std::uint64_t a = pts[pts.size() - 2].bytes, b = pts.back().bytes;
    const double slope_ns = (call_ns(link, to, b) - call_ns(link, to, a)) / static_cast<double>(b - a);
    // (A last segment whose time does not rise would make calls free or negative past it: a
    // shape must rise in time, as CallShape says and the tests check of every profile.)
    if (slope_ns > 0) peak = std::max(peak, 1e9 / slope_ns);
  }
  return peak;
}

double batched_call_ns(const LinkProfile& link, std::uint64_t bytes) {
  const double single = call_ns(link, Location::gpu, bytes);
  if (link.calls.h2d_batch_share <= 0) return single;
  const double saved = (1.0 - link.calls.h2d_batch_share) * call_ns(link, Location::gpu, 2ull << 20);
  const double fastest = static_cast<double>(bytes) * 1e9 / peak_bytes_per_s(link, Location::gpu);
  return std::max(single - saved, fastest);
}

std::string describe_link(const LinkProfile& link, double fault_slowdown) {
  std::string out = fmt::format("link {}: H2D {:.2f} GB/s, D2H {:.2f} GB/s in 2 MiB calls ({})\n", link.name,
                                link.h2d_bytes_per_s / 1e9, link.d2h_bytes_per_s / 1e9, link.sources.bandwidth);
  if (link.calls.h2d.empty()) {
    out += fmt::format("  move calls: {}\n", link.sources.calls);
  } else {
    out += fmt::format("  move calls ({}):\n    H2D {}\n    D2H {}\n", link.sources.calls, describe_shape(link, Location::gpu),
                       describe_shape(link, Location::cpu));
  }
  if (link.calls.h2d_batch_share > 0) {
    out += fmt::format("  batched prefetches: a range in a cuMemPrefetchBatchAsync saves {:.1f} us of its call (measured on the "
                       "same H200: 16 x 2 MiB ranges apart in one batch took {:.3f}x the time of single calls; the saving assumed the same "
                       "for longer ranges; the Engine batches only toward the GPU)\n",
                       (call_ns(link, Location::gpu, 2ull << 20) - batched_call_ns(link, 2ull << 20)) / 1e3,
                       link.calls.h2d_batch_share);
  }
  out += fmt::format("  fault batch {:.1f} us ({})\n", static_cast<double>(link.fault_batch_ns) / 1e3, link.sources.fault_batch);
  out += fmt::format("  fault-driven migration {:.2f}x slower than a prefetch ({})\n", fault_slowdown, link.sources.fault_slowdown);
  out += fmt::format("  the lower bound's rate, the fastest any call moves: H2D {:.2f} GB/s, D2H {:.2f} GB/s\n",
                     peak_bytes_per_s(link, Location::gpu) / 1e9, peak_bytes_per_s(link, Location::cpu) / 1e9);
  return out;
}

SimParams default_params() {
  SimParams p;
  p.link = *find_link("pcie5");
  p.fault_slowdown = p.link.fault_slowdown;
  return p;
}

}  // namespace spillway::sim
