#include "spillway/sim/compiled_trace.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "spillway/footprint.h"
#include "spillway/free_runs.h"
#include "spillway/engine.h"
#include "spillway/sim/caching_allocator.h"
#include "spillway/sub_allocator.h"
#include "spillway/size.h"

namespace spillway::sim {

namespace {
// The simulated address space (2^24 chunks = 32 TiB) and the total kernel time (2^62 ns)
// a trace may need: per-chunk tables stay within memory, times within 64 bits.
constexpr std::uint64_t kMaxArenaChunks = 1ull << 24;
constexpr std::uint64_t kMaxComputeNs = 1ull << 62;


// Best-fit placement of blocks on whole chunks, in chunk units (spillway/free_runs.h: the
// rule the shim's sub-allocator places large blocks by); the arena grows only when nothing
// fits, starting inside a free run that ends at the top.
class ChunkAllocator {
 public:
  std::uint32_t allocate(std::uint32_t n) {
    if (auto start = free_.take(n)) return static_cast<std::uint32_t>(*start);
    const std::uint32_t start = static_cast<std::uint32_t>(free_.take_ending_at(top_).value_or(top_));
    top_ = start + n;
    return start;
  }
  void release(std::uint32_t start, std::uint32_t n) { free_.give(start, n); }
  std::uint32_t top() const { return top_; }

 private:
  FreeRuns free_;
  std::uint32_t top_ = 0;
};

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64-style combination: deterministic across runs and platforms.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 29);
}

std::string base_name(const std::string& path) {
  std::string n = std::filesystem::path(path).filename().string();
  for (const char* suffix : {".gz", ".jsonl"}) {
    std::string s(suffix);
    if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0) n.resize(n.size() - s.size());
  }
  return n;
}

}  // namespace

const char* to_string(AllocatorView view) {
  switch (view) {
    case AllocatorView::pytorch: return "pytorch";
    case AllocatorView::pytorch_exact: return "pytorch-exact";
    case AllocatorView::spillway: return "spillway";
    case AllocatorView::pytorch_tracked: return "pytorch-tracked";
    case AllocatorView::none: break;
  }
  return "none";
}

std::optional<AllocatorView> parse_allocator_view(const std::string& text) {
  if (text == "none") return AllocatorView::none;
  if (text == "pytorch") return AllocatorView::pytorch;
  if (text == "pytorch-exact") return AllocatorView::pytorch_exact;
  if (text == "spillway") return AllocatorView::spillway;
  if (text == "pytorch-tracked") return AllocatorView::pytorch_tracked;
  return std::nullopt;
}

namespace {

// The trace's events one at a time (`next` returns nullptr at the end): a Trace in memory,
// or a Reader streaming the file, so that compile_file() never holds the events (the
// compiled form is what stays).
struct EventSource {
  std::string path;
  nlohmann::json header;
  std::function<const trace::Event*()> next;
};

// The backward pass's release: everything from op `i` on (and the kernels, accesses and
// touches of the ops after it).
void release_from(const CompiledTrace& ct, std::size_t i) {
  std::size_t kernel = ct.kernels.size();
  for (std::size_t j = i; j < ct.ops.size() && j < i + 64; ++j) {
    if (ct.ops[j].kind == Op::Kind::kernel || ct.ops[j].kind == Op::Kind::host) {
      kernel = ct.ops[j].index;
      break;
    }
  }
  ct.ops.release(i, ct.ops.size());
  if (kernel < ct.kernels.size()) {
    ct.accesses.release(ct.kernels[kernel].access_begin, ct.accesses.size());
    ct.touches.release(ct.kernels[kernel].touch_begin, ct.touches.size());
  }
  ct.kernels.release(kernel, ct.kernels.size());
}

// A kernel's (or host event's) record while its ranges are added, with its execution id as
// hashed so far.
struct KernelDraft {
  KernelRecord record;
  std::uint64_t exec_id = 0;
};

// The first pass of compile_events: places the blocks of the trace's events as the view's
// allocator would and records the ops, kernels, accesses and touches, in trace order.
class EventCompiler {
 public:
  EventCompiler(const EventSource& source, AllocatorView view, CompiledTrace& ct)
      : source_(source),
        ct_(ct),
        segments_(view == AllocatorView::pytorch || view == AllocatorView::pytorch_exact),
        exact_(view == AllocatorView::pytorch_exact),
        carved_(view == AllocatorView::spillway),
        tracked_(view == AllocatorView::pytorch_tracked) {}

