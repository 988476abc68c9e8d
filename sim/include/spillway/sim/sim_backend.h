// SimBackend: the Engine's Backend over a simulated GPU (docs/simulator.md, "The model").
// Time is simulated, in ns. One compute stream runs kernels in trace order; one H2D and one
// D2H copy engine each move data in issue order at the link's bandwidth, overlapping compute
// (the chunks of one move call at the rate the link's call shape gives a call that long):
// H2D carries prefetches, fault migrations and remote reads; D2H carries write-backs, remote
// writes and the host's faults (the bound, spillway/sim/bound.h, relies on this).
// Residency is per 2 MiB chunk. A kernel that touches a chunk that is neither resident nor
// arriving faults; faults are serviced in batches, and fault-driven migration runs slower
// than a prefetch. When the GPU is full the driver evicts root chunks oldest-migrated-first.
// Advice: accessed-by GPU on a chunk that is not resident, or preferred location CPU, makes
// the GPU access it remotely over the link (a fresh chunk so touched is then on the host);
// read-mostly makes eviction of an unwritten chunk free, and a write to such a resident copy
// faults (a fault per 64 KiB written, in the kernel's fault batches) to collapse the copies.
// Deterministic: no clocks, no randomness, no hashing of pointers.
//
// Not thread-safe: one simulation per instance (run many instances in parallel).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "spillway/backend.h"
#include "spillway/sim/compiled_trace.h"
#include "spillway/sim/params.h"

namespace spillway::sim {

// Counters of one simulation. Bytes are bytes, times ns.
struct SimStats {
  std::uint64_t time_ns = 0;           // end of the last kernel
  std::uint64_t compute_ns = 0;        // sum of kernel durations
  std::uint64_t h2d_bytes = 0;         // prefetched + fault-migrated + read remotely
  std::uint64_t d2h_bytes = 0;         // written back on eviction (Engine's or the driver's) + written remotely + host faults
  std::uint64_t faults = 0;            // GPU faults at fault granularity (after the density prefetcher; with collapses')
  std::uint64_t clean_drops = 0;       // evictions of an unwritten read-mostly chunk: no write-back
  std::uint64_t collapses = 0;         // writes to a resident, unwritten read-mostly chunk (its copies collapse)
  std::uint64_t fault_batches = 0;
  std::uint64_t fault_stall_ns = 0;    // time kernels waited for faults
  std::uint64_t wait_ns = 0;           // time kernels waited for prefetches still in flight
  std::uint64_t prefetch_bytes = 0;    // H2D bytes copied by explicit prefetches
  std::uint64_t prefetch_used_bytes = 0;  // of those, chunks a kernel touched before eviction
  std::uint64_t remote_bytes = 0;      // bytes read or written remotely (zero-copy)
  std::uint64_t driver_evictions = 0;  // chunks the driver evicted (GPU full)
  std::uint64_t chunks_in = 0;         // chunks that became resident (copied or first-touch populated)
  std::uint64_t chunks_evicted = 0;    // chunks that left by eviction (any)
  std::uint64_t chunks_dropped = 0;    // resident chunks dropped because their block was freed
  std::uint64_t resident_chunks = 0;   // resident now
  std::uint64_t peak_occupied_chunks = 0;  // max of resident + evictions still copying out
};

// A span on the timeline (Chrome/Perfetto trace-event "X" events).
struct Span {
  enum Track : std::uint8_t { compute, h2d, d2h, fault } track;
  std::uint32_t label;  // kernel: index into CompiledTrace::names; else unused
  std::uint64_t start_ns;
  std::uint64_t dur_ns;
};

// One move call of the Engine (Backend::prefetch) as the simulator charged it; recorded with
// the timeline (`spillway replay --calls`).
struct MoveCall {
  Location to;
  std::uint64_t offset;         // of the call's range from the trace's arena base, bytes
  std::uint64_t bytes;          // the call's range, bytes
  std::uint64_t copied_chunks;  // chunks it copied (the others were already there, or fresh)
  std::uint64_t issue_ns;       // simulated time it was issued
  std::uint64_t charged_ns;     // copy-engine time charged to it: copied_chunks equal shares
  std::uint64_t batch = 0;      // the batched prefetch it was a range of (1, 2, ... in issue order); 0: a call of its own
};

class SimBackend final : public Backend {
 public:
  // `trace` must outlive the backend. With `record_spans`, keeps a timeline (spans()) and the
  // Engine's move calls (calls()).
  SimBackend(const CompiledTrace& trace, const SimParams& params, bool record_spans = false);

