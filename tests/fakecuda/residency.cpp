// fakecuda residency: an opt-in model of where managed memory lives, so that tests can see
// page faults, migrations and evictions through the real shim without a GPU
// (FAKECUDA_GPU_MEMORY=<bytes>; DESIGN §8). Small and deterministic, no notion of time:
//
// - Unit: the 2 MiB chunk of the address space (address >> 21, the driver's VA block),
//   managed allocations only. A chunk is fresh (never touched), on the CPU, or on the GPU.
//   While the model is on, managed allocations start on a chunk boundary (core.cpp), as the
//   real driver's do; a chunk two managed allocations share (made before it was on) is one.
// - A launch that executes touches every chunk of every managed allocation one of its
//   parameter words points into. A chunk on the CPU is a page fault (counted; it migrates
//   to the GPU); a fresh chunk is populated on the GPU (first touch: no migration, no fault).
// - cuMemPrefetchAsync(_v2)(_ptsz) that executes (not on a capturing stream): toward the
//   device, chunks on the CPU migrate in (prefetched_in) and fresh ones are populated there;
//   toward the host, chunks on the GPU migrate out (prefetched_out), fresh ones are
//   populated on the CPU. Effects are immediate, like the fake's other data effects.
// - Advice: a chunk whose preferred location is the CPU and that the GPU is set to access
//   (cuMemAdvise SET_PREFERRED_LOCATION host + SET_ACCESSED_BY device) is read remotely by a
//   launch while it is not on the GPU: no fault, no migration (remote_accesses). Other
//   advice changes nothing. A prefetch still migrates such a chunk.
// - Capacity: FAKECUDA_GPU_MEMORY / 2 MiB chunks. A chunk arriving on a full GPU evicts the
//   oldest-migrated resident chunk not used by the same launch or prefetch (the driver's
//   root-chunk list in uvm_pmm_gpu.c is ordered by migration, not by access), or the oldest
//   of all when every one is in use (driver_evictions).
// - late_prefetches: chunks a launch touched that a prefetch migrated in after the previous
//   launch (no kernel ran between the copy and its use to hide it: on a GPU the kernel
//   would likely wait for it). Counted, not faults.
// - Copies and memsets do not move chunks; graphs are not replayed, so graph launches
//   touch nothing.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core.h"
#include "fakecuda.h"

