#include "spillway/sim/sim_backend.h"

#include <algorithm>
#include <cmath>

namespace spillway::sim {

SimBackend::SimBackend(const CompiledTrace& trace, const SimParams& params, bool record_spans)
    : trace_(trace), params_(params) {
  rec_.on = record_spans;
  capacity_chunks_ = params.capacity_bytes / kChunkBytes;
  fault_bw_ = params.link.h2d_bytes_per_s / std::max(1.0, params.fault_slowdown);
  const std::uint64_t pages = std::max<std::uint64_t>(1, kChunkBytes / std::max<std::uint64_t>(1, params.fault_granularity_bytes));
  density_pages_ = static_cast<std::uint32_t>(
      params.density_threshold >= 1.0 ? pages
                                      : std::min<std::uint64_t>(pages, static_cast<std::uint64_t>(std::floor(params.density_threshold * pages)) + 1));
  const std::size_t n = trace.arena_chunks;
  chunks_.live_count.assign(n, 0);
  chunks_.state.assign(n, fresh);
  chunks_.flags.assign(n, 0);
  chunks_.ready.assign(n, 0);
  chunks_.mig_seq.assign(n, 0);
  chunks_.pin.assign(n, 0);
  stats_.compute_ns = 0;
}

std::uint64_t SimBackend::copy_ns(double bytes_per_s, std::uint64_t bytes) const {
  if (bytes == 0) return 0;
  return static_cast<std::uint64_t>(std::ceil(static_cast<double>(bytes) * 1e9 / bytes_per_s));
}

Result SimBackend::memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) {
  *free_bytes = *total_bytes = capacity_chunks_ * kChunkBytes;
  return {};
}

std::uint64_t SimBackend::host_memory_bytes() { return 1ull << 62; }  // host RAM is not modelled

Result SimBackend::record_event(StreamHandle, EventHandle* event) {
  *event = 1;
  return {};
}

Result SimBackend::allocate_managed(std::uint64_t bytes, std::uint64_t* addr) {
  if (expected_block_ >= trace_.blocks.size() || trace_.blocks[expected_block_].bytes != bytes) {
    return Result{Status::invalid_value, 0};
  }
  const BlockPlacement& b = trace_.blocks[expected_block_];
  for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
    if (chunks_.live_count[c]++ != 0) continue;  // (a chunk other live blocks hold keeps its state)
    chunks_.state[c] = fresh;
    chunks_.flags[c] = 0;
  }
  live_addr_[b.addr] = expected_block_;
  *addr = b.addr;
  return {};
}

bool SimBackend::same_managed_allocation(std::uint64_t a, std::uint64_t b) {
  if (a < kArenaBase || b < kArenaBase) return false;
  const auto chunk = [](std::uint64_t addr) { return static_cast<std::uint32_t>((addr - kArenaBase) / kChunkBytes); };
  const std::uint32_t ca = chunk(a), cb = chunk(b);
  // The last range starting at or before a's chunk.
  auto it = std::upper_bound(trace_.ranges.begin(), trace_.ranges.end(), ca,
                             [](std::uint32_t c, const auto& range) { return c < range.first; });
  if (it == trace_.ranges.begin()) return false;
  --it;
  return ca - it->first < it->second && cb >= it->first && cb - it->first < it->second;
}

Result SimBackend::free_managed(std::uint64_t addr) {
  auto it = live_addr_.find(addr);
  if (it == live_addr_.end()) return Result{Status::invalid_value, 0};
  const BlockPlacement& b = trace_.blocks[it->second];
  live_addr_.erase(it);
  for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
    if (--chunks_.live_count[c] != 0) continue;  // another live block still holds the chunk
    if (chunks_.state[c] == gpu) {
      leave(c);
      ++stats_.chunks_dropped;
    }
    chunks_.state[c] = fresh;
    chunks_.flags[c] = 0;
  }
  return {};
}

void SimBackend::retire(std::uint64_t t) {
  while (!leaving_.empty() && leaving_.front() <= t) leaving_.pop_front();
}

void SimBackend::note_occupancy() {
  stats_.peak_occupied_chunks = std::max<std::uint64_t>(stats_.peak_occupied_chunks, resident_ + leaving_.size());
}

void SimBackend::leave(std::uint32_t c) {
  --resident_;
  chunks_.flags[c] &= static_cast<std::uint8_t>(~(unused_prefetch | dirty));
}

