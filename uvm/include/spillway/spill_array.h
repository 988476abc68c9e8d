// A growable array of trivially copyable elements kept in a file mapped into memory: what
// the simulator's compiled traces are stored in, so that a trace of ten million launches
// is simulated in memory that does not grow with its length. The
// elements live in an unlinked temporary file (gone when the process ends) mapped shared;
// its pages are the kernel's page cache, written back and dropped under memory pressure,
// and release() drops the process's mapping of a range it has passed (a later access reads
// it back in: the data stay in the file). Readers that move through the array in order
// release what lies behind them, so the process holds the window it is working on.
//
// The file goes in $SPILLWAY_SPILL_DIR, else $TMPDIR, else /var/tmp, else /tmp. Where no
// file can be made there, the array is anonymous memory (release() then does nothing: the
// pages are the only copy) and one line says so, once.
//
// Sources: mmap(2) and madvise(2) (MADV_DONTNEED on a shared file mapping: "subsequent
// accesses ... repopulat[e] the memory contents from the up-to-date contents of the
// underlying mapped file"), mremap(2), open(2) O_TMPFILE.
//
// Thread-safety: concurrent readers (const accessors, release()) are safe; writers
// (push_back, resize, operator[] for writing) need exclusive access, as for std::vector.
// A reference or pointer into the array is invalidated by any call that grows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace spillway {

namespace spill_detail {
// The mapping of one array: a file descriptor (-1: anonymous), its base and capacity in
// bytes. Defined in uvm/src/spill_array.cpp. Throws std::bad_alloc when no memory can be
// mapped at all.
struct Mapping {
  int fd = -1;
  void* base = nullptr;
  std::size_t capacity = 0;  // bytes mapped (and the file's size)
  void grow(std::size_t bytes);  // to at least `bytes` (doubling); contents kept
  void release(std::size_t from, std::size_t to) const;  // bytes [from, to), whole pages inside
  void reset() noexcept;  // unmaps and closes
};
}  // namespace spill_detail

template <class T>
class SpillArray {
  static_assert(std::is_trivially_copyable_v<T>, "SpillArray holds trivially copyable elements");

 public:
  using value_type = T;
  SpillArray() = default;
  ~SpillArray() { m_.reset(); }
  SpillArray(SpillArray&& o) noexcept : m_(std::exchange(o.m_, {})), size_(std::exchange(o.size_, 0)) {}
  SpillArray& operator=(SpillArray&& o) noexcept {
    if (this != &o) {
      m_.reset();
      m_ = std::exchange(o.m_, {});
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  SpillArray(const SpillArray&) = delete;
  SpillArray& operator=(const SpillArray&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return static_cast<T*>(m_.base); }
  const T* data() const { return static_cast<const T*>(m_.base); }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }

  void push_back(const T& value) {
    if ((size_ + 1) * sizeof(T) > m_.capacity) {
      const T copy = value;  // (`value` may lie in the array, which grow() moves)
      m_.grow((size_ + 1) * sizeof(T));
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = value;
  }
  // New elements are value-initialised.
  void resize(std::size_t n) {
    if (n * sizeof(T) > m_.capacity) m_.grow(n * sizeof(T));
    for (std::size_t i = size_; i < n; ++i) data()[i] = T{};
    size_ = n;
  }
  void reserve(std::size_t n) {
    if (n * sizeof(T) > m_.capacity) m_.grow(n * sizeof(T));
  }
  // Drops the process's memory for elements [from, to) (their whole pages); the data stay.
  void release(std::size_t from, std::size_t to) const {
    if (to > size_) to = size_;
    if (from < to) m_.release(from * sizeof(T), to * sizeof(T));
  }
  // Bytes mapped (the file's size).
  std::size_t capacity_bytes() const { return m_.capacity; }

 private:
  spill_detail::Mapping m_;
  std::size_t size_ = 0;
};

}  // namespace spillway