  void add(const trace::Event& e) {
    switch (e.kind) {
      case trace::EventKind::alloc: add_alloc(e); break;
      case trace::EventKind::free: add_free(e); break;
      case trace::EventKind::kernel:
      case trace::EventKind::host: add_kernel(e); break;
      case trace::EventKind::iter: ct_.ops.push_back({Op::Kind::iter, static_cast<std::uint32_t>(e.n)}); break;
    }
  }
  std::uint32_t arena_chunks() const { return arena_.top(); }

 private:
  struct Tensor {
    PytorchCachingAllocator::Placement place;
    std::uint64_t addr = 0;   // its address inside its segment
    std::uint64_t bytes = 0;  // as the trace allocated it
  };

  void add_alloc(const trace::Event& e);
  std::uint32_t add_tensor(const trace::Event& e);
  std::uint32_t add_followed_tensor(const trace::Event& e);
  void add_free(const trace::Event& e);
  void add_kernel(const trace::Event& e);
  void add_range(const trace::Range& r, bool write, KernelDraft& k);
  void add_touches(std::uint64_t addr, std::uint64_t bytes, bool write, std::uint32_t seq, bool host);
  void add_scanned_footprint(KernelDraft& k);
  void count_kernel_time(const KernelRecord& k, std::uint64_t line);
  std::uint32_t carve_block(std::uint64_t bytes, std::uint64_t site, std::uint64_t line);
  std::uint32_t place_block(std::uint64_t bytes, std::uint64_t line);
  void check_arena(std::uint64_t line) const;
  void grow(std::uint32_t chunks);

