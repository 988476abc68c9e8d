// Per-2 MiB-chunk slots, allocated a page of consecutive chunks at a time: a look-up is one
// search among the pages (few: one per 2^PageBits chunks of address space in use) and one
// load, where a hash map of chunks costs a bucket, a predecessor node and the node — three
// dependent cache misses once there are thousands of chunks. The allocation table's index,
// the Engine's residency plan and `learned`'s per-chunk records use it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "spillway/state_bytes.h"

namespace spillway {

// Slots of T, value-initialised, for chunk indices (address / 2 MiB). A page's address is
// stable until it is freed (drop_if_unused(), or assign()/set() emptying it), so a slot may
// be held by pointer meanwhile; an owner that never empties pages (operator[] alone) keeps
// every slot's address.
// Memory: sizeof(T) << PageBits per page holding any slot in use. Not thread-safe: the
// owner serialises access (find() and the const accessors may run concurrently).
template <class T, unsigned PageBits>
class ChunkPages {
 public:
  static constexpr std::uint64_t kPageChunks = 1ull << PageBits;
  struct Page {
    std::array<T, kPageChunks> slot{};
    std::uint64_t used = 0;  // slots in use (kept by assign()/set()): the page is freed at 0
  };

  // The page holding `chunk`, or nullptr when none does.
  Page* page(std::uint64_t chunk) const {
    auto it = pages_.find(chunk >> PageBits);
    return it == pages_.end() ? nullptr : it->second.get();
  }
  // The page holding `chunk`, allocated if there was none.
  Page& page_or_add(std::uint64_t chunk) {
    auto it = pages_.find(chunk >> PageBits);
    if (it != pages_.end()) return *it->second;
    auto page = std::make_unique<Page>();  // (first: if it throws, the map is unchanged)
    return *pages_.emplace(chunk >> PageBits, std::move(page)).first->second;
  }
  // The slot of `chunk`, or nullptr when no page holds it.
  T* find(std::uint64_t chunk) const {
    Page* p = page(chunk);
    return p == nullptr ? nullptr : &p->slot[chunk & (kPageChunks - 1)];
  }
  // The slot of `chunk`, its page allocated if there was none.
  T& operator[](std::uint64_t chunk) { return page_or_add(chunk).slot[chunk & (kPageChunks - 1)]; }
  // Sets the slots of chunks [first, end) to `value`, keeping each page's `used` as the
  // number of its slots that differ from T{}: a page is allocated when such a value goes in
  // and freed when its last one is reset to T{} (then no pointer into it may be held). One
  // page look-up per page of the range.
  void assign(std::uint64_t first, std::uint64_t end, const T& value) {
    const bool vacant = value == T{};
    while (first < end) {
      const std::uint64_t page_end = std::min(end, (first / kPageChunks + 1) * kPageChunks);
      Page* p = vacant ? page(first) : &page_or_add(first);
      if (p != nullptr) {
        for (std::uint64_t c = first; c < page_end; ++c) {
          T& slot = p->slot[c & (kPageChunks - 1)];
          if (slot == T{} && !vacant) ++p->used;
          if (slot != T{} && vacant) --p->used;
          slot = value;
        }
        if (p->used == 0) drop_if_unused(first);
      }
      first = page_end;
    }
  }
  // assign() for one chunk (one page look-up).
  void set(std::uint64_t chunk, const T& value) {
    const bool vacant = value == T{};
    auto it = pages_.find(chunk >> PageBits);
    if (it == pages_.end()) {
      if (vacant) return;
      auto page = std::make_unique<Page>();  // (first: if it throws, the map is unchanged)
      it = pages_.emplace(chunk >> PageBits, std::move(page)).first;
    }
    Page& p = *it->second;
    T& slot = p.slot[chunk & (kPageChunks - 1)];
    if (slot == T{} && !vacant) ++p.used;
    if (slot != T{} && vacant) --p.used;
    slot = value;
    if (p.used == 0) pages_.erase(it);
  }
  // Frees the page holding `chunk` if its `used` count is 0 (its slots are then lost).
  void drop_if_unused(std::uint64_t chunk) {
    auto it = pages_.find(chunk >> PageBits);
    if (it != pages_.end() && it->second->used == 0) pages_.erase(it);
  }
  // Calls visit(T&) for every slot of every page, in no particular order.
  template <class F>
  void for_each_slot(F&& visit) {
    for (auto& [key, p] : pages_) {
      for (T& s : p->slot) visit(s);
    }
  }
  std::size_t pages() const { return pages_.size(); }
  // Heap bytes held: the pages and their map's nodes and buckets (spillway/state_bytes.h).
  std::uint64_t heap_bytes() const { return pages_.size() * heap_block_bytes(sizeof(Page)) + hash_heap_bytes(pages_); }

 private:
  std::unordered_map<std::uint64_t, std::unique_ptr<Page>> pages_;  // chunk >> PageBits -> page
};

}  // namespace spillway