namespace fakecuda {
namespace {

struct Chunk {
  bool gpu = false;
  uint64_t stamp = 0;    // migration order while on the GPU
  uint64_t arrived = 0;  // 1 + launches seen when a prefetch brought it in; 0: not by prefetch
};

struct Hints {
  bool preferred_cpu = false;
  bool accessed_by_gpu = false;
};

struct Model {
  std::unordered_map<uint64_t, Chunk> chunks;  // absent: fresh
  std::unordered_map<uint64_t, Hints> hints;   // advice, per chunk
  std::map<uint64_t, uint64_t> gpu_order;      // stamp -> chunk, oldest migrated first
  uint64_t clock = 0;
  fakecuda_residency_stats_t stats{};
  uint64_t gpu_memory = 0;  // copies of the configuration: the exit report must not read
  std::string stats_path;   // g_config, whose destructor may already have run
  pid_t owner = 0;          // the process that read them (a forked child writes nothing)
};

// Never destroyed: the exit report runs after static destructors.
std::mutex& model_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
Model& model() {
  static auto* m = new Model;
  return *m;
}
std::atomic<uint64_t> g_capacity{0};  // chunks; 0: the model is off

uint64_t capacity_chunks() { return g_capacity.load(std::memory_order_relaxed); }

std::atomic<const fakecuda_activity_sink_t*> g_sink{nullptr};
const fakecuda_activity_sink_t* sink() { return g_sink.load(std::memory_order_acquire); }
bool enabled() { return capacity_chunks() != 0; }

uint64_t first_chunk(uintptr_t p) { return p >> kChunkShift; }
uint64_t last_chunk(uintptr_t p, size_t n) { return (p + n - 1) >> kChunkShift; }

void leave_gpu(Chunk& c) {
  model().gpu_order.erase(c.stamp);
  c.gpu = false;
  c.arrived = 0;
}

// Puts chunk `index` (state `c`) on the GPU, evicting for room; `in_use`: the sorted chunks
// of the current launch or prefetch, evicted only when nothing else is resident.
void arrive(uint64_t index, Chunk& c, const std::vector<uint64_t>& in_use) {
  Model& m = model();
  while (!m.gpu_order.empty() && m.gpu_order.size() >= capacity_chunks()) {
    auto victim = m.gpu_order.begin();
    for (auto it = victim; it != m.gpu_order.end(); ++it) {
      if (!std::binary_search(in_use.begin(), in_use.end(), it->second)) {
        victim = it;
        break;
      }
    }
    leave_gpu(m.chunks[victim->second]);
    ++m.stats.driver_evictions;
    if (const auto* k = sink(); k != nullptr && k->migration != nullptr) k->migration(0, uint64_t{1} << kChunkShift);
  }
  c.gpu = true;
  c.stamp = ++m.clock;
  m.gpu_order[c.stamp] = index;
}

__attribute__((destructor)) void write_stats() {
  try {
    fakecuda_residency_stats_t s{};
    uint64_t gpu_memory = 0;
    std::string path;
    {
      std::lock_guard lock(model_mutex());
      const Model& m = model();
      if (m.stats_path.empty() || ::getpid() != m.owner) return;
      s = m.stats;
      s.capacity_chunks = capacity_chunks();
      s.resident_chunks = m.gpu_order.size();
      gpu_memory = m.gpu_memory;
      path = m.stats_path;
    }
    char line[512];
    int n = std::snprintf(line, sizeof line,
                          "{\"gpu_memory\":%" PRIu64 ",\"capacity_chunks\":%" PRIu64 ",\"resident_chunks\":%" PRIu64
                          ",\"launches\":%" PRIu64 ",\"faults\":%" PRIu64 ",\"populated\":%" PRIu64
                          ",\"prefetched_in\":%" PRIu64 ",\"prefetched_out\":%" PRIu64
                          ",\"driver_evictions\":%" PRIu64 ",\"late_prefetches\":%" PRIu64
                          ",\"remote_accesses\":%" PRIu64 ",\"discarded\":%" PRIu64 "}\n",
                          gpu_memory, s.capacity_chunks, s.resident_chunks, s.launches, s.faults, s.populated,
                          s.prefetched_in, s.prefetched_out, s.driver_evictions, s.late_prefetches, s.remote_accesses,
                          s.discarded);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "fakecuda: cannot write FAKECUDA_STATS='%s'\n", path.c_str());
      return;
    }
    ssize_t ignored = ::write(fd, line, static_cast<size_t>(n));  // one write(2)
    (void)ignored;
    ::close(fd);
  } catch (...) {
  }
}

}  // namespace

void residency_reset(const Config& cfg) {
  std::lock_guard lock(model_mutex());
  Model& m = model();
  m = Model{};
  m.gpu_memory = cfg.gpu_memory;
  m.stats_path = cfg.stats_path;
  m.owner = ::getpid();
  g_capacity.store(cfg.gpu_memory >> kChunkShift, std::memory_order_relaxed);
}

void residency_alloc(uintptr_t base, size_t size) {
  if (!enabled() || size == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  // A chunk that no other managed allocation shares is fresh (state left behind by a free
  // racing with this allocation is dropped).
  for (uint64_t i = first_chunk(base), last = last_chunk(base, size); i <= last; ++i) {
    auto it = m.chunks.find(i);
    if (it == m.chunks.end() && !m.hints.count(i)) continue;
    uintptr_t lo = i << kChunkShift, hi = (i + 1) << kChunkShift;
    bool shared = (lo < base && managed_overlaps(lo, base)) || (hi > base + size && managed_overlaps(base + size, hi));
    if (shared) continue;
    m.hints.erase(i);
    if (it == m.chunks.end()) continue;
    if (it->second.gpu) leave_gpu(it->second);
    m.chunks.erase(it);
  }
}

void residency_free(uintptr_t base, size_t size) {
  if (!enabled() || size == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  // Chunks no live managed allocation overlaps any more are gone (the freed one is already
  // out of the registry).
  for (uint64_t i = first_chunk(base), last = last_chunk(base, size); i <= last; ++i) {
    if (managed_overlaps(i << kChunkShift, (i + 1) << kChunkShift)) continue;
    m.hints.erase(i);
    auto it = m.chunks.find(i);
    if (it == m.chunks.end()) continue;
    if (it->second.gpu) leave_gpu(it->second);
    m.chunks.erase(it);
  }
}

void residency_discard(uintptr_t p, size_t n) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  // Whole chunks of the range leave the GPU (and the CPU) with nothing copied: the next touch
  // populates them afresh.
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) {
    if ((i << kChunkShift) < p || ((i + 1) << kChunkShift) > p + n) continue;
    auto it = m.chunks.find(i);
    if (it == m.chunks.end()) continue;
    if (it->second.gpu) leave_gpu(it->second);
    m.chunks.erase(it);
    ++m.stats.discarded;
  }
}

