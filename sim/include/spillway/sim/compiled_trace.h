// A trace prepared for simulation: every block placed at the address a caching allocator
// would give it (docs/simulator.md, "The model"), every kernel's footprint as address ranges (what a Policy
// sees) and as per-chunk touches (what the simulated GPU needs), the peak footprint, the
// future as the oracle and the lower bound see it. Compiled once per trace, then shared
// read-only by any number of simulations (thread-safe to read).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "spillway/policy.h"
#include "spillway/spill_array.h"
#include "spillway/trace.h"

namespace spillway::sim {

// Where the simulated arena starts: a 2 MiB-aligned address in the range CUDA hands out.
inline constexpr std::uint64_t kArenaBase = 0x7f0000000000ull;
inline constexpr std::uint32_t kNever = std::numeric_limits<std::uint32_t>::max();

// One block instance (one `alloc`), in allocation order ("alloc sequence" = its index).
struct BlockPlacement {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  std::uint32_t first_chunk = 0;  // relative chunk index (0 = the chunk at kArenaBase)
  std::uint32_t chunks = 0;
  bool fresh = true;              // no live block shared its chunks when it came to life (`spillway`:
                                  // a small block may land in a slab other live blocks use)
};

// One chunk touched by a kernel or host event (duplicates within the event merged).
struct ChunkTouch {
  std::uint32_t chunk = 0;          // relative chunk index
  std::uint32_t bytes = 0;          // bytes of the chunk touched (<= 2 MiB)
  std::uint32_t next = kNever;      // index (in touches) of the next kernel touch of this chunk
                                    // within the same block instance, or kNever
  std::uint32_t block = 0;          // alloc sequence of the block holding the chunk
  std::uint32_t next_read = kNever; // index of the next kernel touch of this chunk (same block
                                    // instance) that reads it, or kNever (MIN's next use)
  std::uint32_t read_bytes = 0;     // of `bytes`, those the event's reads name (<= 2 MiB)
  std::uint32_t write_bytes = 0;    // of `bytes`, those its writes name (<= 2 MiB)
  bool write = false;               // write_bytes > 0
  bool first_touch = false;         // first touch since the block's alloc (costs no transfer)
  bool host = false;                // the touch of a `host` event (the CPU), not of a kernel
};

struct KernelRecord {
  std::uint32_t name = 0;           // index into CompiledTrace::names
  std::uint64_t dur_ns = 0;
  std::uint64_t exec_id = 0;        // hash of name and accessed addresses (DeepUM's execution id)
  std::uint32_t access_begin = 0, access_end = 0;  // into accesses
  std::uint32_t touch_begin = 0, touch_end = 0;    // into touches
  bool host = false;                // a `host` event (CPU touches), not a kernel
  std::uint64_t line = 0;
};

struct Op {
  // tensor_alloc/tensor_free (`pytorch-tracked`): a tensor the framework reports in one of
  // its segments (Engine::note_tensor_alloc/free); the segment itself is an `alloc`.
  enum class Kind : std::uint8_t { alloc, free, kernel, host, iter, tensor_alloc, tensor_free } kind;
  std::uint32_t index;  // alloc/free/tensor_*: block (alloc sequence); kernel/host: kernel record; iter: n
};

// What the Engine and the Policy see of a trace's blocks (docs/simulator.md, "Allocator
// views"): `none`, one block per trace id, each on chunks of its own, every free seen (today's
// view); `pytorch`, what the shim sees under PyTorch's caching allocator
// (caching_allocator.h): the segments it cudaMallocs, never freed, and each kernel's footprint
// as the launch hook infers it from pointers into them (spillway/footprint.h); `spillway`,
// what the shim sees of a framework in its per-tensor mode (spillway run): every tensor a
// block with its exact extent and its free, placed by the shim's own sub-allocator
// (spillway/sub_allocator.h, the same code) in ranges of Engine::kRangeBytes, so small tensors
// share chunks; a freed range is reused at once (the simulated kernels before a free have
// completed, so the shim's fence after it would have too) and a chunk no live block holds any
// more is dropped at no cost (the shim's discard). The simulated GPU charges the trace's true
// accesses in every view (the tensors' bytes, wherever the view places them). `pytorch-exact`:
// `pytorch` with each kernel's accesses its tensors' true ranges instead of the scan's guess —
// what perfect extent learning would reach under the cache (the dead data and the missing
// frees remain). `pytorch-tracked`: what the shim sees under the cache with PyTorch's
// allocator trace followed (CUDACachingAllocator's attachAllocatorTraceTracker;
// Engine::follow_segment): the segments and placement of `pytorch`, the segments the
// Engine's blocks, and every tensor in them reported to the Engine with its exact extent and
// its free (Op::Kind::tensor_alloc/tensor_free), so each kernel's accesses are its tensors'
// true ranges; as under `pytorch`, a dead tensor's data stays in its segment (the Engine
// discards nothing), written back when its chunk is evicted.
enum class AllocatorView { none, pytorch, spillway, pytorch_exact, pytorch_tracked };
const char* to_string(AllocatorView view);
// "none", "pytorch", "spillway", "pytorch-exact" or "pytorch-tracked"; nullopt otherwise.
std::optional<AllocatorView> parse_allocator_view(const std::string& text);

// The per-event arrays are SpillArrays (spillway/spill_array.h): kept in a file mapped into
// memory, so a long trace costs disk, not memory; whoever walks them in order calls
// release_behind() now and then, and the process holds only the part it is working on.
struct CompiledTrace {
  std::string path;
  AllocatorView allocator = AllocatorView::none;
  std::string name;       // file name without .jsonl(.gz)
  nlohmann::json header;
  SpillArray<Op> ops;                 // what the Engine sees, in order
  SpillArray<BlockPlacement> blocks;  // the Engine's blocks (`pytorch*`: segments; `pytorch-tracked`: and the tensors)
  SpillArray<KernelRecord> kernels;   // kernels and host events, in trace order
  SpillArray<Access> accesses;        // per kernel: the address ranges (Policy view)
  SpillArray<ChunkTouch> touches;     // per kernel: the chunks (GPU view)
  std::vector<std::string> names;     // distinct kernel names
  std::uint32_t arena_chunks = 0;      // relative chunk indices are < arena_chunks
  // `spillway`: the sub-allocator's ranges, each one managed allocation, as (first chunk,
  // chunks), relative, by address (never freed: the view keeps its ranges to the end).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  std::uint64_t peak_bytes = 0;        // max over time of the trace's live blocks rounded up to 2 MiB
                                       // chunks (the same in every view)
  std::uint64_t segment_bytes = 0;     // `pytorch*`: the bytes of all segments (never freed)
  std::uint64_t compute_ns = 0;        // sum of kernel durations
  std::uint64_t kernel_count = 0;

