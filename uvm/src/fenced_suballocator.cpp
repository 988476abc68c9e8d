#include "spillway/fenced_suballocator.h"

#include <algorithm>

#include "spillway/log.h"
#include "spillway/size.h"
#include "spillway/state_bytes.h"

namespace spillway {

std::uint16_t FencedSubAllocator::find_context_locked(std::uint64_t handle) const {
  for (const auto& [number, c] : contexts_)
    if (c.handle == handle) return number;
  return 0;
}

std::uint16_t FencedSubAllocator::context_number_locked(std::uint64_t handle) {
  if (const std::uint16_t known = find_context_locked(handle); known != 0) return known;
  std::uint16_t number = 1;  // the lowest free
  for (const auto& entry : contexts_) {
    if (entry.first != number) break;
    ++number;
  }
  if (number == 0) return 0;  // (wrapped: every number is in use)
  contexts_[number].handle = handle;
  return number;
}

std::uint16_t FencedSubAllocator::context_number(std::uint64_t handle) {
  std::lock_guard lock(mutex_);
  return context_number_locked(handle);
}

SubAllocator* FencedSubAllocator::sub_of_locked(std::uint16_t context) {
  auto it = contexts_.find(context);
  return it == contexts_.end() ? nullptr : &it->second.sub;
}

std::uint64_t FencedSubAllocator::try_carve_locked(std::uint16_t context, std::uint64_t bytes, StreamHandle site) {
  // (Looked up each time: the lock is let go around the Backend's calls.)
  SubAllocator* sub = sub_of_locked(context);
  return sub == nullptr ? 0 : sub->allocate(bytes, site);
}

std::uint64_t FencedSubAllocator::carve_locked(std::uint16_t context, std::uint64_t bytes, StreamHandle site) {
  if (fences_pending_.load(std::memory_order_relaxed)) poll_fences_locked(false);
  std::uint64_t base = try_carve_locked(context, bytes, site);
  if (base == 0 && !unfenced_.empty()) {  // parked ranges come back once a fence after them completes
    close_fence_locked();
    poll_fences_locked(false);
    base = try_carve_locked(context, bytes, site);
  }
  return base;
}

std::uint64_t FencedSubAllocator::reserve_range_bytes(std::uint64_t bytes) {
  // kRangeBytes if the cap allows, else just the request (a chunk more, so that a range the
  // driver does not place on a 2 MiB boundary still holds it aligned).
  std::uint64_t want = SubAllocator::range_bytes_for(bytes, kRangeBytes) + kChunkBytes;
  if (cap_.reserve(want)) return want;
  want = SubAllocator::range_bytes_for(bytes, 0) + kChunkBytes;
  return cap_.reserve(want) ? want : 0;
}

Result FencedSubAllocator::allocate(std::uint64_t handle, std::uint64_t bytes, StreamHandle site, std::uint64_t* out,
                                    std::uint16_t* context) {
  Lock lock(mutex_);
  const std::uint16_t number = context_number_locked(handle);
  if (number == 0) return Result{Status::not_supported, 0};
  *context = number;
  std::uint64_t base = carve_locked(number, bytes, site);
  bool waited = false, returned = false;
  while (base == 0) {
    if (sub_of_locked(number) == nullptr) return Result{Status::error, 0};  // its context ended meanwhile
    const std::uint64_t want = reserve_range_bytes(bytes);
    if (want == 0) {
      if (!waited) {  // parked ranges may hold the room: wait for their fences (never in a free)
        waited = true;
        close_fence_locked();
        poll_fences_locked(true);
        base = try_carve_locked(number, bytes, site);
        continue;
      }
      if (returned || !return_empty_ranges_locked(lock)) return Result{Status::out_of_memory, 0};
      returned = true;
      continue;
    }
    if (Result r = add_range_locked(lock, number, bytes, want); !r.ok()) return r;
    base = try_carve_locked(number, bytes, site);
  }
  *out = base;
  return Result{};
}

bool FencedSubAllocator::return_empty_ranges_locked(Lock& lock) {
  std::vector<DriverRange> empty;
  for (auto& entry : contexts_) {
    if (entry.second.ending) continue;  // (its ranges go with it: the driver frees them)
    for (const auto& [b, n] : entry.second.sub.take_empty_ranges()) {
      auto it = driver_ranges_.find(b);
      empty.push_back(it->second);
      driver_ranges_.erase(it);
    }
  }
  if (empty.empty()) return false;
  lock.unlock();
  // (Nothing lives in them and nothing parked: no section can name them, no fence holds them.)
  for (const DriverRange& d : empty) {
    range_bytes_.fetch_sub(d.bytes);
    range_count_.fetch_sub(1);
    if (backend_.free_managed(d.addr).ok()) cap_.unreserve(d.bytes);
  }
  lock.lock();
  return true;
}

Result FencedSubAllocator::add_range_locked(Lock& lock, std::uint16_t context, std::uint64_t bytes, std::uint64_t want) {
  lock.unlock();
  std::uint64_t driver = 0;
  Result r = backend_.allocate_managed(want, &driver);
  const std::uint64_t need = SubAllocator::range_bytes_for(bytes, 0) + kChunkBytes;
  if (!r.ok() && want > need) {  // the driver may still have room for the request alone
    cap_.unreserve(want - need);
    want = need;
    r = backend_.allocate_managed(want, &driver);
  }
  lock.lock();
  if (!r.ok()) {
    cap_.unreserve(want);
    return r;
  }
  SubAllocator* sub = sub_of_locked(context);
  if (sub == nullptr) {  // its context ended meanwhile, and the new range with it
    cap_.unreserve(want);
    return Result{Status::error, 0};
  }
  const std::uint64_t lo = (driver + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
  const std::uint64_t hi = (driver + want) / kChunkBytes * kChunkBytes;
  sub->add_range(lo, hi - lo);
  driver_ranges_[lo] = DriverRange{driver, want, context};
  range_bytes_.fetch_add(want);
  range_count_.fetch_add(1);
  return Result{};
}

void FencedSubAllocator::park_locked(const ParkedRange& range) {
  unfenced_.push_back(range);
  const std::uint64_t footprint = range.slab ? kChunkBytes : SubAllocator::footprint_bytes(range.bytes);
  unfenced_bytes_ += footprint;
}

void FencedSubAllocator::park_freed(std::uint64_t addr, std::uint64_t bytes, std::uint16_t context, bool fence_now) {
  std::lock_guard lock(mutex_);
  park_locked(ParkedRange{addr, bytes, false, context});
  if (fence_now || unfenced_bytes_ >= kFenceBytes || unfenced_.size() >= kFenceRanges) close_fence_locked();
  if (fences_pending_.load(std::memory_order_relaxed)) poll_fences_locked(false);
}

void FencedSubAllocator::wait_for_fences() {
  std::lock_guard lock(mutex_);
  close_fence_locked();
  poll_fences_locked(true);
}

void FencedSubAllocator::close_fence_locked() {
  if (unfenced_.empty()) return;
  // Whole chunks no block can share: large blocks' and emptied slabs'.
  std::vector<std::uint64_t> addrs, sizes;
  std::uint64_t discard = 0;
  for (const ParkedRange& p : unfenced_) {
    if (!p.slab && SubAllocator::is_small(p.bytes)) continue;
    // (A context about to end: the driver frees its ranges, and may reuse their addresses
    // before a discard queued now would run.)
    if (contexts_ending_ != 0) {
      auto c = contexts_.find(p.context);
      if (c == contexts_.end() || c->second.ending) continue;
    }
    addrs.push_back(p.addr);
    sizes.push_back(p.slab ? kChunkBytes : SubAllocator::footprint_bytes(p.bytes));
    discard += sizes.back();
  }
  EventHandle fence = 0;
  Result r = backend_.record_fence(addrs.data(), sizes.data(), addrs.size(), &fence);
  if (!r.ok()) {
    // (not_ready: a capture is in progress; the ranges stay parked until a later fence)
    if (r.status != Status::not_ready) backend_errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  fences_.push_back(Fence{fence, std::move(unfenced_)});
  unfenced_.clear();
  unfenced_bytes_ = 0;
  fences_recorded_.fetch_add(1, std::memory_order_relaxed);
  discarded_bytes_.fetch_add(discard, std::memory_order_relaxed);
  fences_pending_.store(true, std::memory_order_relaxed);
}

void FencedSubAllocator::reuse_locked(const ParkedRange& p, bool* emptied) {
  SubAllocator* sub = sub_of_locked(p.context);
  if (sub == nullptr) return;  // (its context has ended, and the driver freed it)
  if (backend_.held_by_capture(p.addr, p.slab ? kChunkBytes : p.bytes)) {
    // (Parked again: the next fence looks once more.)
    SPILLWAY_LOG_ONCE(LogLevel::warn,
                      "freed memory at {:#x} ({}) is held, not reused: a stream capture in progress (begun and "
                      "not ended) captured work that uses it; it is reused once that capture ends",
                      p.addr, format_bytes(p.slab ? kChunkBytes : p.bytes));
    park_locked(p);
    return;
  }
  if (p.slab) {
    sub->release_slab(p.addr);
    return;
  }
  if (const std::uint64_t slab = sub->free(p.addr, p.bytes); slab != 0) {
    park_locked(ParkedRange{slab, kChunkBytes, true, p.context});
    *emptied = true;
  }
}

void FencedSubAllocator::poll_fences_locked(bool wait) {
  bool emptied = false;
  while (!fences_.empty()) {
    Fence& f = fences_.front();
    Result r = wait ? wait_at_cap(backend_, cap_, f.handle, true) : backend_.fence_done(f.handle);
    if (r.status == Status::not_ready) break;
    // (An error: the driver cannot say; a context torn down has no work left. Its ranges come back.)
    backend_.release_fence(f.handle);
    std::vector<ParkedRange> ranges = std::move(f.ranges);
    fences_.pop_front();
    for (const ParkedRange& p : ranges) reuse_locked(p, &emptied);
  }
  if (emptied) close_fence_locked();  // discard the emptied slabs now (stream-ordered), reuse them after
  fences_pending_.store(!fences_.empty(), std::memory_order_relaxed);
}

std::uint64_t FencedSubAllocator::reusable_bytes() const {
  std::lock_guard lock(mutex_);
  std::uint64_t room = 0;
  for (const auto& c : contexts_) room += c.second.sub.range_bytes() - c.second.sub.allocated_bytes();
  // (A parked slab's blocks are free in it already.)
  auto parked = [&room](const ParkedRange& p) { room += p.slab ? 0 : SubAllocator::footprint_bytes(p.bytes); };
  std::for_each(unfenced_.begin(), unfenced_.end(), parked);
  for (const Fence& f : fences_) std::for_each(f.ranges.begin(), f.ranges.end(), parked);
  return room;
}

bool FencedSubAllocator::contains(std::uint64_t addr) const {
  std::lock_guard lock(mutex_);
  return std::any_of(contexts_.begin(), contexts_.end(), [addr](const auto& c) { return c.second.sub.contains(addr); });
}

bool FencedSubAllocator::same_range_if_free(std::uint64_t a, std::uint64_t b) const {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  return std::any_of(contexts_.begin(), contexts_.end(), [a, b](const auto& c) { return c.second.sub.same_range(a, b); });
}

std::optional<std::uint64_t> FencedSubAllocator::state_bytes_if_free() const {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  std::uint64_t bytes = tree_heap_bytes<decltype(contexts_)>(contexts_.size());
  for (const auto& c : contexts_) bytes += c.second.sub.state_bytes();
  return bytes;
}

void FencedSubAllocator::begin_context_end(std::uint64_t handle) {
  std::lock_guard lock(mutex_);
  const std::uint16_t number = find_context_locked(handle);
  if (number == 0) return;
  ContextRanges& c = contexts_[number];
  if (!c.ending) ++contexts_ending_;
  c.ending = true;
  auto holds = [number](const Fence& f) {
    return std::any_of(f.ranges.begin(), f.ranges.end(), [number](const ParkedRange& p) { return p.context == number; });
  };
  // A fence's end may empty slabs, whose discard a new fence carries (none for this context
  // now): a round or two. Only the fences that hold its ranges are waited for.
  for (int round = 0; round < 4; ++round) {
    auto f = std::find_if(fences_.begin(), fences_.end(), holds);
    if (f == fences_.end()) return;
    if (backend_.wait_fence_for(f->handle, cap_.wait()).status == Status::not_ready) {
      SPILLWAY_LOG_ONCE(LogLevel::warn,
                        "a context ends (cuCtxDestroy, or a primary context's reset or last release) while device work "
                        "on memory freed in it has not finished after {} ms (a kernel that never ends?); it ends now",
                        cap_.wait().count());
      return;
    }
    poll_fences_locked(false);
  }
}

std::uint16_t FencedSubAllocator::context_end_answered(std::uint64_t handle, bool ended) {
  std::lock_guard lock(mutex_);
  const std::uint16_t number = find_context_locked(handle);
  if (number == 0 || ended) return number;
  ContextRanges& c = contexts_[number];
  if (c.ending) --contexts_ending_;
  c.ending = false;
  return 0;
}

void FencedSubAllocator::drop_context(std::uint16_t context) {
  std::lock_guard lock(mutex_);
  auto of_context = [context](const ParkedRange& p) { return p.context == context; };
  std::erase_if(unfenced_, of_context);
  unfenced_bytes_ = 0;
  for (const ParkedRange& p : unfenced_) unfenced_bytes_ += p.slab ? kChunkBytes : SubAllocator::footprint_bytes(p.bytes);
  for (Fence& f : fences_) std::erase_if(f.ranges, of_context);
  for (auto it = driver_ranges_.begin(); it != driver_ranges_.end();) {
    if (it->second.context != context) {
      ++it;
      continue;
    }
    range_bytes_.fetch_sub(it->second.bytes);
    range_count_.fetch_sub(1);
    cap_.unreserve(it->second.bytes);
    it = driver_ranges_.erase(it);
  }
  if (auto c = contexts_.find(context); c != contexts_.end() && c->second.ending) --contexts_ending_;
  contexts_.erase(context);
}

}  // namespace spillway
