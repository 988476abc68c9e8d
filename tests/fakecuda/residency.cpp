// fakecuda residency: an opt-in model of where managed memory lives, so that tests can see
// page faults, migrations and evictions through the real shim without a GPU
// (FAKECUDA_GPU_MEMORY=<bytes>). Small and deterministic, no notion of time:
//
// - Unit: the 2 MiB chunk of the address space (address >> 21, the driver's VA block),
//   managed allocations only. A chunk is fresh (never touched), on the CPU, or on one GPU
//   (a visible device ordinal: FAKECUDA_DEVICES gives several, each with its own
//   FAKECUDA_GPU_MEMORY). While the model is on, managed allocations start on a chunk
//   boundary (core.cpp), as the real driver's do; a chunk two managed allocations share
//   (made before it was on) is one.
// - A launch that executes runs on the device of its stream's context and touches every
//   chunk of every managed range it uses. A chunk on the CPU or on another GPU is a page
//   fault on the launching GPU (counted there; it migrates there: UVM moves a page to the
//   faulting processor unless advice maps it, uvm_gpu_replayable_faults.c); a fresh chunk is
//   populated there (first touch: no migration, no fault).
// - cuMemPrefetchAsync(_v2)(_ptsz) that executes (not on a capturing stream): toward device
//   d, chunks on the CPU or another GPU migrate to d (prefetched_in on d) and fresh ones are
//   populated there; toward the host, chunks on a GPU migrate out (prefetched_out on that
//   GPU), fresh ones are populated on the CPU. Effects are immediate, like the fake's other
//   data effects. from_peer counts the chunks a GPU got from another GPU (fault or prefetch).
// - Advice: a chunk whose preferred location is the CPU and that GPU d is set to access
//   (cuMemAdvise SET_PREFERRED_LOCATION host + SET_ACCESSED_BY device d) is read remotely by
//   a launch on d while it is not on d: no fault, no migration (remote_accesses). A prefetch
//   still migrates such a chunk. A read-mostly chunk (SET_READ_MOSTLY) that comes to a GPU
//   from the CPU, by a read fault or a prefetch, is a duplicate there: its CPU copy stays
//   valid, so leaving the GPU copies nothing (read_mostly_drops, no migration) — until a
//   launch writes it, which faults (a write fault; collapses) and leaves one copy, the GPU's
//   (CUDA Programming Guide, "Unified Memory", cudaMemAdviseSetReadMostly). UNSET_READ_MOSTLY
//   collapses the chunk's duplicates too. Other advice changes nothing.
// - A launch's ranges say whether it writes them (driver_api.cpp: fill_u32 and add_u32's
//   destination; any other kernel writes what it is given): a fault is a write fault when
//   the launch writes the chunk.
// - Capacity: FAKECUDA_GPU_MEMORY / 2 MiB chunks per GPU. A chunk arriving on a full GPU
//   evicts that GPU's oldest-migrated resident chunk not used by the same launch or prefetch
//   (the driver's root-chunk list in uvm_pmm_gpu.c is per GPU and ordered by migration, not
//   by access), or the oldest of all when every one is in use (driver_evictions).
// - late_prefetches: chunks a launch touched that a prefetch migrated to its GPU after that
//   GPU's previous launch (no kernel ran between the copy and its use to hide it: on a GPU
//   the kernel would likely wait for it). Counted, not faults.
// - Counters are per GPU; work that involves no GPU (a prefetch to the host populating a
//   fresh chunk, a discard) counts on the device of the stream it was issued on.
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

constexpr int kCpu = FAKECUDA_DEVICE_CPU;
constexpr uint64_t kChunkBytes = uint64_t{1} << kChunkShift;

struct Chunk {
  int where = kCpu;      // the GPU holding it, or kCpu
  uint64_t stamp = 0;    // migration order while on a GPU
  uint64_t arrived = 0;  // 1 + its GPU's launches when a prefetch brought it in; 0: not by prefetch
  bool duplicate = false;  // on a GPU with a valid copy on the CPU too (read-mostly, unwritten since it came)
};

struct Hints {
  bool preferred_cpu = false;
  uint32_t accessed_by = 0;  // bit d: SET_ACCESSED_BY device d
  bool read_mostly = false;  // SET_READ_MOSTLY
};

struct Gpu {
  std::map<uint64_t, uint64_t> order;  // stamp -> chunk, oldest migrated first
  fakecuda_residency_stats_t stats{};  // (capacity_chunks, resident_chunks filled on reading)
};

