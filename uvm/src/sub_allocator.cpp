#include "spillway/sub_allocator.h"

#include "spillway/state_bytes.h"

#include <bit>
#include <iterator>

namespace spillway {

namespace {

constexpr std::uint32_t kNotFound = ~0u;

using Bits = std::array<std::uint64_t, SubAllocator::kSlabGranules / 64>;

// The first run of `k` clear bits starting in [from, kSlabGranules), or kNotFound.
std::uint32_t find_clear_run(const Bits& bits, std::uint64_t k, std::uint32_t from) {
  std::uint32_t i = from, start = from;
  std::uint64_t run = 0;
  while (i < SubAllocator::kSlabGranules) {
    const unsigned shift = i & 63;
    const std::uint64_t w = bits[i >> 6] >> shift;  // bit 0 = granule i; the high bits are clear
    const unsigned avail = 64 - shift;
    if ((w & 1) == 0) {  // clear bits from i, to the next set bit or the word's end
      const unsigned clear = w == 0 ? avail : static_cast<unsigned>(std::countr_zero(w));
      if (run == 0) start = i;
      run += clear;
      if (run >= k) return start;
      i += clear;
    } else {  // set bits from i (~w: the high bits become set, so the count stops at the word's end)
      run = 0;
      i += static_cast<unsigned>(std::countr_zero(~w));
    }
  }
  return kNotFound;
}

void set_bits(Bits& bits, std::uint64_t first, std::uint64_t count, bool value) {
  while (count > 0) {
    const unsigned shift = first & 63;
    const std::uint64_t n = std::min<std::uint64_t>(count, 64 - shift);
    const std::uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << shift;
    if (value) bits[first >> 6] |= mask;
    else bits[first >> 6] &= ~mask;
    first += n;
    count -= n;
  }
}

}  // namespace

std::uint64_t SubAllocator::footprint_bytes(std::uint64_t bytes) {
  const std::uint64_t small = (bytes + kGranule - 1) / kGranule * kGranule;
  if (small <= kSmallMax) return small;
  return (bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
}

std::uint64_t SubAllocator::range_bytes_for(std::uint64_t bytes, std::uint64_t range_bytes) {
  const std::uint64_t need = std::max(footprint_bytes(bytes), kChunkBytes);
  const std::uint64_t want = (range_bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
  return std::max(need, want);
}

void SubAllocator::add_range(std::uint64_t base, std::uint64_t bytes) {
  ranges_[base] = Range{bytes, 0};
  range_total_ += bytes;
  runs_.give(base, bytes, base, base + bytes);
}

namespace {
// The range of `ranges` (by base) that holds `addr`, or ranges.end(); const or not.
template <class Ranges>
auto range_holding(Ranges& ranges, std::uint64_t addr) {
  auto it = ranges.upper_bound(addr);
  if (it == ranges.begin()) return ranges.end();
  --it;
  return addr - it->first < it->second.bytes ? it : ranges.end();
}
}  // namespace

std::map<std::uint64_t, SubAllocator::Range>::iterator SubAllocator::range_of(std::uint64_t addr) {
  return range_holding(ranges_, addr);
}

bool SubAllocator::contains(std::uint64_t addr) const { return range_holding(ranges_, addr) != ranges_.end(); }

bool SubAllocator::same_range(std::uint64_t a, std::uint64_t b) const {
  const auto range = range_holding(ranges_, a);
  return range != ranges_.end() && b >= range->first && b - range->first < range->second.bytes;
}

std::uint64_t SubAllocator::allocate_chunks(std::uint64_t chunks) {
  const std::optional<std::uint64_t> base = runs_.take(chunks * kChunkBytes);
  if (!base) return 0;
  range_of(*base)->second.used_chunks += chunks;
  return *base;
}

void SubAllocator::free_chunks(std::uint64_t addr, std::uint64_t chunks) {
  auto range = range_of(addr);
  range->second.used_chunks -= chunks;
  runs_.give(addr, chunks * kChunkBytes, range->first, range->first + range->second.bytes);
}

std::uint32_t SubAllocator::new_slab() {
  const std::uint64_t base = allocate_chunks(1);
  if (base == 0) return kNotFound;
  std::uint32_t id;
  if (!free_slab_ids_.empty()) {
    id = free_slab_ids_.back();
    free_slab_ids_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(slabs_.size());
    slabs_.emplace_back();
  }
  slabs_[id].base = base;
  slab_of_.set(base / kChunkBytes, id + 1);
  return id;
}

bool SubAllocator::place_in(std::uint32_t id, std::uint64_t granules, std::uint32_t from, std::uint64_t* addr) {
  Slab& s = slabs_[id];
  if (s.free_granules < granules || s.held_empty) return false;
  std::uint32_t at = find_clear_run(s.used, granules, from);
  if (at == kNotFound && from > 0) at = find_clear_run(s.used, granules, 0);
  if (at == kNotFound) return false;
  set_bits(s.used, at, granules, true);
  s.free_granules -= static_cast<std::uint32_t>(granules);
  s.hint = static_cast<std::uint32_t>(at + granules) % kSlabGranules;
  *addr = s.base + at * kGranule;
  return true;
}

std::uint64_t SubAllocator::allocate_small(std::uint64_t granules, std::uint64_t site) {
  std::uint32_t& current = current_[site % kSites];
  std::uint64_t addr = 0;
  if (current != 0 && place_in(current - 1, granules, slabs_[current - 1].hint, &addr)) return addr;
  // Partly free slabs, oldest listed first; a slab found full (or too fragmented for this
  // request) leaves the list or goes to its back.
  for (unsigned tried = 0; tried < kSlabsTried && !partial_.empty(); ++tried) {
    const auto [id, generation] = partial_.front();
    partial_.pop_front();
    Slab& s = slabs_[id];
    if (s.generation != generation) continue;  // (the slab was released; its id reused)
    if (s.held_empty || s.free_granules == 0) {
      s.listed = false;
      continue;
    }
    if (place_in(id, granules, 0, &addr)) {
      if (s.free_granules > 0) partial_.emplace_back(id, generation);
      else s.listed = false;
      current = id + 1;
      return addr;
    }
    partial_.emplace_back(id, generation);
  }
  const std::uint32_t id = new_slab();
  if (id == kNotFound) return 0;
  place_in(id, granules, 0, &addr);
  current = id + 1;
  return addr;
}

std::uint64_t SubAllocator::allocate(std::uint64_t bytes, std::uint64_t site) {
  if (bytes == 0) return 0;
  const std::uint64_t footprint = footprint_bytes(bytes);
  const std::uint64_t addr = footprint <= kSmallMax ? allocate_small(footprint / kGranule, site)
                                                    : allocate_chunks(footprint / kChunkBytes);
  if (addr != 0) allocated_ += footprint;
  return addr;
}

std::uint64_t SubAllocator::free(std::uint64_t addr, std::uint64_t bytes) {
  const std::uint64_t footprint = footprint_bytes(bytes);
  allocated_ -= footprint;
  if (footprint > kSmallMax) {
    free_chunks(addr, footprint / kChunkBytes);
    return 0;
  }
  const std::uint32_t* slot = slab_of_.find(addr / kChunkBytes);
  Slab& s = slabs_[*slot - 1];
  const std::uint32_t id = *slot - 1;
  set_bits(s.used, (addr - s.base) / kGranule, footprint / kGranule, false);
  s.free_granules += static_cast<std::uint32_t>(footprint / kGranule);
  if (s.free_granules == kSlabGranules) {
    s.held_empty = true;
    for (std::uint32_t& c : current_) {
      if (c == id + 1) c = 0;
    }
    return s.base;
  }
  if (!s.listed) {
    s.listed = true;
    partial_.emplace_back(id, s.generation);
  }
  return 0;
}

void SubAllocator::release_slab(std::uint64_t base) {
  const std::uint64_t chunk = base / kChunkBytes;
  const std::uint32_t id = *slab_of_.find(chunk) - 1;
  slab_of_.set(chunk, 0);
  const std::uint32_t generation = slabs_[id].generation + 1;  // (its entries in partial_ go stale)
  slabs_[id] = Slab{};
  slabs_[id].generation = generation;
  free_slab_ids_.push_back(id);
  free_chunks(base, 1);
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> SubAllocator::take_empty_ranges() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (it->second.used_chunks != 0) {
      ++it;
      continue;
    }
    runs_.remove(it->first, it->second.bytes);  // (nothing used: the range is one free run)
    range_total_ -= it->second.bytes;
    out.emplace_back(it->first, it->second.bytes);
    it = ranges_.erase(it);
  }
  return out;
}

std::uint64_t SubAllocator::state_bytes() const {
  return tree_heap_bytes<decltype(ranges_)>(ranges_.size()) * 3 + vector_heap_bytes(slabs_) + vector_heap_bytes(free_slab_ids_) +
         slab_of_.heap_bytes() + partial_.size() * 8 * 9 / 8;
}

}  // namespace spillway