// Each moved chunk of a call that moves `moving` chunks toward `to` holds its copy engine for
// an equal share of the call's time (the link's call shape; one chunk: a 2 MiB call).
std::uint64_t SimBackend::call_chunk_ns(Location to, std::uint64_t moving, bool batched) const {
  if (batched && to == Location::gpu && moving > 0) {
    return static_cast<std::uint64_t>(std::ceil(batched_call_ns(params_.link, moving * kChunkBytes) / static_cast<double>(moving)));
  }
  const std::uint64_t one = copy_ns(bandwidth(params_.link, to), kChunkBytes);
  if (call_points(params_.link, to).empty() || moving <= 1) return one;
  return static_cast<std::uint64_t>(std::ceil(call_ns(params_.link, to, moving * kChunkBytes) / static_cast<double>(moving)));
}

// The chunks of [first, last] that a move toward `to` copies: toward the GPU those on the
// host (a fresh chunk is only created), toward the host those resident whose copy is not a
// free drop (an unwritten read-mostly copy).
std::uint64_t SimBackend::chunks_to_copy(std::uint64_t first, std::uint64_t last, Location to) const {
  std::uint64_t n = 0;
  for (std::uint64_t c = first; c <= last; ++c) {
    if (to == Location::gpu) n += chunks_.state[c] == cpu && chunks_.live_count[c] != 0;
    else n += chunks_.state[c] == gpu && !((chunks_.flags[c] & read_mostly) && !(chunks_.flags[c] & dirty));
  }
  return n;
}

std::uint64_t SimBackend::write_back(std::uint32_t c, std::uint64_t not_before, std::uint64_t copy) {
  std::uint64_t start = std::max({not_before, clock_.d2h, chunks_.ready[c]});
  if ((chunks_.flags[c] & read_mostly) && !(chunks_.flags[c] & dirty)) {  // a valid copy stays on the CPU
    ++stats_.clean_drops;
    return start;
  }
  std::uint64_t done = start + copy;
  clock_.d2h = done;
  stats_.d2h_bytes += kChunkBytes;
  if (rec_.on) rec_.spans.push_back({Span::d2h, 0, start, done - start});
  return done;
}

std::uint64_t SimBackend::acquire_slot(std::uint64_t t) {
  retire(t);
  if (resident_ + leaving_.size() < capacity_chunks_) return t;
  if (!leaving_.empty()) {
    std::uint64_t free_at = leaving_.front();
    leaving_.pop_front();
    return std::max(t, free_at);
  }
  // The driver evicts the oldest-migrated root chunk that the running kernel does not use
  // (uvm_pmm_gpu.c: the root chunk list is ordered by migration, not by access).
  std::vector<std::pair<std::uint32_t, std::uint64_t>> skipped;
  std::uint64_t slot = kNoSlot;
  while (!fifo_.empty()) {
    auto [c, seq] = fifo_.front();
    fifo_.pop_front();
    if (chunks_.state[c] != gpu || chunks_.mig_seq[c] != seq) continue;  // stale entry
    if (chunks_.pin[c] == epoch_) {
      skipped.emplace_back(c, seq);
      continue;
    }
    const std::uint64_t before = stats_.d2h_bytes;
    slot = write_back(c, t, copy_ns(params_.link.d2h_bytes_per_s, kChunkBytes));  // (one chunk)
    faults_.driver_out_bytes += stats_.d2h_bytes - before;
    leave(c);
    chunks_.state[c] = cpu;
    ++stats_.driver_evictions;
    ++stats_.chunks_evicted;
    break;
  }
  for (auto it = skipped.rbegin(); it != skipped.rend(); ++it) fifo_.push_front(*it);
  return slot;
}

void SimBackend::make_resident(std::uint32_t c, std::uint64_t ready) {
  chunks_.state[c] = gpu;
  chunks_.ready[c] = ready;
  chunks_.mig_seq[c] = next_mig_++;
  fifo_.emplace_back(c, chunks_.mig_seq[c]);
  // Entries of chunks that left by other ways (a free, the Engine's eviction) are skipped
  // when they reach the front; between evictions they pile up, as many as migrations: drop
  // them once they are most of the list (order kept, so evictions are the same), so the
  // list stays within twice the resident chunks (so that memory does not grow with the trace's length).
  if (fifo_.size() > 2 * resident_ + 4096) {
    std::erase_if(fifo_, [&](const std::pair<std::uint32_t, std::uint64_t>& e) { return chunks_.state[e.first] != gpu || chunks_.mig_seq[e.first] != e.second; });
  }
  ++resident_;
  ++stats_.chunks_in;
  note_occupancy();
}