  const EventSource& source_;
  CompiledTrace& ct_;
  const bool segments_;  // `pytorch`, `pytorch-exact`: the blocks are the framework's segments
  const bool exact_;     // the tensors' true ranges, not the scan's guess
  const bool carved_;    // `spillway`
  const bool tracked_;   // `pytorch-tracked`: the segments are blocks, the tensors reported in them
  PytorchCachingAllocator framework_;  // (`pytorch`, `pytorch-tracked`)
  SubAllocator shim_;                  // (`spillway`): the shim's sub-allocator over arena ranges
  std::vector<std::uint32_t> chunk_live_;  // (`spillway`) per chunk: live blocks on it
  std::unordered_map<std::uint64_t, Tensor> tensors_;  // trace id -> placement (`pytorch`, `pytorch-tracked`)
  std::vector<std::uint32_t> segment_seq_;             // segment -> its block (alloc sequence)
  std::vector<ArgumentHit> hits_;                      // a kernel's pointers (`pytorch`)
  ChunkAllocator arena_;
  std::unordered_map<std::uint64_t, std::uint32_t> live_;  // trace id -> alloc sequence
  std::unordered_map<std::string, std::uint32_t> name_index_;
  std::vector<std::uint32_t> merge_at_;     // per chunk: position in touches of this event's touch
  std::vector<std::uint32_t> merge_epoch_;  // per chunk: event that wrote merge_at
  std::vector<std::uint32_t> owner_;        // per chunk: the block (alloc sequence) on it now
  std::uint64_t live_chunk_bytes_ = 0;
  std::uint32_t event_no_ = 0;
};

void EventCompiler::grow(std::uint32_t chunks) {
  if (chunks > merge_at_.size()) {
    merge_at_.resize(chunks, 0);
    merge_epoch_.resize(chunks, kNever);
    owner_.resize(chunks, kNever);
    chunk_live_.resize(chunks, 0);
  }
}

void EventCompiler::check_arena(std::uint64_t line) const {
  if (arena_.top() > kMaxArenaChunks) {
    throw trace::TraceError(source_.path, line,
                            fmt::format("the blocks live at once need more than the simulator's {} of address space",
                                        format_bytes(kMaxArenaChunks * kChunkBytes)));
  }
}

// (`spillway`) A tensor carved by the sub-allocator; a new range is taken from the arena
// when none has room (Engine::kRangeBytes, as the shim's Engine asks its Backend).
std::uint32_t EventCompiler::carve_block(std::uint64_t bytes, std::uint64_t site, std::uint64_t line) {
  std::uint64_t addr = shim_.allocate(bytes, site);
  if (addr == 0) {
    const std::uint64_t range = SubAllocator::range_bytes_for(bytes, Engine::kRangeBytes);
    const std::uint32_t start = arena_.allocate(static_cast<std::uint32_t>(range / kChunkBytes));
    check_arena(line);
    grow(arena_.top());
    shim_.add_range(kArenaBase + std::uint64_t(start) * kChunkBytes, range);
    ct_.ranges.emplace_back(start, static_cast<std::uint32_t>(range / kChunkBytes));
    addr = shim_.allocate(bytes, site);
  }
  const std::uint32_t first = static_cast<std::uint32_t>((addr - kArenaBase) / kChunkBytes);
  const std::uint32_t last = static_cast<std::uint32_t>((addr + bytes - 1 - kArenaBase) / kChunkBytes);
  const std::uint32_t seq = static_cast<std::uint32_t>(ct_.blocks.size());
  bool fresh = true;
  for (std::uint32_t c = first; c <= last; ++c) {
    fresh = fresh && chunk_live_[c] == 0;
    ++chunk_live_[c];
    owner_[c] = seq;
  }
  ct_.blocks.push_back({addr, bytes, first, last - first + 1, fresh});
  ct_.ops.push_back({Op::Kind::alloc, seq});
  return seq;
}

// A block the Engine sees, on whole chunks of the arena.
std::uint32_t EventCompiler::place_block(std::uint64_t bytes, std::uint64_t line) {
  std::uint32_t chunks = static_cast<std::uint32_t>((bytes + kChunkBytes - 1) / kChunkBytes);
  std::uint32_t start = arena_.allocate(chunks);
  check_arena(line);
  std::uint32_t seq = static_cast<std::uint32_t>(ct_.blocks.size());
  ct_.blocks.push_back({kArenaBase + std::uint64_t(start) * kChunkBytes, bytes, start, chunks});
  grow(arena_.top());
  for (std::uint32_t c = start; c < start + chunks; ++c) owner_[c] = seq;
  ct_.ops.push_back({Op::Kind::alloc, seq});
  return seq;
}

void EventCompiler::add_alloc(const trace::Event& e) {
  live_chunk_bytes_ += (e.bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
  ct_.peak_bytes = std::max(ct_.peak_bytes, live_chunk_bytes_);
  if (carved_) {
    live_[e.id] = carve_block(e.bytes, std::hash<std::string>{}(e.site), e.line);
  } else if (tracked_) {
    live_[e.id] = add_followed_tensor(e);
  } else if (!segments_) {
    live_[e.id] = place_block(e.bytes, e.line);
  } else {
    live_[e.id] = add_tensor(e);
  }
}

// (`pytorch`) A tensor the framework's cache places in a segment, a new one when none has
// room; returns the segment's block.
std::uint32_t EventCompiler::add_tensor(const trace::Event& e) {
  Tensor tensor;
  tensor.place = framework_.allocate(e.bytes);
  tensor.bytes = e.bytes;
  if (tensor.place.new_segment) {
    const std::uint64_t seg_bytes = framework_.segments()[tensor.place.segment];
    segment_seq_.push_back(place_block(seg_bytes, e.line));
    ct_.segment_bytes += seg_bytes;
  }
  tensor.addr = ct_.blocks[segment_seq_[tensor.place.segment]].addr + tensor.place.offset;
  tensors_[e.id] = tensor;
  return segment_seq_[tensor.place.segment];
}

// (`pytorch-tracked`) A tensor the framework's cache places in a segment, as under
// `pytorch` (the segment, new or not, is the Engine's block); the tensor is reported to the
// Engine (Engine::note_tensor_alloc) as the allocator's trace reports it: the request's
// address and size (c10/cuda/CUDACachingAllocator.cpp, record_trace(TraceEntry::ALLOC, ...,
// orig_size, ...) in malloc). Its entry in `blocks` is numbered in the Policies' allocation
// order (segments and tensors alike reach on_alloc).
std::uint32_t EventCompiler::add_followed_tensor(const trace::Event& e) {
  add_tensor(e);  // (places it as under `pytorch`: the segment's alloc op when it is new)
  const Tensor& tensor = tensors_.at(e.id);
  const std::uint32_t first = static_cast<std::uint32_t>((tensor.addr - kArenaBase) / kChunkBytes);
  const std::uint32_t last = static_cast<std::uint32_t>((tensor.addr + e.bytes - 1 - kArenaBase) / kChunkBytes);
  const std::uint32_t seq = static_cast<std::uint32_t>(ct_.blocks.size());
  ct_.blocks.push_back({tensor.addr, e.bytes, first, last - first + 1, false});
  ct_.ops.push_back({Op::Kind::tensor_alloc, seq});
  return seq;
}

void EventCompiler::add_free(const trace::Event& e) {
  auto it = live_.find(e.id);  // the Reader guarantees it is live
  const std::uint64_t freed = segments_ ? tensors_.at(e.id).bytes : ct_.blocks[it->second].bytes;
  live_chunk_bytes_ -= (freed + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
  if (segments_) {  // back to the framework's cache: the shim sees nothing
    auto tt = tensors_.find(e.id);
    framework_.free(tt->second.place);
    tensors_.erase(tt);
    live_.erase(it);
    return;
  }
  if (tracked_) {  // back to the framework's cache (reusable at once); the trace reports it
    auto tt = tensors_.find(e.id);
    framework_.free(tt->second.place);
    tensors_.erase(tt);
    ct_.ops.push_back({Op::Kind::tensor_free, it->second});
    live_.erase(it);
    return;
  }
  const BlockPlacement& b = ct_.blocks[it->second];
  if (carved_) {  // reusable at once; an emptied slab goes back to the chunks at once
    if (const std::uint64_t slab = shim_.free(b.addr, b.bytes); slab != 0) shim_.release_slab(slab);
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) --chunk_live_[c];
  } else {
    arena_.release(b.first_chunk, b.chunks);
  }
  ct_.ops.push_back({Op::Kind::free, it->second});
  live_.erase(it);
}

void EventCompiler::add_kernel(const trace::Event& e) {
  KernelDraft draft;
  KernelRecord& k = draft.record;
  k.host = e.kind == trace::EventKind::host;
  k.line = e.line;
  k.dur_ns = k.host ? 0 : e.dur_ns;
  auto [ni, added] = name_index_.try_emplace(e.name, static_cast<std::uint32_t>(ct_.names.size()));
  if (added) ct_.names.push_back(e.name);
  k.name = ni->second;
  draft.exec_id = mix(0x5350494c4c574159ull, std::hash<std::string>{}(e.name));
  k.access_begin = static_cast<std::uint32_t>(ct_.accesses.size());
  k.touch_begin = static_cast<std::uint32_t>(ct_.touches.size());
  ++event_no_;
  hits_.clear();
  for (const trace::Range& r : e.reads) add_range(r, false, draft);
  for (const trace::Range& r : e.writes) add_range(r, true, draft);
  if (segments_ && !exact_ && !k.host) add_scanned_footprint(draft);
  k.exec_id = draft.exec_id;
  k.access_end = static_cast<std::uint32_t>(ct_.accesses.size());
  k.touch_end = static_cast<std::uint32_t>(ct_.touches.size());
  if (!k.host) count_kernel_time(k, e.line);
  ct_.ops.push_back({k.host ? Op::Kind::host : Op::Kind::kernel, static_cast<std::uint32_t>(ct_.kernels.size())});
  ct_.kernels.push_back(k);
}

void EventCompiler::count_kernel_time(const KernelRecord& k, std::uint64_t line) {
  ct_.compute_ns += k.dur_ns;
  if (ct_.compute_ns > kMaxComputeNs) {
    throw trace::TraceError(source_.path, line, "the kernels' total time exceeds 2^62 ns (about 146 years)");
  }
  ++ct_.kernel_count;
}

// One range a kernel reads or writes: an access the Policy sees (or, under `pytorch`, the
// pointer the kernel is passed, found in its segment) and the chunks it touches.
void EventCompiler::add_range(const trace::Range& r, bool write, KernelDraft& k) {
  std::uint32_t seq = live_.at(r.id);
  const BlockPlacement& b = ct_.blocks[seq];
  std::uint64_t addr = (segments_ ? tensors_.at(r.id).addr : b.addr) + r.offset;
  if (segments_ && !exact_) {
    if (std::none_of(hits_.begin(), hits_.end(), [&](const ArgumentHit& x) { return x.ptr == addr; })) {
      hits_.push_back(ArgumentHit{addr, b.addr, b.addr + b.bytes});
    }
  } else {
    ct_.accesses.push_back(Access{addr, r.bytes, write});
    k.exec_id = mix(mix(k.exec_id, addr), r.bytes * 2 + (write ? 1 : 0));
  }
  add_touches(addr, r.bytes, write, seq, k.record.host);
}

// The chunks of [addr, addr + bytes), each merged into the event's touch of it if it has one.
void EventCompiler::add_touches(std::uint64_t addr, std::uint64_t bytes_total, bool write, std::uint32_t seq, bool host) {
  std::uint64_t end = addr + bytes_total;
  for (std::uint64_t a = addr; a < end;) {
    std::uint64_t chunk_end = (a / kChunkBytes + 1) * kChunkBytes;
    std::uint64_t stop = std::min(end, chunk_end);
    std::uint32_t c = static_cast<std::uint32_t>((a - kArenaBase) / kChunkBytes);
    std::uint32_t bytes = static_cast<std::uint32_t>(stop - a);
    if (merge_epoch_[c] == event_no_) {
      ChunkTouch& tt = ct_.touches[merge_at_[c]];
      tt.bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(kChunkBytes, std::uint64_t(tt.bytes) + bytes));
      tt.write = tt.write || write;
      std::uint32_t& part = write ? tt.write_bytes : tt.read_bytes;
      part = static_cast<std::uint32_t>(std::min<std::uint64_t>(kChunkBytes, std::uint64_t(part) + bytes));
    } else {
      merge_epoch_[c] = event_no_;
      merge_at_[c] = static_cast<std::uint32_t>(ct_.touches.size());
      ChunkTouch tt{c, bytes, kNever, seq, kNever};
      (write ? tt.write_bytes : tt.read_bytes) = bytes;
      tt.write = write;
      tt.host = host;
      ct_.touches.push_back(tt);
    }
    a = stop;
  }
}

// (`pytorch`) What the launch hook would make of the kernel's pointers (spillway/footprint.h).
void EventCompiler::add_scanned_footprint(KernelDraft& k) {
  const std::size_t at = ct_.accesses.size();
  ct_.accesses.resize(at + hits_.size());
  ct_.accesses.resize(at + footprint_of(hits_, std::span<Access>(ct_.accesses.data() + at, hits_.size())));
  for (std::size_t i = at; i < ct_.accesses.size(); ++i) k.exec_id = mix(mix(k.exec_id, ct_.accesses[i].addr), ct_.accesses[i].bytes * 2);
}

// Next use of each touch (same chunk, same block instance; kernels and host events both
// count): a pass backward over the ops.
void link_next_uses(CompiledTrace& ct) {
  std::vector<std::uint32_t> next_pos(ct.arena_chunks, kNever), next_read_pos(ct.arena_chunks, kNever);
  std::size_t first_block = ct.blocks.size();  // the backward pass has passed the allocs of blocks from here on
  for (std::size_t i = ct.ops.size(); i-- > 0;) {
    if ((i & 0xffff) == 0) {  // (this pass walks backward: what it has passed lies after i)
      release_from(ct, i);
      ct.blocks.release(first_block, ct.blocks.size());
    }
    const Op& op = ct.ops[i];
    if (op.kind == Op::Kind::alloc || op.kind == Op::Kind::tensor_alloc) first_block = op.index;
    if (op.kind == Op::Kind::alloc) {
      const BlockPlacement& b = ct.blocks[op.index];
      if (!b.fresh) continue;  // (a chunk other live blocks hold: its use goes on)
      for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) next_pos[c] = next_read_pos[c] = kNever;
    } else if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) {
      const KernelRecord& k = ct.kernels[op.index];
      for (std::uint32_t j = k.touch_end; j-- > k.touch_begin;) {
        ChunkTouch& tt = ct.touches[j];
        tt.next = next_pos[tt.chunk];
        tt.next_read = next_read_pos[tt.chunk];
        next_pos[tt.chunk] = j;
        if (!k.host && tt.read_bytes > 0) next_read_pos[tt.chunk] = j;
      }
    }
  }
}