struct Model {
  std::unordered_map<uint64_t, Chunk> chunks;  // absent: fresh
  std::unordered_map<uint64_t, Hints> hints;   // advice, per chunk
  Gpu gpus[kMaxDevices];
  int devices = 0;                  // visible devices
  int physical[kMaxDevices] = {};   // their physical ordinals (for FAKECUDA_STATS)
  uint64_t clock = 0;
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
std::atomic<uint64_t> g_capacity{0};  // chunks per GPU; 0: the model is off

uint64_t capacity_chunks() { return g_capacity.load(std::memory_order_relaxed); }

std::atomic<const fakecuda_activity_sink_t*> g_sink{nullptr};
const fakecuda_activity_sink_t* sink() { return g_sink.load(std::memory_order_acquire); }
bool enabled() { return capacity_chunks() != 0; }

uint64_t first_chunk(uintptr_t p) { return p >> kChunkShift; }
uint64_t last_chunk(uintptr_t p, size_t n) { return (p + n - 1) >> kChunkShift; }

// A device the counters can be charged to (model lock held).
int charged(int device) {
  int n = model().devices;
  return device >= 0 && device < n ? device : 0;
}

void migrated(int src, int dst, uint64_t index) {
  if (const auto* k = sink(); k != nullptr && k->migration != nullptr) k->migration(src, dst, index << kChunkShift, kChunkBytes);
}

void leave_gpu(Chunk& c) {
  if (c.where >= 0) model().gpus[c.where].order.erase(c.stamp);
  c.where = kCpu;
  c.arrived = 0;
  c.duplicate = false;
}

bool read_mostly(uint64_t index) {
  auto h = model().hints.find(index);
  return h != model().hints.end() && h->second.read_mostly;
}

// Puts chunk `index` (state `c`, not on a GPU) on GPU d, evicting there for room; `in_use`:
// the sorted chunks of the current launch or prefetch, evicted only when nothing else is
// resident.
void arrive(int d, uint64_t index, Chunk& c, const std::vector<uint64_t>& in_use) {
  Model& m = model();
  Gpu& g = m.gpus[d];
  while (!g.order.empty() && g.order.size() >= capacity_chunks()) {
    auto victim = g.order.begin();
    for (auto it = victim; it != g.order.end(); ++it) {
      if (!std::binary_search(in_use.begin(), in_use.end(), it->second)) {
        victim = it;
        break;
      }
    }
    uint64_t v = victim->second;
    Chunk& out = m.chunks[v];
    const bool copy = !out.duplicate;  // (a read-mostly duplicate is dropped: the CPU's copy is valid)
    leave_gpu(out);
    ++g.stats.driver_evictions;
    if (copy) migrated(d, kCpu, v);
    else ++g.stats.read_mostly_drops;
  }
  c.where = d;
  c.stamp = ++m.clock;
  g.order[c.stamp] = index;
}

void add(fakecuda_residency_stats_t& to, const fakecuda_residency_stats_t& s) {
  to.capacity_chunks += s.capacity_chunks;
  to.resident_chunks += s.resident_chunks;
  to.launches += s.launches;
  to.faults += s.faults;
  to.populated += s.populated;
  to.prefetched_in += s.prefetched_in;
  to.prefetched_out += s.prefetched_out;
  to.driver_evictions += s.driver_evictions;
  to.late_prefetches += s.late_prefetches;
  to.remote_accesses += s.remote_accesses;
  to.discarded += s.discarded;
  to.from_peer += s.from_peer;
  to.read_mostly_drops += s.read_mostly_drops;
  to.collapses += s.collapses;
}

// Device d's counters as read (model lock held).
fakecuda_residency_stats_t device_stats(int d) {
  fakecuda_residency_stats_t s = model().gpus[d].stats;
  s.capacity_chunks = capacity_chunks();
  s.resident_chunks = model().gpus[d].order.size();
  return s;
}

fakecuda_residency_stats_t total_stats() {
  fakecuda_residency_stats_t s{};
  for (int d = 0; d < model().devices; ++d) add(s, device_stats(d));
  return s;
}

std::string counters_json(const fakecuda_residency_stats_t& s) {
  char line[640];
  std::snprintf(line, sizeof line,
                "\"capacity_chunks\":%" PRIu64 ",\"resident_chunks\":%" PRIu64 ",\"launches\":%" PRIu64
                ",\"faults\":%" PRIu64 ",\"populated\":%" PRIu64 ",\"prefetched_in\":%" PRIu64
                ",\"prefetched_out\":%" PRIu64 ",\"driver_evictions\":%" PRIu64 ",\"late_prefetches\":%" PRIu64
                ",\"remote_accesses\":%" PRIu64 ",\"discarded\":%" PRIu64 ",\"read_mostly_drops\":%" PRIu64
                ",\"collapses\":%" PRIu64,
                s.capacity_chunks, s.resident_chunks, s.launches, s.faults, s.populated, s.prefetched_in,
                s.prefetched_out, s.driver_evictions, s.late_prefetches, s.remote_accesses, s.discarded,
                s.read_mostly_drops, s.collapses);
  return line;
}

// FAKECUDA_STATS: the sums over the devices under the keys one device always had, then
// "devices": each visible device's own counters, with its physical ordinal.
__attribute__((destructor)) void write_stats() {
  try {
    std::string json, path;
    {
      std::lock_guard lock(model_mutex());
      const Model& m = model();
      if (m.stats_path.empty() || ::getpid() != m.owner) return;
      path = m.stats_path;
      json = "{\"gpu_memory\":" + std::to_string(m.gpu_memory * static_cast<uint64_t>(m.devices)) + "," +
             counters_json(total_stats()) + ",\"devices\":[";
      for (int d = 0; d < m.devices; ++d) {
        fakecuda_residency_stats_t s = device_stats(d);
        json += (d ? ",{" : "{") + std::string("\"device\":") + std::to_string(d) +
                ",\"physical\":" + std::to_string(m.physical[d]) + ",\"gpu_memory\":" + std::to_string(m.gpu_memory) +
                "," + counters_json(s) + ",\"from_peer\":" + std::to_string(s.from_peer) +
                ",\"resident_bytes\":" + std::to_string(s.resident_chunks << kChunkShift) + "}";
      }
      json += "]}\n";
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "fakecuda: cannot write FAKECUDA_STATS='%s'\n", path.c_str());
      return;
    }
    ssize_t ignored = ::write(fd, json.data(), json.size());  // one write(2)
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
  m.devices = static_cast<int>(std::min<size_t>(cfg.visible.size(), kMaxDevices));
  for (int d = 0; d < m.devices; ++d) m.physical[d] = cfg.visible[d];
  g_capacity.store(m.devices ? cfg.gpu_memory >> kChunkShift : 0, std::memory_order_relaxed);
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
    leave_gpu(it->second);
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
    leave_gpu(it->second);
    m.chunks.erase(it);
  }
}