void SimBackend::prefetch_in(std::uint32_t c, std::uint64_t now, std::uint64_t copy) {
  if (chunks_.state[c] == gpu || chunks_.live_count[c] == 0) return;
  std::uint64_t slot = acquire_slot(now);
  if (slot == kNoSlot) return;
  if (chunks_.state[c] == fresh) {  // never touched: the pages are simply created on the GPU
    make_resident(c, slot);
    return;
  }
  std::uint64_t start = std::max(slot, clock_.h2d);
  std::uint64_t done = start + copy;
  clock_.h2d = done;
  stats_.h2d_bytes += kChunkBytes;
  stats_.prefetch_bytes += kChunkBytes;
  if (rec_.on) rec_.spans.push_back({Span::h2d, 0, start, done - start});
  make_resident(c, done);
  chunks_.flags[c] |= unused_prefetch;
}

void SimBackend::evict(std::uint32_t c, std::uint64_t now, std::uint64_t copy) {
  if (chunks_.state[c] != gpu) return;
  std::uint64_t done = write_back(c, now, copy);
  leave(c);
  chunks_.state[c] = cpu;
  ++stats_.chunks_evicted;
  leaving_.push_back(leaving_.empty() ? done : std::max(done, leaving_.back()));
  note_occupancy();
}

Result SimBackend::prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int) {
  return move_range(addr, bytes, to, false);
}

Result SimBackend::prefetch_batch(const std::uint64_t* addrs, const std::uint64_t* bytes, std::size_t count, Location to,
                                  int) {
  const bool batched = count > 1 && can_batch_prefetches();
  if (batched) rec_.batch = ++rec_.batches;
  Result first{};
  for (std::size_t i = 0; i < count; ++i) {
    Result r = move_range(addrs[i], bytes[i], to, batched);
    if (first.ok() && !r.ok()) first = r;
  }
  rec_.batch = 0;
  return first;
}

Result SimBackend::move_range(std::uint64_t addr, std::uint64_t bytes, Location to, bool batched) {
  if (bytes == 0 || addr < kArenaBase) return Result{Status::invalid_value, 0};
  std::uint64_t first = (addr - kArenaBase) / kChunkBytes, last = (addr + bytes - 1 - kArenaBase) / kChunkBytes;
  if (last >= chunks_.live_count.size()) return Result{Status::invalid_value, 0};
  const std::uint64_t copy = call_chunk_ns(to, chunks_to_copy(first, last, to), batched);
  const std::uint64_t issued = clock_.compute, before = to == Location::gpu ? stats_.prefetch_bytes : stats_.d2h_bytes;
  for (std::uint64_t c = first; c <= last; ++c) {
    if (to == Location::gpu) prefetch_in(static_cast<std::uint32_t>(c), clock_.compute, copy);
    else evict(static_cast<std::uint32_t>(c), clock_.compute, copy);
  }
  if (rec_.on) {  // (the chunks it copied: one may have found no room, or left to make room)
    const std::uint64_t copied = ((to == Location::gpu ? stats_.prefetch_bytes : stats_.d2h_bytes) - before) / kChunkBytes;
    rec_.calls.push_back({to, addr - kArenaBase, bytes, copied, issued, copied * copy, rec_.batch});
  }
  return {};
}

Result SimBackend::advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int) {
  if (bytes == 0 || addr < kArenaBase) return Result{Status::invalid_value, 0};
  std::uint64_t first = (addr - kArenaBase) / kChunkBytes, last = (addr + bytes - 1 - kArenaBase) / kChunkBytes;
  if (last >= chunks_.live_count.size()) return Result{Status::invalid_value, 0};
  for (std::uint64_t c = first; c <= last; ++c) {
    std::uint8_t& f = chunks_.flags[c];
    switch (advice) {
      case Advice::preferred_location:
        if (where == Location::cpu) f |= prefer_cpu; else f &= static_cast<std::uint8_t>(~prefer_cpu);
        break;
      case Advice::unset_preferred_location: f &= static_cast<std::uint8_t>(~prefer_cpu); break;
      case Advice::accessed_by: f |= accessed_by; break;
      case Advice::unset_accessed_by: f &= static_cast<std::uint8_t>(~accessed_by); break;
      case Advice::read_mostly: f |= read_mostly; break;
      case Advice::unset_read_mostly: f &= static_cast<std::uint8_t>(~read_mostly); break;
    }
  }
  return {};
}