// The first touch of each chunk since its block's alloc: a pass forward over the ops.
void mark_first_touches(CompiledTrace& ct) {
  std::vector<bool> touched(ct.arena_chunks, false);
  for_each_op(ct, [&](const Op& op) {
    if (op.kind == Op::Kind::alloc) {
      const BlockPlacement& b = ct.blocks[op.index];
      if (!b.fresh) return;
      for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) touched[c] = false;
    } else if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) {
      const KernelRecord& k = ct.kernels[op.index];
      for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
        ChunkTouch& tt = ct.touches[j];
        tt.first_touch = !touched[tt.chunk];
        touched[tt.chunk] = true;
      }
    }
  });
  ct.release_behind(ct.ops.size(), ct.kernels.size(), ct.blocks.size());
}

CompiledTrace compile_events(const EventSource& t, AllocatorView view) {
  CompiledTrace ct;
  ct.path = t.path;
  ct.allocator = view;
  ct.name = base_name(t.path);
  ct.header = t.header;
  EventCompiler events(t, view, ct);
  std::uint64_t events_read = 0;
  while (const trace::Event* event = t.next()) {
    // What is written goes from memory to the spill files now and then (read back when a
    // free or a kernel looks up an old block).
    if ((++events_read & 0xffff) == 0) ct.release_behind(ct.ops.size(), ct.kernels.size(), ct.blocks.size());
    events.add(*event);
  }
  ct.arena_chunks = events.arena_chunks();
  std::sort(ct.ranges.begin(), ct.ranges.end());
  link_next_uses(ct);
  mark_first_touches(ct);
  return ct;
}

}  // namespace

