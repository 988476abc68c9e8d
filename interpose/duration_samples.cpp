#include "duration_samples.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <deque>
#include <mutex>
#include <vector>

#include "cuda_backend.h"
#include "shim.h"

namespace spillway::hook {

using interpose::real;

namespace {

constexpr std::uint64_t kSampleEvery = 64;  // 1 launch in 64 per execution id is timed
constexpr std::size_t kMaxPendingSamples = 32;

struct DurSlot {
  std::atomic<std::uint64_t> key{0};
  std::atomic<std::uint64_t> dur{0};
  std::atomic<std::uint64_t> count{0};
};
constexpr std::size_t kDurSlots = 4096;
std::array<DurSlot, kDurSlots>& dur_slots() {
  static auto* t = new std::array<DurSlot, kDurSlots>();
  return *t;
}
// The slot of an execution id: the top bits of a multiplicative hash. (Not exec_id %
// kDurSlots: mix() leaves the low bits of an id independent of pointers whose own low bits
// are zero, as allocations' are, so every launch of one kernel would share one slot.)
DurSlot& dur_slot(std::uint64_t exec_id) {
  static_assert((kDurSlots & (kDurSlots - 1)) == 0);
  return dur_slots()[(exec_id * 0x9e3779b97f4a7c15ull) >> (64 - std::countr_zero(kDurSlots))];
}

struct Sample {
  std::uint64_t exec_id;
  CUevent start, end;
};
std::mutex g_sample_mutex;
std::deque<Sample>& pending_samples() {
  static auto* q = new std::deque<Sample>();
  return *q;
}
std::vector<CUevent>& free_events() {
  static auto* v = new std::vector<CUevent>();
  return *v;
}
std::atomic<std::size_t> g_pending{0};

}  // namespace

// The last measured duration of `exec_id` (0 unknown), and whether to time this launch.
std::uint64_t duration_of(std::uint64_t exec_id, bool* sample) {
  DurSlot& s = dur_slot(exec_id);
  std::uint64_t key = exec_id | 1;  // 0 marks an empty slot
  if (s.key.load(std::memory_order_relaxed) != key) {
    s.key.store(key, std::memory_order_relaxed);
    s.dur.store(0, std::memory_order_relaxed);
    s.count.store(0, std::memory_order_relaxed);
  }
  *sample = s.count.fetch_add(1, std::memory_order_relaxed) % kSampleEvery == 0 &&
            g_pending.load(std::memory_order_relaxed) < kMaxPendingSamples;
  return s.dur.load(std::memory_order_relaxed);
}

CUevent take_event() {
  {
    std::lock_guard lock(g_sample_mutex);
    if (!free_events().empty()) {
      CUevent e = free_events().back();
      free_events().pop_back();
      return e;
    }
  }
  CUevent e = nullptr;
  if (real().cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
  return e;
}

void give_event(CUevent e) {
  if (e == nullptr) return;
  std::lock_guard lock(g_sample_mutex);
  free_events().push_back(e);
}

// Collects completed samples, oldest first, without blocking.
void poll_samples() {
  if (g_pending.load(std::memory_order_relaxed) == 0) return;
  std::unique_lock lock(g_sample_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  interpose::ShimCallScope scope;
  interpose::RelaxedCaptureMode relaxed;
  auto& q = pending_samples();
  while (!q.empty()) {
    Sample s = q.front();
    CUresult r = real().cuEventQuery(s.end);
    if (r == CUDA_ERROR_NOT_READY) break;
    q.pop_front();
    g_pending.fetch_sub(1, std::memory_order_relaxed);
    float ms = 0;
    if (r == CUDA_SUCCESS && real().cuEventElapsedTime_v2 != nullptr &&
        real().cuEventElapsedTime_v2(&ms, s.start, s.end) == CUDA_SUCCESS && ms >= 0) {
      DurSlot& slot = dur_slot(s.exec_id);
      if (slot.key.load(std::memory_order_relaxed) == (s.exec_id | 1)) {
        slot.dur.store(std::max<std::uint64_t>(1, static_cast<std::uint64_t>(ms * 1e6)), std::memory_order_relaxed);
      }
    }
    free_events().push_back(s.start);
    free_events().push_back(s.end);
  }
}

void add_sample(std::uint64_t exec_id, CUevent start, CUevent end) {
  std::lock_guard lock(g_sample_mutex);
  pending_samples().push_back(Sample{exec_id, start, end});
  g_pending.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace spillway::hook