// What a kernel's touches ask of the link: when its resident chunks are ready, the bytes it
// reads and writes remotely, the faults its writes to read-mostly copies take.
struct SimBackend::KernelTraffic {
  std::uint64_t ready = 0;
  std::uint64_t remote_in = 0, remote_out = 0, collapse_faults = 0;
};

void SimBackend::run(std::uint32_t index) {
  const KernelRecord& k = trace_.kernels[index];
  if (k.host) {
    run_host(k);
    return;
  }
  const ChunkTouch* touches = trace_.touches.data();
  ++epoch_;
  for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) chunks_.pin[touches[j].chunk] = epoch_;
  const std::uint64_t t0 = clock_.compute;
  KernelTraffic traffic;
  traffic.ready = t0;
  missing_.clear();
  for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) serve_touch(j, traffic);
  stats_.wait_ns += traffic.ready - t0;
  const std::uint64_t t = service_faults(traffic);
  finish_kernel(k, t, copy_remote(t, traffic));
}

// The CPU touches managed data: chunks on the GPU fault back to the host (CPU faults at the
// fault-path rate), after the GPU has finished what it was doing. The copies hold the D2H
// engine, after what it was already doing.
void SimBackend::run_host(const KernelRecord& k) {
  const ChunkTouch* touches = trace_.touches.data();
  std::uint64_t t = clock_.compute;
  for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
    std::uint32_t c = touches[j].chunk;
    if (chunks_.state[c] == gpu) {
      t = std::max({t, chunks_.ready[c], clock_.d2h}) + copy_ns(params_.link.d2h_bytes_per_s / std::max(1.0, params_.fault_slowdown), kChunkBytes);
      clock_.d2h = t;
      stats_.d2h_bytes += kChunkBytes;
      ++stats_.faults;
      leave(c);
      ++stats_.chunks_evicted;
      chunks_.state[c] = cpu;
    } else if (chunks_.state[c] == fresh) {
      chunks_.state[c] = cpu;
    }
  }
  clock_.compute = t;
}

// Touch `j` of the kernel: on a resident chunk, over the link (advice), or missing.
void SimBackend::serve_touch(std::uint32_t j, KernelTraffic& traffic) {
  const ChunkTouch& tt = trace_.touches.data()[j];
  std::uint32_t c = tt.chunk;
  std::uint8_t f = chunks_.flags[c];
  if (chunks_.state[c] == gpu) {
    touch_resident(tt, f, traffic);
  } else if ((f & prefer_cpu) || ((f & accessed_by) && chunks_.state[c] == cpu)) {
    serve_remotely(tt, traffic);
  } else {
    missing_.push_back(j);
  }
}

// A touch of a resident chunk (flags `f`): the kernel waits for its data.
void SimBackend::touch_resident(const ChunkTouch& tt, std::uint8_t f, KernelTraffic& traffic) {
  std::uint32_t c = tt.chunk;
  if (chunks_.ready[c] > traffic.ready) traffic.ready = chunks_.ready[c];
  // A write to a read-mostly copy faults (it is mapped read-only) and the driver collapses
  // the copies: the CPU's is invalidated, no data moves.
  if (tt.write && (f & read_mostly) && !(f & dirty)) {
    traffic.collapse_faults += (tt.write_bytes + params_.fault_granularity_bytes - 1) / params_.fault_granularity_bytes;
    ++stats_.collapses;
    if (faults_.taken) faults_.pending.push_back(FaultRecord{launch_seq_, trace_.absolute_chunk(c) * kChunkBytes, true});
  }
  if (f & unused_prefetch) {
    stats_.prefetch_used_bytes += kChunkBytes;
    chunks_.flags[c] = f & static_cast<std::uint8_t>(~unused_prefetch);
  }
}

// A touch served over the link: its reads come in, its writes go out; a chunk never touched
// before is then made on the host (its pages are created where they are touched).
void SimBackend::serve_remotely(const ChunkTouch& tt, KernelTraffic& traffic) {
  traffic.remote_in += tt.read_bytes;
  traffic.remote_out += tt.write_bytes;
  if (chunks_.state[tt.chunk] == fresh) chunks_.state[tt.chunk] = cpu;
}