void residency_advise(uintptr_t p, size_t n, CUmem_advise advice, bool device) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) {
    Hints& h = model().hints[i];
    switch (advice) {
      case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: h.preferred_cpu = !device; break;
      case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: h.preferred_cpu = false; break;
      case CU_MEM_ADVISE_SET_ACCESSED_BY: h.accessed_by_gpu |= device; break;
      case CU_MEM_ADVISE_UNSET_ACCESSED_BY: h.accessed_by_gpu &= !device; break;
      default: break;
    }
  }
}

void residency_prefetch(uintptr_t p, size_t n, bool to_gpu) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  std::vector<uint64_t> in_use;
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) in_use.push_back(i);
  for (uint64_t i : in_use) {
    bool fresh = m.chunks.find(i) == m.chunks.end();
    Chunk& c = m.chunks[i];
    if (fresh) ++m.stats.populated;  // on the side it is prefetched to
    if (to_gpu && !c.gpu) {
      arrive(i, c, in_use);
      if (!fresh) {
        ++m.stats.prefetched_in;
        if (const auto* k = sink(); k != nullptr && k->migration != nullptr) k->migration(1, uint64_t{1} << kChunkShift);
        c.arrived = m.stats.launches + 1;  // a copy (populating a fresh chunk copies nothing)
      }
    } else if (!to_gpu && c.gpu) {
      leave_gpu(c);
      ++m.stats.prefetched_out;
      if (const auto* k = sink(); k != nullptr && k->migration != nullptr) k->migration(0, uint64_t{1} << kChunkShift);
    }
  }
}

void residency_launch(const std::vector<std::pair<uintptr_t, size_t>>& blocks) {
  if (!enabled()) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  std::vector<uint64_t> in_use;
  for (const auto& [base, size] : blocks)
    for (uint64_t i = first_chunk(base), last = last_chunk(base, size); size && i <= last; ++i) in_use.push_back(i);
  std::sort(in_use.begin(), in_use.end());
  in_use.erase(std::unique(in_use.begin(), in_use.end()), in_use.end());
  const fakecuda_activity_sink_t* k = sink();
  if (k != nullptr && k->kernel_begin != nullptr) k->kernel_begin();
  for (uint64_t i : in_use) {
    bool fresh = m.chunks.find(i) == m.chunks.end();
    Chunk& c = m.chunks[i];
    if (c.gpu) {
      if (c.arrived == m.stats.launches + 1) ++m.stats.late_prefetches;
      continue;
    }
    auto h = m.hints.find(i);
    if (h != m.hints.end() && h->second.preferred_cpu && h->second.accessed_by_gpu) {
      if (fresh) ++m.stats.populated;  // on the CPU, where it stays
      ++m.stats.remote_accesses;
      continue;
    }
    ++(fresh ? m.stats.populated : m.stats.faults);
    arrive(i, c, in_use);
    if (k != nullptr && k->fault != nullptr) k->fault(i << kChunkShift, fresh ? 0 : uint64_t{1} << kChunkShift);
  }
  if (k != nullptr && k->kernel_end != nullptr) k->kernel_end();
  ++m.stats.launches;
}

}  // namespace fakecuda

using namespace fakecuda;

FAKECUDA_EXPORT int fakecuda_residency_stats(fakecuda_residency_stats_t* out) {
  if (!out) return -1;
  try {
    config();  // loads the configuration if no driver call has yet
    std::lock_guard lock(model_mutex());
    *out = model().stats;
    out->capacity_chunks = capacity_chunks();
    out->resident_chunks = model().gpu_order.size();
    return enabled() ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

FAKECUDA_EXPORT int fakecuda_chunk_location(CUdeviceptr p) {
  try {
    config();
    Alloc a;
    if (!enabled() || !find(p, &a) || a.kind != Kind::Managed) return -1;
    std::lock_guard lock(model_mutex());
    auto it = model().chunks.find(first_chunk(p));
    if (it == model().chunks.end()) return FAKECUDA_CHUNK_FRESH;
    return it->second.gpu ? FAKECUDA_CHUNK_GPU : FAKECUDA_CHUNK_CPU;
  } catch (...) {
    return -1;
  }
}

FAKECUDA_EXPORT void fakecuda_set_activity_sink(const fakecuda_activity_sink_t* sink) { g_sink.store(sink, std::memory_order_release); }
