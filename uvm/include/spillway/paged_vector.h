// An append-only array stored in fixed-size pages: what `learned`'s history is kept in
// (docs/learned-policy.md §9). A std::vector doubles its storage when it fills and holds the old copy while
// it moves the elements, so a history of N bytes takes up to 3N at that moment and 2N
// after; the pages here grow by one page at a time and never move an element, so the memory
// held is the elements' bytes rounded up to a page, which the state budget
// (SPILLWAY_STATE_MEMORY) can count exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace spillway {

// Elements of T (default-constructible, trivially copyable in practice), 2^PageBits to a
// page. Indexing is one shift, one mask and two loads. Element addresses are stable until
// clear() or destruction. Not thread-safe.
template <class T, unsigned PageBits = 12>
class PagedVector {
 public:
  static constexpr std::size_t kPageElements = std::size_t{1} << PageBits;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return pages_[i >> PageBits][i & (kPageElements - 1)]; }
  const T& operator[](std::size_t i) const { return pages_[i >> PageBits][i & (kPageElements - 1)]; }
  T& back() { return (*this)[size_ - 1]; }
  const T& back() const { return (*this)[size_ - 1]; }
  // Appends `value`; allocates one page when the last is full (may throw std::bad_alloc,
  // leaving the array unchanged).
  void push_back(const T& value) {
    if ((size_ & (kPageElements - 1)) == 0 && (size_ >> PageBits) == pages_.size()) {
      auto page = std::make_unique<T[]>(kPageElements);
      pages_.push_back(std::move(page));  // (if this throws, `page` still owns the page and frees it)
    }
    (*this)[size_++] = value;
  }
  // Drops every element and frees every page.
  void clear() {
    pages_.clear();
    pages_.shrink_to_fit();
    size_ = 0;
  }
  void swap(PagedVector& other) noexcept {
    pages_.swap(other.pages_);
    std::swap(size_, other.size_);
  }
  // Heap bytes held: the pages and the table of page pointers (its capacity).
  std::uint64_t bytes() const {
    return static_cast<std::uint64_t>(pages_.size()) * kPageElements * sizeof(T) +
           static_cast<std::uint64_t>(pages_.capacity()) * sizeof(std::unique_ptr<T[]>);
  }
  // Heap bytes `n` more elements would add at most (whole pages).
  static std::uint64_t bytes_for(std::size_t n) {
    return static_cast<std::uint64_t>((n + kPageElements - 1) / kPageElements + 1) * kPageElements * sizeof(T);
  }

 private:
  std::vector<std::unique_ptr<T[]>> pages_;
  std::size_t size_ = 0;
};

}  // namespace spillway