  ChunkIndex absolute_chunk(std::uint32_t relative) const { return kArenaBase / kChunkBytes + relative; }
  // Drops the memory of what lies before op `op`, kernel record `kernel` (and its accesses
  // and touches) and block `block`; the data stay in the spill files (an access reads them
  // back). For readers that walk the trace in order. Thread-safe with other readers.
  void release_behind(std::size_t op, std::size_t kernel, std::size_t block) const;
};

// Calls f(op) for each op of `trace` in order, dropping the memory of what the walk has
// passed every 65 536 ops (CompiledTrace::release_behind); what lies behind the last op is
// the caller's to release.
template <typename F>
void for_each_op(const CompiledTrace& trace, F&& f) {
  std::size_t op_no = 0, kernel_no = 0, block_no = 0;
  for (const Op& op : trace.ops) {
    if ((++op_no & 0xffff) == 0) trace.release_behind(op_no - 1, kernel_no, block_no);
    if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) kernel_no = op.index;
    if (op.kind == Op::Kind::alloc || op.kind == Op::Kind::tensor_alloc) block_no = op.index;
    f(op);
  }
}

// Compiles a trace. Addresses: a trace's `addr` is ignored (the trace's own addresses came
// from another process); every block gets whole 2 MiB chunks of its own, freed ranges are
// reused best-fit (smallest free range that fits, lowest address among equals; adjacent free
// ranges merge; the arena grows only when nothing fits), as PyTorch's caching allocator
// reuses its segments, so a training loop's addresses repeat every iteration.
// Under `pytorch` the blocks are the segments of caching_allocator.h, placed the same way
// (each on whole chunks; never freed), the trace's blocks lie inside them, and a kernel's
// accesses are footprint_of() its pointers (one per range: the block's address plus the
// range's offset), all reads, as the shim would see them; its touches are its true ranges.
CompiledTrace compile(const trace::Trace& trace, AllocatorView view = AllocatorView::none);
// Reads (trace::read_trace) and compiles. Throws trace::TraceError.
CompiledTrace compile_file(const std::string& path, AllocatorView view = AllocatorView::none);

// MIN_H2D of the lower bound (docs/simulator.md, "The lower bound"): the misses under Belady's MIN with bypass at
// `capacity_chunks`, over the kernels' chunk touches that read, in order (a touch that only
// writes needs no data: it may be written remotely; a next use is the next kernel touch that
// reads). The first touch of a chunk after its block's alloc is free; a freed block's chunks
// leave at no cost; a missing chunk whose next use is later than every resident chunk's (or
// never) is read remotely and not kept. `chunks` counts the misses; `bytes` is the least any
// policy can move for them: MIN minimises the count of misses, not their bytes, so `bytes`
// is the sum of the `chunks` cheapest requests that could miss (non-first reads), each
// charged the cheaper of a 2 MiB fetch and a remote read of the bytes it reads (the same as
// chunks x 2 MiB when kernels read whole chunks). O(touches log capacity).
struct MinFetch {
  std::uint64_t chunks = 0;
  std::uint64_t bytes = 0;
};
// With `hits`, also stores per touch (index in trace.touches) whether MIN found its chunk
// resident there (true) or fetched it, read it remotely or first-touched it (false); host
// touches are false.
MinFetch min_fetch(const CompiledTrace& trace, std::uint64_t capacity_chunks, std::vector<bool>* hits = nullptr);
// Belady's MIN as the simulated GPU can follow it (the oracle's guide, not a bound): every
// kernel touch, writes included, makes its chunk resident (no bypass, no remote access), a
// next use is the next kernel touch of any kind, and the resident chunk used furthest in the
// future leaves when room is needed. Per touch (index in trace.touches): whether its chunk
// was resident there. O(touches log capacity).
std::vector<bool> min_resident_hits(const CompiledTrace& trace, std::uint64_t capacity_chunks);
// min_fetch(...).chunks.
std::uint64_t min_fetches(const CompiledTrace& trace, std::uint64_t capacity_chunks);

}  // namespace spillway::sim