void residency_discard(uintptr_t p, size_t n, int caller) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  Gpu& g = m.gpus[charged(caller)];
  // Whole chunks of the range leave their GPU (and the CPU) with nothing copied: the next
  // touch populates them afresh.
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) {
    if ((i << kChunkShift) < p || ((i + 1) << kChunkShift) > p + n) continue;
    auto it = m.chunks.find(i);
    if (it == m.chunks.end()) continue;
    leave_gpu(it->second);
    m.chunks.erase(it);
    ++g.stats.discarded;
  }
}

void residency_advise(uintptr_t p, size_t n, CUmem_advise advice, int device) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  uint32_t bit = device >= 0 && device < kMaxDevices ? uint32_t{1} << device : 0;
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) {
    Hints& h = model().hints[i];
    switch (advice) {
      case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: h.preferred_cpu = device < 0; break;
      case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: h.preferred_cpu = false; break;
      case CU_MEM_ADVISE_SET_ACCESSED_BY: h.accessed_by |= bit; break;
      case CU_MEM_ADVISE_UNSET_ACCESSED_BY: h.accessed_by &= ~bit; break;
      case CU_MEM_ADVISE_SET_READ_MOSTLY: h.read_mostly = true; break;
      case CU_MEM_ADVISE_UNSET_READ_MOSTLY: {
        h.read_mostly = false;
        auto c = model().chunks.find(i);
        if (c != model().chunks.end()) c->second.duplicate = false;  // one copy stays: the GPU's
        break;
      }
      default: break;
    }
  }
}

void residency_prefetch(uintptr_t p, size_t n, int device, int caller) {
  if (!enabled() || n == 0) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  if (device >= m.devices) return;  // (the driver checked the location)
  std::vector<uint64_t> in_use;
  for (uint64_t i = first_chunk(p), last = last_chunk(p, n); i <= last; ++i) in_use.push_back(i);
  for (uint64_t i : in_use) {
    bool fresh = m.chunks.find(i) == m.chunks.end();
    Chunk& c = m.chunks[i];
    if (device >= 0) {
      Gpu& g = m.gpus[device];
      if (fresh) ++g.stats.populated;  // on the GPU it is prefetched to
      if (c.where == device) continue;
      int from = c.where;
      leave_gpu(c);
      arrive(device, i, c, in_use);
      if (!fresh) {
        ++g.stats.prefetched_in;
        if (from >= 0) ++g.stats.from_peer;
        migrated(from, device, i);
        c.arrived = g.stats.launches + 1;  // a copy (populating a fresh chunk copies nothing)
        c.duplicate = from == kCpu && read_mostly(i);
      }
    } else {
      if (fresh) ++m.gpus[charged(caller)].stats.populated;  // on the CPU
      if (c.where < 0) continue;
      int from = c.where;
      const bool copy = !c.duplicate;
      leave_gpu(c);
      if (!copy) {  // the CPU's copy is valid: the GPU's is dropped
        ++m.gpus[from].stats.read_mostly_drops;
        continue;
      }
      ++m.gpus[from].stats.prefetched_out;
      migrated(from, kCpu, i);
    }
  }
}