  // --- Backend ---
  Result memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override;
  std::uint64_t host_memory_bytes() override;
  bool concurrent_managed_access() override { return true; }
  int current_device() override { return 0; }
  // Returns the address the compiled trace placed the next block at (expect_block()).
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override;
  bool blocks_share_ranges() override { return trace_.allocator == AllocatorView::spillway; }
  // (`spillway`) Both in one of the compiled trace's ranges. O(log ranges).
  bool same_managed_allocation(std::uint64_t a, std::uint64_t b) override;
  // Drops the block's chunks that no other live block holds, at no cost (its data is dead).
  Result free_managed(std::uint64_t addr) override;
  // Issued now(): toward the GPU on the H2D engine, toward the CPU on the D2H engine.
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) override;
  // Where the link's call shape measured batches (CallShape::h2d_batch_share), toward the GPU:
  // each range is charged as its own call less what a batch saves (batched_call_ns).
  bool can_batch_prefetches() override { return params_.link.calls.h2d_batch_share > 0; }
  Result prefetch_batch(const std::uint64_t* addrs, const std::uint64_t* bytes, std::size_t count, Location to,
                        int device) override;
  Result advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where, int device) override;
  Result capture_status(StreamHandle, bool* capturing) override {
    *capturing = false;
    return Result{};
  }
  Result record_event(StreamHandle, EventHandle* event) override;
  Result event_done(EventHandle) override { return {}; }
  void destroy_event(EventHandle) override {}
  Result wait_event(EventHandle) override { return {}; }
  // Fault feedback (SimParams::fault_feedback): one record per chunk a kernel faulted on or
  // first touched (the driver reports a GPU page fault for both), at the chunk's base, for the
  // launch named by the last begin_launch(), from the first take_faults() on (so that a
  // policy that never takes them costs no memory); the bytes fault-migrated each way.
  bool fault_feedback() override { return params_.fault_feedback; }
  std::size_t take_faults(std::vector<FaultRecord>& out) override;
  std::string fault_feedback_state() override { return params_.fault_feedback ? "simulator" : "off: --fault-feedback off"; }
  std::string framework_trace_state() override {
    return trace_.allocator == AllocatorView::pytorch_tracked ? "simulator" : "off: the allocator view is not pytorch-tracked";
  }
  void migrated_bytes(std::uint64_t* to_gpu, std::uint64_t* to_host) override;
  void begin_launch(std::uint64_t seq) override { launch_seq_ = seq; }

  // --- driven by the simulator ---
  // The next allocate_managed() is block `alloc_seq` of the compiled trace.
  void expect_block(std::uint32_t alloc_seq) { expected_block_ = alloc_seq; }
  // Runs kernel (or host event) record `index`: waits for arriving chunks, services faults,
  // reads and writes remote chunks, computes. Advances now() to its end.
  void run(std::uint32_t index);
  // Simulated time at which the host issues the next launch's decisions: the end of the
  // previous kernel (the host keeps up with the GPU; policies provide the run-ahead).
  std::uint64_t now() const { return clock_.compute; }
  const SimStats& stats();
  const std::vector<Span>& spans() const { return rec_.spans; }
  std::vector<Span> take_spans() { return std::move(rec_.spans); }  // (leaves none)
  std::vector<MoveCall> take_calls() { return std::move(rec_.calls); }  // (leaves none)
  std::uint64_t capacity_chunks() const { return capacity_chunks_; }

 private:
  enum State : std::uint8_t { fresh = 0, cpu = 1, gpu = 2 };
  enum Flag : std::uint8_t {
    accessed_by = 1,
    prefer_cpu = 2,
    read_mostly = 4,
    dirty = 8,          // written since it became resident
    unused_prefetch = 16,
  };
  static constexpr std::uint64_t kNoSlot = ~0ull;

  void retire(std::uint64_t t);
  std::uint64_t acquire_slot(std::uint64_t t);
  // Copies chunk c to the host over D2H, holding the engine `copy` ns; returns when done.
  std::uint64_t write_back(std::uint32_t c, std::uint64_t not_before, std::uint64_t copy);
  void make_resident(std::uint32_t c, std::uint64_t ready);
  void leave(std::uint32_t c);
  void prefetch_in(std::uint32_t c, std::uint64_t now, std::uint64_t copy);
  void evict(std::uint32_t c, std::uint64_t now, std::uint64_t copy);
  std::uint64_t call_chunk_ns(Location to, std::uint64_t moving, bool batched = false) const;
  Result move_range(std::uint64_t addr, std::uint64_t bytes, Location to, bool batched);
  std::uint64_t chunks_to_copy(std::uint64_t first, std::uint64_t last, Location to) const;
  void note_occupancy();
  std::uint64_t copy_ns(double bytes_per_s, std::uint64_t bytes) const;
  // The steps of run(): a host event; for a kernel, each touch served where its chunk is
  // (resident, remote) or queued as missing, the missing chunks' faults, the remote copies,
  // the kernel itself.
  struct KernelTraffic;  // sim_backend.cpp
  void run_host(const KernelRecord& k);
  void serve_touch(std::uint32_t j, KernelTraffic& traffic);
  void touch_resident(const ChunkTouch& tt, std::uint8_t f, KernelTraffic& traffic);
  void serve_remotely(const ChunkTouch& tt, KernelTraffic& traffic);
  std::uint64_t service_faults(KernelTraffic& traffic);
  std::uint64_t copy_remote(std::uint64_t t, const KernelTraffic& traffic);
  void finish_kernel(const KernelRecord& k, std::uint64_t t, std::uint64_t remote_done);

  const CompiledTrace& trace_;
  SimParams params_;
  std::uint64_t capacity_chunks_;
  double fault_bw_;
  std::uint32_t density_pages_;  // faults per chunk before the density prefetcher takes the rest
  std::uint32_t expected_block_ = 0;
  std::unordered_map<std::uint64_t, std::uint32_t> live_addr_;  // live block's address -> alloc sequence

  // Per chunk, indexed by chunk number.
  struct Chunks {
    std::vector<std::uint8_t> state;       // State
    std::vector<std::uint8_t> flags;       // Flag bits
    std::vector<std::uint64_t> ready;      // gpu: when the chunk's data is there, ns
    std::vector<std::uint64_t> mig_seq;    // gpu: migration order (driver's eviction list)
    std::vector<std::uint32_t> pin;        // epoch of the kernel being run that touches it
    std::vector<std::uint32_t> live_count; // live blocks on it (`spillway` blocks share chunks)
  };
  Chunks chunks_;
  std::deque<std::pair<std::uint32_t, std::uint64_t>> fifo_;  // (chunk, mig_seq), oldest first
  std::deque<std::uint64_t> leaving_;    // completion times of evictions still copying out
  std::uint64_t next_mig_ = 1;
  std::uint32_t epoch_ = 0;
  std::uint64_t resident_ = 0;

  // When each engine is next free, ns of simulated time: the SMs and the two copy directions.
  struct Clocks {
    std::uint64_t compute = 0, h2d = 0, d2h = 0;
  };
  Clocks clock_;
  SimStats stats_;
  // The timeline and the move calls, kept only when asked for (they grow with the trace).
  struct Recording {
    bool on = false;
    std::vector<Span> spans;
    std::vector<MoveCall> calls;
    std::uint64_t batches = 0;  // batched prefetches so far
    std::uint64_t batch = 0;    // the one being charged, 0: none
  };
  Recording rec_;
  std::vector<std::uint32_t> missing_;
  std::uint64_t launch_seq_ = 0;
  // The GPU page faults of the run, as the driver would report them (take_faults).
  struct Faults {
    std::vector<FaultRecord> pending;  // not yet taken
    bool taken = false;                // a policy takes them (recorded only then)
    std::uint64_t in_bytes = 0, driver_out_bytes = 0;
  };
  Faults faults_;
};

}  // namespace spillway::sim