void CompiledTrace::release_behind(std::size_t op, std::size_t kernel, std::size_t block) const {
  ops.release(0, op);
  if (kernel < kernels.size()) {
    accesses.release(0, kernels[kernel].access_begin);
    touches.release(0, kernels[kernel].touch_begin);
  } else {
    accesses.release(0, accesses.size());
    touches.release(0, touches.size());
  }
  kernels.release(0, kernel);
  blocks.release(0, block);
}

CompiledTrace compile(const trace::Trace& t, AllocatorView view) {
  std::size_t i = 0;
  return compile_events(EventSource{t.path, t.header, [&]() -> const trace::Event* {
                          return i < t.events.size() ? &t.events[i++] : nullptr;
                        }},
                        view);
}

CompiledTrace compile_file(const std::string& path, AllocatorView view) {
  trace::Reader reader(path);
  trace::Event event;
  return compile_events(EventSource{path, reader.header(), [&]() -> const trace::Event* {
                          return reader.next(event) ? &event : nullptr;
                        }},
                        view);
}

std::uint64_t min_fetches(const CompiledTrace& ct, std::uint64_t capacity_chunks) {
  return min_fetch(ct, capacity_chunks).chunks;
}

namespace {

// Belady's MIN over the kernels' touches (min_fetch, min_resident_hits). `resident_model`:
// every touch makes its chunk resident and a next use is any next touch; otherwise only reads
// are requests and a chunk used later than every resident one is bypassed.
class Belady {
 public:
  Belady(const CompiledTrace& ct, std::uint64_t capacity_chunks, std::vector<bool>* hits, bool resident_model)
      : ct_(ct), capacity_chunks_(capacity_chunks), hits_(hits), resident_model_(resident_model),
        key_(ct.arena_chunks, kNever), in_(ct.arena_chunks, false), cost_count_(kFine + (kChunkBytes >> 12) + 1, 0) {
    if (hits_ != nullptr) hits_->assign(ct.touches.size(), false);
  }