void residency_launch(int device, const std::vector<TouchedRange>& ranges) {
  if (!enabled()) return;
  std::lock_guard lock(model_mutex());
  Model& m = model();
  if (device < 0 || device >= m.devices) return;
  Gpu& g = m.gpus[device];
  const uint32_t bit = uint32_t{1} << device;
  std::vector<uint64_t> in_use, written;
  for (const TouchedRange& r : ranges)
    for (uint64_t i = first_chunk(r.base), last = last_chunk(r.base, r.size); r.size && i <= last; ++i) {
      in_use.push_back(i);
      if (r.write) written.push_back(i);
    }
  std::sort(in_use.begin(), in_use.end());
  in_use.erase(std::unique(in_use.begin(), in_use.end()), in_use.end());
  std::sort(written.begin(), written.end());
  const fakecuda_activity_sink_t* k = sink();
  if (k != nullptr && k->kernel_begin != nullptr) k->kernel_begin(device);
  for (uint64_t i : in_use) {
    bool fresh = m.chunks.find(i) == m.chunks.end();
    Chunk& c = m.chunks[i];
    const bool write = std::binary_search(written.begin(), written.end(), i);
    if (c.where == device) {
      if (c.arrived == g.stats.launches + 1) ++g.stats.late_prefetches;
      if (write && c.duplicate) {  // a write to a read-mostly duplicate: a write fault, one copy stays
        c.duplicate = false;
        ++g.stats.faults;
        ++g.stats.collapses;
        if (k != nullptr && k->fault != nullptr) k->fault(device, i << kChunkShift, 1);
      }
      continue;
    }
    auto h = m.hints.find(i);
    if (h != m.hints.end() && h->second.preferred_cpu && (h->second.accessed_by & bit)) {
      if (fresh) ++g.stats.populated;  // on the CPU, where it stays
      ++g.stats.remote_accesses;
      continue;
    }
    ++(fresh ? g.stats.populated : g.stats.faults);
    int from = c.where;
    if (from >= 0) ++g.stats.from_peer;
    leave_gpu(c);
    arrive(device, i, c, in_use);
    c.duplicate = !fresh && !write && from == kCpu && read_mostly(i);
    if (k != nullptr && k->fault != nullptr) k->fault(device, i << kChunkShift, write ? 1 : 0);
    if (!fresh) migrated(from, device, i);
  }
  if (k != nullptr && k->kernel_end != nullptr) k->kernel_end(device);
  ++g.stats.launches;
}

}  // namespace fakecuda

using namespace fakecuda;

FAKECUDA_EXPORT int fakecuda_residency_stats(fakecuda_residency_stats_t* out) {
  if (!out) return -1;
  try {
    config();  // loads the configuration if no driver call has yet
    std::lock_guard lock(model_mutex());
    *out = total_stats();
    return enabled() ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

FAKECUDA_EXPORT int fakecuda_device_residency_stats(int device, fakecuda_residency_stats_t* out) {
  if (!out) return -1;
  try {
    config();
    std::lock_guard lock(model_mutex());
    *out = fakecuda_residency_stats_t{};
    if (device < 0 || device >= model().devices) return -1;
    *out = device_stats(device);
    return enabled() ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

FAKECUDA_EXPORT int fakecuda_chunk_device(CUdeviceptr p) {
  try {
    config();
    Alloc a;
    if (!enabled() || !find(p, &a) || a.kind != Kind::Managed) return FAKECUDA_DEVICE_NONE;
    std::lock_guard lock(model_mutex());
    auto it = model().chunks.find(first_chunk(p));
    return it == model().chunks.end() ? FAKECUDA_DEVICE_FRESH : it->second.where;
  } catch (...) {
    return FAKECUDA_DEVICE_NONE;
  }
}

FAKECUDA_EXPORT int fakecuda_chunk_location(CUdeviceptr p) {
  int d = fakecuda_chunk_device(p);
  return d == FAKECUDA_DEVICE_NONE    ? -1
         : d == FAKECUDA_DEVICE_FRESH ? FAKECUDA_CHUNK_FRESH
         : d == FAKECUDA_DEVICE_CPU   ? FAKECUDA_CHUNK_CPU
                                      : FAKECUDA_CHUNK_GPU;
}

FAKECUDA_EXPORT void fakecuda_set_activity_sink(const fakecuda_activity_sink_t* sink) { g_sink.store(sink, std::memory_order_release); }