// The missing chunks: each takes a slot and faults in (a fresh one is only created), in
// batches of faults; returns when the kernel's faults are serviced.
std::uint64_t SimBackend::service_faults(KernelTraffic& traffic) {
  const ChunkTouch* touches = trace_.touches.data();
  std::uint64_t t = traffic.ready, faults = traffic.collapse_faults, fault_copy = 0;
  for (std::uint32_t j : missing_) {
    const ChunkTouch& tt = touches[j];
    std::uint32_t c = tt.chunk;
    std::uint64_t slot = acquire_slot(t);
    if (slot == kNoSlot) {  // the kernel's footprint exceeds the GPU: the rest is served remotely
      serve_remotely(tt, traffic);
      continue;
    }
    t = std::max(t, slot);
    if (faults_.taken) faults_.pending.push_back(FaultRecord{launch_seq_, trace_.absolute_chunk(c) * kChunkBytes, tt.write});
    if (chunks_.state[c] != fresh) {
      std::uint64_t pages = (tt.bytes + params_.fault_granularity_bytes - 1) / params_.fault_granularity_bytes;
      faults += std::min<std::uint64_t>(pages, density_pages_);
      // The fault path's copy holds the H2D engine, after the copies issued before it.
      t = std::max(t, clock_.h2d) + copy_ns(fault_bw_, kChunkBytes);
      clock_.h2d = t;
      fault_copy += kChunkBytes;
    }
    make_resident(c, t);
  }
  if (faults > 0) {
    std::uint64_t batches = (faults + params_.fault_batch_size - 1) / params_.fault_batch_size;
    t += batches * params_.link.fault_batch_ns;
    stats_.faults += faults;
    stats_.fault_batches += batches;
  }
  if (fault_copy > 0) {
    stats_.h2d_bytes += fault_copy;
    faults_.in_bytes += fault_copy;
  }
  stats_.fault_stall_ns += t - traffic.ready;
  if (rec_.on && t > traffic.ready) rec_.spans.push_back({Span::fault, 0, traffic.ready, t - traffic.ready});
  return t;
}

// Remote reads and writes cross the link on its copy engines, after what each was already
// doing; the kernel runs when they are done (it slows by the bytes it touches remotely over
// the link's bandwidth). Returns when they are.
std::uint64_t SimBackend::copy_remote(std::uint64_t t, const KernelTraffic& traffic) {
  std::uint64_t remote_done = t;
  if (traffic.remote_in > 0) {
    clock_.h2d = std::max(t, clock_.h2d) + copy_ns(params_.link.h2d_bytes_per_s * std::min(1.0, params_.remote_efficiency), traffic.remote_in);
    remote_done = std::max(remote_done, clock_.h2d);
  }
  if (traffic.remote_out > 0) {
    clock_.d2h = std::max(t, clock_.d2h) + copy_ns(params_.link.d2h_bytes_per_s * std::min(1.0, params_.remote_efficiency), traffic.remote_out);
    remote_done = std::max(remote_done, clock_.d2h);
  }
  stats_.remote_bytes += traffic.remote_in + traffic.remote_out;
  stats_.h2d_bytes += traffic.remote_in;
  stats_.d2h_bytes += traffic.remote_out;
  return remote_done;
}

// The kernel computes from `remote_done` (its span starts at `t`, when its faults are
// serviced); the chunks it writes are dirty.
void SimBackend::finish_kernel(const KernelRecord& k, std::uint64_t t, std::uint64_t remote_done) {
  const ChunkTouch* touches = trace_.touches.data();
  std::uint64_t end = remote_done + k.dur_ns;
  if (rec_.on) rec_.spans.push_back({Span::compute, k.name, t, end - t});
  for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
    if (touches[j].write) chunks_.flags[touches[j].chunk] |= dirty;
  }
  stats_.compute_ns += k.dur_ns;
  clock_.compute = end;
}

const SimStats& SimBackend::stats() {
  stats_.time_ns = clock_.compute;
  stats_.resident_chunks = resident_;
  return stats_;
}

std::size_t SimBackend::take_faults(std::vector<FaultRecord>& out) {
  faults_.taken = params_.fault_feedback;  // (recorded only once a policy takes them)
  const std::size_t n = faults_.pending.size();
  out.insert(out.end(), faults_.pending.begin(), faults_.pending.end());
  faults_.pending.clear();
  return n;
}

void SimBackend::migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) {
  *to_gpu = faults_.in_bytes;
  *to_host = faults_.driver_out_bytes;
}

}  // namespace spillway::sim
