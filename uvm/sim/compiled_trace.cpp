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
    case AllocatorView::none: break;
  }
  return "none";
}

std::optional<AllocatorView> parse_allocator_view(const std::string& text) {
  if (text == "none") return AllocatorView::none;
  if (text == "pytorch") return AllocatorView::pytorch;
  if (text == "pytorch-exact") return AllocatorView::pytorch_exact;
  if (text == "spillway") return AllocatorView::spillway;
  return std::nullopt;
}

namespace {

// The trace's events one at a time (`next` returns nullptr at the end): a Trace in memory,
// or a Reader streaming the file, so that compile_file() never holds the events (issue 17
// item 3: the compiled form is what stays).
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

CompiledTrace compile_events(const EventSource& t, AllocatorView view) {
  CompiledTrace ct;
  ct.path = t.path;
  ct.allocator = view;
  const bool segments = view == AllocatorView::pytorch || view == AllocatorView::pytorch_exact;
  const bool exact = view == AllocatorView::pytorch_exact;  // the tensors' true ranges, not the scan's guess
  const bool carved = view == AllocatorView::spillway;
  PytorchCachingAllocator framework;  // (`pytorch`)
  SubAllocator shim;                  // (`spillway`): the shim's sub-allocator over arena ranges
  std::vector<std::uint32_t> chunk_live;  // (`spillway`) per chunk: live blocks on it
  struct Tensor {
    PytorchCachingAllocator::Placement place;
    std::uint64_t addr = 0;   // its address inside its segment
    std::uint64_t bytes = 0;  // as the trace allocated it
  };
  std::unordered_map<std::uint64_t, Tensor> tensors;  // trace id -> placement (`pytorch`)
  std::vector<std::uint32_t> segment_seq;              // segment -> its block (alloc sequence)
  std::vector<ArgumentHit> hits;                       // a kernel's pointers (`pytorch`)
  ct.name = base_name(t.path);
  ct.header = t.header;
  ChunkAllocator arena;
  std::unordered_map<std::uint64_t, std::uint32_t> live;  // trace id -> alloc sequence
  std::unordered_map<std::string, std::uint32_t> name_index;
  std::vector<std::uint32_t> merge_at;     // per chunk: position in touches of this event's touch
  std::vector<std::uint32_t> merge_epoch;  // per chunk: event that wrote merge_at
  std::vector<std::uint32_t> owner;        // per chunk: the block (alloc sequence) on it now
  std::uint64_t live_chunk_bytes = 0;
  std::uint32_t event_no = 0;

  auto grow = [&](std::uint32_t chunks) {
    if (chunks > merge_at.size()) {
      merge_at.resize(chunks, 0);
      merge_epoch.resize(chunks, kNever);
      owner.resize(chunks, kNever);
      chunk_live.resize(chunks, 0);
    }
  };
  // (`spillway`) A tensor carved by the sub-allocator; a new range is taken from the arena
  // when none has room (Engine::kRangeBytes, as the shim's Engine asks its Backend).
  auto carve_block = [&](std::uint64_t bytes, std::uint64_t site, std::uint64_t line) {
    std::uint64_t addr = shim.allocate(bytes, site);
    if (addr == 0) {
      const std::uint64_t range = SubAllocator::range_bytes_for(bytes, Engine::kRangeBytes);
      const std::uint32_t start = arena.allocate(static_cast<std::uint32_t>(range / kChunkBytes));
      if (arena.top() > kMaxArenaChunks) {
        throw trace::TraceError(t.path, line,
                                fmt::format("the blocks live at once need more than the simulator's {} of address space",
                                            format_bytes(kMaxArenaChunks * kChunkBytes)));
      }
      grow(arena.top());
      shim.add_range(kArenaBase + std::uint64_t(start) * kChunkBytes, range);
      addr = shim.allocate(bytes, site);
    }
    const std::uint32_t first = static_cast<std::uint32_t>((addr - kArenaBase) / kChunkBytes);
    const std::uint32_t last = static_cast<std::uint32_t>((addr + bytes - 1 - kArenaBase) / kChunkBytes);
    const std::uint32_t seq = static_cast<std::uint32_t>(ct.blocks.size());
    bool fresh = true;
    for (std::uint32_t c = first; c <= last; ++c) {
      fresh = fresh && chunk_live[c] == 0;
      ++chunk_live[c];
      owner[c] = seq;
    }
    ct.blocks.push_back({addr, bytes, first, last - first + 1, fresh});
    ct.ops.push_back({Op::Kind::alloc, seq});
    return seq;
  };
  // A block the Engine sees, on whole chunks of the arena.
  auto place_block = [&](std::uint64_t bytes, std::uint64_t line) {
    std::uint32_t chunks = static_cast<std::uint32_t>((bytes + kChunkBytes - 1) / kChunkBytes);
    std::uint32_t start = arena.allocate(chunks);
    if (arena.top() > kMaxArenaChunks) {
      throw trace::TraceError(t.path, line,
                              fmt::format("the blocks live at once need more than the simulator's {} of address space",
                                          format_bytes(kMaxArenaChunks * kChunkBytes)));
    }
    std::uint32_t seq = static_cast<std::uint32_t>(ct.blocks.size());
    ct.blocks.push_back({kArenaBase + std::uint64_t(start) * kChunkBytes, bytes, start, chunks});
    grow(arena.top());
    for (std::uint32_t c = start; c < start + chunks; ++c) owner[c] = seq;
    ct.ops.push_back({Op::Kind::alloc, seq});
    return seq;
  };

  std::uint64_t events_read = 0;
  while (const trace::Event* event = t.next()) {
    const trace::Event& e = *event;
    // What is written goes from memory to the spill files now and then (read back when a
    // free or a kernel looks up an old block).
    if ((++events_read & 0xffff) == 0) ct.release_behind(ct.ops.size(), ct.kernels.size(), ct.blocks.size());
    switch (e.kind) {
      case trace::EventKind::alloc: {
        live_chunk_bytes += (e.bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
        ct.peak_bytes = std::max(ct.peak_bytes, live_chunk_bytes);
        if (carved) {
          live[e.id] = carve_block(e.bytes, std::hash<std::string>{}(e.site), e.line);
          break;
        }
        if (!segments) {
          live[e.id] = place_block(e.bytes, e.line);
          break;
        }
        Tensor tensor;
        tensor.place = framework.allocate(e.bytes);
        tensor.bytes = e.bytes;
        if (tensor.place.new_segment) {
          const std::uint64_t seg_bytes = framework.segments()[tensor.place.segment];
          segment_seq.push_back(place_block(seg_bytes, e.line));
          ct.segment_bytes += seg_bytes;
        }
        tensor.addr = ct.blocks[segment_seq[tensor.place.segment]].addr + tensor.place.offset;
        tensors[e.id] = tensor;
        live[e.id] = segment_seq[tensor.place.segment];
        break;
      }
      case trace::EventKind::free: {
        auto it = live.find(e.id);  // the Reader guarantees it is live
        const std::uint64_t freed = segments ? tensors.at(e.id).bytes : ct.blocks[it->second].bytes;
        live_chunk_bytes -= (freed + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
        if (segments) {  // back to the framework's cache: the shim sees nothing
          auto tt = tensors.find(e.id);
          framework.free(tt->second.place);
          tensors.erase(tt);
          live.erase(it);
          break;
        }
        const BlockPlacement& b = ct.blocks[it->second];
        if (carved) {  // reusable at once; an emptied slab goes back to the chunks at once
          if (const std::uint64_t slab = shim.free(b.addr, b.bytes); slab != 0) shim.release_slab(slab);
          for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) --chunk_live[c];
        } else {
          arena.release(b.first_chunk, b.chunks);
        }
        ct.ops.push_back({Op::Kind::free, it->second});
        live.erase(it);
        break;
      }
      case trace::EventKind::kernel:
      case trace::EventKind::host: {
        KernelRecord k;
        k.host = e.kind == trace::EventKind::host;
        k.line = e.line;
        k.dur_ns = k.host ? 0 : e.dur_ns;
        auto [ni, added] = name_index.try_emplace(e.name, static_cast<std::uint32_t>(ct.names.size()));
        if (added) ct.names.push_back(e.name);
        k.name = ni->second;
        std::uint64_t h = mix(0x5350494c4c574159ull, std::hash<std::string>{}(e.name));
        k.access_begin = static_cast<std::uint32_t>(ct.accesses.size());
        k.touch_begin = static_cast<std::uint32_t>(ct.touches.size());
        ++event_no;
        hits.clear();
        auto add = [&](const trace::Range& r, bool write) {
          std::uint32_t seq = live.at(r.id);
          const BlockPlacement& b = ct.blocks[seq];
          std::uint64_t addr = (segments ? tensors.at(r.id).addr : b.addr) + r.offset;
          if (segments && !exact) {  // the pointer the kernel is passed, found in its segment
            if (std::none_of(hits.begin(), hits.end(), [&](const ArgumentHit& x) { return x.ptr == addr; })) {
              hits.push_back(ArgumentHit{addr, b.addr, b.addr + b.bytes});
            }
          } else {
            ct.accesses.push_back(Access{addr, r.bytes, write});
            h = mix(mix(h, addr), r.bytes * 2 + (write ? 1 : 0));
          }
          std::uint64_t end = addr + r.bytes;
          for (std::uint64_t a = addr; a < end;) {
            std::uint64_t chunk_end = (a / kChunkBytes + 1) * kChunkBytes;
            std::uint64_t stop = std::min(end, chunk_end);
            std::uint32_t c = static_cast<std::uint32_t>((a - kArenaBase) / kChunkBytes);
            std::uint32_t bytes = static_cast<std::uint32_t>(stop - a);
            if (merge_epoch[c] == event_no) {
              ChunkTouch& tt = ct.touches[merge_at[c]];
              tt.bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(kChunkBytes, std::uint64_t(tt.bytes) + bytes));
              tt.write = tt.write || write;
              std::uint32_t& part = write ? tt.write_bytes : tt.read_bytes;
              part = static_cast<std::uint32_t>(std::min<std::uint64_t>(kChunkBytes, std::uint64_t(part) + bytes));
            } else {
              merge_epoch[c] = event_no;
              merge_at[c] = static_cast<std::uint32_t>(ct.touches.size());
              ChunkTouch tt{c, bytes, kNever, seq, kNever};
              (write ? tt.write_bytes : tt.read_bytes) = bytes;
              tt.write = write;
              tt.host = k.host;
              ct.touches.push_back(tt);
            }
            a = stop;
          }
        };
        for (const trace::Range& r : e.reads) add(r, false);
        for (const trace::Range& r : e.writes) add(r, true);
        if (segments && !exact && !k.host) {
          // What the launch hook would make of these pointers (spillway/footprint.h).
          const std::size_t at = ct.accesses.size();
          ct.accesses.resize(at + hits.size());
          ct.accesses.resize(at + footprint_of(hits, std::span<Access>(ct.accesses.data() + at, hits.size())));
          for (std::size_t i = at; i < ct.accesses.size(); ++i) h = mix(mix(h, ct.accesses[i].addr), ct.accesses[i].bytes * 2);
        }
        k.exec_id = h;
        k.access_end = static_cast<std::uint32_t>(ct.accesses.size());
        k.touch_end = static_cast<std::uint32_t>(ct.touches.size());
        if (!k.host) {
          ct.compute_ns += k.dur_ns;
          if (ct.compute_ns > kMaxComputeNs) {
            throw trace::TraceError(t.path, e.line, "the kernels' total time exceeds 2^62 ns (about 146 years)");
          }
          ++ct.kernel_count;
        }
        ct.ops.push_back({k.host ? Op::Kind::host : Op::Kind::kernel, static_cast<std::uint32_t>(ct.kernels.size())});
        ct.kernels.push_back(k);
        break;
      }
      case trace::EventKind::iter: ct.ops.push_back({Op::Kind::iter, static_cast<std::uint32_t>(e.n)}); break;
    }
  }
  ct.arena_chunks = arena.top();

  // Next use of each touch (same chunk, same block instance; kernels and host events both
  // count) and first touches since alloc.
  std::vector<std::uint32_t> next_pos(ct.arena_chunks, kNever), next_read_pos(ct.arena_chunks, kNever);
  std::size_t first_block = ct.blocks.size();  // the backward pass has passed the allocs of blocks from here on
  for (std::size_t i = ct.ops.size(); i-- > 0;) {
    if ((i & 0xffff) == 0) {  // (this pass walks backward: what it has passed lies after i)
      release_from(ct, i);
      ct.blocks.release(first_block, ct.blocks.size());
    }
    const Op& op = ct.ops[i];
    if (op.kind == Op::Kind::alloc) first_block = op.index;
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
  std::vector<bool> touched(ct.arena_chunks, false);
  std::size_t op_no = 0, kernel_no = 0, block_no = 0;
  for (const Op& op : ct.ops) {
    if ((++op_no & 0xffff) == 0) ct.release_behind(op_no - 1, kernel_no, block_no);
    if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) kernel_no = op.index;
    if (op.kind == Op::Kind::alloc) block_no = op.index;
    if (op.kind == Op::Kind::alloc) {
      const BlockPlacement& b = ct.blocks[op.index];
      if (!b.fresh) continue;
      for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) touched[c] = false;
    } else if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) {
      const KernelRecord& k = ct.kernels[op.index];
      for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
        ChunkTouch& tt = ct.touches[j];
        tt.first_touch = !touched[tt.chunk];
        touched[tt.chunk] = true;
      }
    }
  }
  ct.release_behind(ct.ops.size(), ct.kernels.size(), ct.blocks.size());
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
MinFetch belady(const CompiledTrace& ct, std::uint64_t capacity_chunks, std::vector<bool>* hits, bool resident_model) {
  if (hits != nullptr) hits->assign(ct.touches.size(), false);
  // Resident chunks in a max-heap keyed by next use (touch index; kNever = never again),
  // with lazy deletion: an entry is current while the chunk is resident with that key.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> heap;  // (next use, chunk)
  std::vector<std::uint32_t> key(ct.arena_chunks, kNever);
  std::vector<bool> in(ct.arena_chunks, false);
  std::uint64_t resident = 0;
  MinFetch result;
  auto push = [&](std::uint32_t c) {
    heap.emplace_back(key[c], c);
    std::push_heap(heap.begin(), heap.end());
  };
  auto top = [&]() -> std::pair<std::uint32_t, std::uint32_t> {  // the current furthest entry
    while (!heap.empty()) {
      auto [k, c] = heap.front();
      if (in[c] && key[c] == k) return {k, c};
      std::pop_heap(heap.begin(), heap.end());
      heap.pop_back();
    }
    return {0, 0};
  };
  // What the requests that could miss would cost (a non-first read: the cheaper of a fetch
  // and a remote read of its bytes), counted per cost: exact below 4 KiB, rounded down to a
  // 4 KiB multiple above (still a lower bound; 2 MiB exact). MIN's bytes are the sum of the
  // `chunks` cheapest. Fixed memory, whatever the trace's length.
  constexpr std::uint32_t kFine = 4096;
  std::vector<std::uint64_t> cost_count(kFine + (kChunkBytes >> 12) + 1, 0);
  const auto bucket = [&](std::uint64_t v) { return v < kFine ? v : kFine + (v >> 12); };
  const auto bucket_cost = [&](std::size_t b) -> std::uint64_t { return b < kFine ? b : (b - kFine) << 12; };
  std::size_t op_no = 0, kernel_no = 0, block_no = 0;
  for (const Op& op : ct.ops) {
    if ((++op_no & 0xffff) == 0) ct.release_behind(op_no - 1, kernel_no, block_no);
    if (op.kind == Op::Kind::kernel || op.kind == Op::Kind::host) kernel_no = op.index;
    if (op.kind == Op::Kind::alloc) block_no = op.index;
    if (op.kind == Op::Kind::free) {
      const BlockPlacement& b = ct.blocks[op.index];
      for (std::uint32_t c = b.first_chunk; c < b.first_chunk + b.chunks; ++c) {
        if (in[c]) {
          in[c] = false;
          --resident;
        }
      }
      continue;
    }
    if (op.kind != Op::Kind::kernel) continue;  // host touches are not GPU fetches
    const KernelRecord& k = ct.kernels[op.index];
    for (std::uint32_t j = k.touch_begin; j < k.touch_end; ++j) {
      const ChunkTouch& tt = ct.touches[j];
      std::uint32_t c = tt.chunk;
      // The requests are the kernels' reads: a touch that only writes needs no data (it can
      // be written remotely, over D2H), and a host touch is no GPU request.
      const std::uint32_t next = resident_model ? tt.next : tt.next_read;
      if (!resident_model && !tt.first_touch && tt.read_bytes > 0) {
        ++cost_count[bucket(std::min<std::uint64_t>(kChunkBytes, tt.read_bytes))];
      }
      if (in[c]) {
        if (hits != nullptr) (*hits)[j] = true;
        key[c] = next;
        push(c);
        continue;
      }
      if (tt.read_bytes == 0 && !tt.first_touch && !resident_model) continue;
      if (!tt.first_touch) ++result.chunks;
      if (capacity_chunks == 0) continue;
      if (next == kNever && !resident_model) continue;  // bypass
      if (resident >= capacity_chunks) {
        auto [far, victim] = top();
        if (far <= next && !resident_model) continue;  // bypass: every resident chunk is needed sooner
        if (heap.empty()) continue;  // (nothing resident to make room with)
        in[victim] = false;
        --resident;
      }
      key[c] = next;
      in[c] = true;
      ++resident;
      push(c);
    }
    // Keep the heap from growing without bound: rebuild it from the live entries.
    if (heap.size() > 4 * (resident + 1024)) {
      heap.clear();
      for (std::uint32_t c = 0; c < ct.arena_chunks; ++c) if (in[c]) heap.emplace_back(key[c], c);
      std::make_heap(heap.begin(), heap.end());
    }
  }
  // MIN minimises the number of misses, not their bytes: where reads differ in size, another
  // policy may miss as often on cheaper reads. Every policy misses at least `chunks` of these
  // requests, so their `chunks` cheapest bound its bytes from below.
  if (resident_model) {
    result.bytes = result.chunks * kChunkBytes;
  } else {
    std::uint64_t left = result.chunks;
    for (std::size_t b = 0; b < cost_count.size() && left > 0; ++b) {
      const std::uint64_t n = std::min(left, cost_count[b]);
      result.bytes += n * bucket_cost(b);
      left -= n;
    }
  }
  return result;
}

}  // namespace

MinFetch min_fetch(const CompiledTrace& ct, std::uint64_t capacity_chunks, std::vector<bool>* hits) {
  return belady(ct, capacity_chunks, hits, false);
}

std::vector<bool> min_resident_hits(const CompiledTrace& ct, std::uint64_t capacity_chunks) {
  std::vector<bool> hits;
  belady(ct, capacity_chunks, &hits, true);
  return hits;
}

}  // namespace spillway::sim