  MinFetch run() {
    for_each_op(ct_, [&](const Op& op) {
      if (op.kind == Op::Kind::free) {
        free_block(ct_.blocks[op.index]);
        return;
      }
      if (op.kind != Op::Kind::kernel) return;  // host touches are not GPU fetches
      const KernelRecord& k = ct_.kernels[op.index];
      for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) request(j, ct_.touches[j]);
      compact_heap();
    });
    result_.bytes = resident_model_ ? result_.chunks * kChunkBytes : cheapest_bytes();
    return result_;
  }

 private:
  // What the requests that could miss would cost (a non-first read: the cheaper of a fetch
  // and a remote read of its bytes), counted per cost: exact below 4 KiB, rounded down to a
  // 4 KiB multiple above (still a lower bound; 2 MiB exact). MIN's bytes are the sum of the
  // `chunks` cheapest. Fixed memory, whatever the trace's length.
  static constexpr std::uint32_t kFine = 4096;
  static std::size_t bucket(std::uint64_t v) { return v < kFine ? v : kFine + (v >> 12); }
  static std::uint64_t bucket_cost(std::size_t b) { return b < kFine ? b : (b - kFine) << 12; }

  void free_block(const BlockPlacement& b) {
    for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
      if (in_[c]) {
        in_[c] = false;
        --resident_;
      }
    }
  }

  // Touch `j`. The requests are the kernels' reads: a touch that only writes needs no data
  // (it can be written remotely, over D2H), and a host touch is no GPU request.
  void request(std::uint32_t j, const ChunkTouch& tt) {
    std::uint32_t c = tt.chunk;
    const std::uint32_t next = resident_model_ ? tt.next : tt.next_read;
    count_cost(tt);
    if (in_[c]) {
      if (hits_ != nullptr) (*hits_)[j] = true;
      key_[c] = next;
      push(c);
      return;
    }
    if (tt.read_bytes == 0 && !tt.first_touch && !resident_model_) return;
    if (!tt.first_touch) ++result_.chunks;
    if (capacity_chunks_ == 0) return;
    if (next == kNever && !resident_model_) return;  // bypass
    if (resident_ >= capacity_chunks_ && !make_room(next)) return;
    key_[c] = next;
    in_[c] = true;
    ++resident_;
    push(c);
  }

  // A request that could miss: a kernel's non-first read (counted by what it would cost).
  void count_cost(const ChunkTouch& tt) {
    if (!resident_model_ && !tt.first_touch && tt.read_bytes > 0) {
      ++cost_count_[bucket(std::min<std::uint64_t>(kChunkBytes, tt.read_bytes))];
    }
  }

  // Evicts the resident chunk used furthest in the future for a chunk next used at `next`;
  // false when the chunk is bypassed instead or nothing is resident to make room with.
  bool make_room(std::uint32_t next) {
    auto [far, victim] = top();
    if (far <= next && !resident_model_) return false;  // bypass: every resident chunk is needed sooner
    if (heap_.empty()) return false;  // (nothing resident to make room with)
    in_[victim] = false;
    --resident_;
    return true;
  }

  // Resident chunks in a max-heap keyed by next use (touch index; kNever = never again),
  // with lazy deletion: an entry is current while the chunk is resident with that key.
  void push(std::uint32_t c) {
    heap_.emplace_back(key_[c], c);
    std::push_heap(heap_.begin(), heap_.end());
  }
  std::pair<std::uint32_t, std::uint32_t> top() {  // the current furthest entry
    while (!heap_.empty()) {
      auto [k, c] = heap_.front();
      if (in_[c] && key_[c] == k) return {k, c};
      std::pop_heap(heap_.begin(), heap_.end());
      heap_.pop_back();
    }
    return {0, 0};
  }
  // Keeps the heap from growing without bound: rebuilds it from the live entries.
  void compact_heap() {
    if (heap_.size() > 4 * (resident_ + 1024)) {
      heap_.clear();
      for (std::uint32_t c = 0; c < ct_.arena_chunks; ++c) if (in_[c]) heap_.emplace_back(key_[c], c);
      std::make_heap(heap_.begin(), heap_.end());
    }
  }

  // MIN minimises the number of misses, not their bytes: where reads differ in size, another
  // policy may miss as often on cheaper reads. Every policy misses at least `chunks` of these
  // requests, so their `chunks` cheapest bound its bytes from below.
  std::uint64_t cheapest_bytes() const {
    std::uint64_t bytes = 0;
    std::uint64_t left = result_.chunks;
    for (std::size_t b = 0; b < cost_count_.size() && left > 0; ++b) {
      const std::uint64_t n = std::min(left, cost_count_[b]);
      bytes += n * bucket_cost(b);
      left -= n;
    }
    return bytes;
  }

  const CompiledTrace& ct_;
  const std::uint64_t capacity_chunks_;
  std::vector<bool>* hits_;
  const bool resident_model_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> heap_;  // (next use, chunk)
  std::vector<std::uint32_t> key_;
  std::vector<bool> in_;
  std::uint64_t resident_ = 0;
  std::vector<std::uint64_t> cost_count_;
  MinFetch result_;
};

}  // namespace

MinFetch min_fetch(const CompiledTrace& ct, std::uint64_t capacity_chunks, std::vector<bool>* hits) {
  return Belady(ct, capacity_chunks, hits, false).run();
}

std::vector<bool> min_resident_hits(const CompiledTrace& ct, std::uint64_t capacity_chunks) {
  std::vector<bool> hits;
  Belady(ct, capacity_chunks, &hits, true).run();
  return hits;
}

}  // namespace spillway::sim
