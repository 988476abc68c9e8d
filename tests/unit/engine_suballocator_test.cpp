// The Engine's sub-allocator path (engine.h, sub_allocator.h) over a Backend whose fences
// complete only when the test says so: a freed range is never reused before a fence after
// its free has completed, a free never waits, only whole dead chunks are discarded, and the
// cap counts the ranges.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "../support/instant_backend.h"
#include "spillway/engine.h"
#include "spillway/policy.h"
#include "policy_registry.h"

namespace spillway {
namespace {

class FenceBackend final : public test_support::InstantBackend {
 public:
  bool supports_fences() override { return true; }
  Result record_fence(const std::uint64_t* addr, const std::uint64_t* bytes, std::size_t count, EventHandle* fence) override {
    if (refuse_fences) return Result{Status::not_ready, 0};
    *fence = ++fences;
    for (std::size_t i = 0; i < count; ++i) discards.push_back({addr[i], bytes[i], *fence});
    return {};
  }
  Result fence_done(EventHandle fence) override {
    return fence <= completed && !stuck ? Result{} : Result{Status::not_ready, 0};
  }
  Result wait_fence(EventHandle fence) override {
    ++waits;
    if (stuck) {
      ++unbounded_waits;  // (a wait that would never return, cut short so that the test can tell)
      return {};
    }
    completed = std::max<std::uint64_t>(completed, fence);
    return {};
  }
  // (Backend::wait_fence_for; no `override`, so that this file also builds against an
  // Engine without it and the test below shows the unbounded wait.)
  Result wait_fence_for(EventHandle fence, std::chrono::milliseconds timeout) {
    if (!stuck) return wait_fence(fence);
    bounded_wait = timeout;
    return Result{Status::not_ready, 0};
  }
  // (Backend::held_by_capture, likewise.)
  bool held_by_capture(std::uint64_t addr, std::uint64_t bytes) {
    return captured_addr != 0 && captured_addr < addr + bytes && addr < captured_addr + 1;
  }
  void release_fence(EventHandle) override {}
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int) override {
    prefetches.push_back({addr, bytes, to});
    calls.push_back({to, 0});
    return {};
  }
  bool can_batch_prefetches() override { return true; }
  Result prefetch_batch(const std::uint64_t* addr, const std::uint64_t* bytes, std::size_t count, Location to,
                        int) override {
    if (refuse_batches) {
      calls.push_back({to, ~std::size_t{0}});
      return Result{Status::not_supported, 801};
    }
    for (std::size_t i = 0; i < count; ++i) prefetches.push_back({addr[i], bytes[i], to});
    calls.push_back({to, count});
    return {};
  }
  struct Call {
    Location to;
    std::size_t batch;  // ranges of a prefetch_batch; 0: a prefetch
  };
  std::vector<Call> calls;  // in the order issued
  bool refuse_batches = false;  // prefetch_batch fails as a whole (a refused batch: batch ~0 in calls)
  struct Prefetch {
    std::uint64_t addr, bytes;
    Location to;
  };
  std::vector<Prefetch> prefetches;
  std::uint64_t current_context() override { return context; }
  std::uint64_t context = 0;  // the calling thread's current context, as the test sets it
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override {
    if (bytes > largest_allocation) return Result{Status::out_of_memory, 2};
    ++ranges;
    return InstantBackend::allocate_managed(bytes, addr);
  }
  std::uint64_t largest_allocation = ~0ull;  // the driver refuses larger allocations
  struct Discard {
    std::uint64_t addr, bytes, fence;
  };
  std::vector<Discard> discards;
  std::uint64_t fences = 0, completed = 0, waits = 0, ranges = 0;
  bool refuse_fences = false;
  bool stuck = false;  // fences never complete: work that never ends (a persistent kernel)
  std::uint64_t unbounded_waits = 0;
  std::chrono::milliseconds bounded_wait{0};
  std::uint64_t captured_addr = 0;  // a captured kernel uses this address (a capture in progress)
};

std::unique_ptr<Engine> make_engine(FenceBackend& b, std::uint64_t max_managed = 1ull << 40,
                                    std::unique_ptr<Policy> policy = make_policy("demand"), std::uint64_t budget = 0) {
  Config c;
  c.max_managed = SizeSetting{max_managed, 0.0, false};
  if (budget != 0) c.budget = SizeSetting{budget, 0.0, false};
  return std::make_unique<Engine>(c, b, std::move(policy));
}

// Manages residency and prefetches nothing itself: the Engine fetches each launch's footprint.
class FootprintOnly final : public Policy {
 public:
  std::string_view name() const override { return "footprint-only"; }
  bool manages_residency() const override { return true; }
};

// Two 4 KiB blocks, one after the other (0, 0 if an allocation failed).
std::pair<std::uint64_t, std::uint64_t> two_small_blocks(Engine& e) {
  std::uint64_t x = 0, y = 0;
  if (!e.allocate(4096, AllocKind::alloc, 0, &x).ok() || !e.allocate(4096, AllocKind::alloc, 0, &y).ok()) return {0, 0};
  return {x, y};
}

TEST(EngineSubAllocator, AFreedRangeComesBackOnlyAfterItsFenceCompletes) {
  FenceBackend b;
  auto e = make_engine(b);
  std::uint64_t a = 0, x = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &a).ok());
  ASSERT_TRUE(e->suballocating());
  bool ours = false;
  ASSERT_TRUE(e->release(a, std::nullopt, &ours).ok());
  EXPECT_TRUE(ours);
  EXPECT_EQ(b.waits, 0u) << "a free never waits for the device";
  EXPECT_EQ(b.fences, 0u) << "under demand (no plan) a free waits for the next batch's fence";
  // Allocations go on elsewhere; the first that finds no room records the batch's fence.
  for (int i = 0; i < 40 && b.fences == 0; ++i) {
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
    EXPECT_NE(x, a) << "reused before its fence was even recorded";
  }
  ASSERT_EQ(b.fences, 1u);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
    EXPECT_NE(x, a) << "reused before its fence completed";
  }
  b.completed = b.fences;
  bool reused = false;
  for (int i = 0; i < 64 && !reused; ++i) {
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
    reused = x == a;
  }
  EXPECT_TRUE(reused);
  // Its two chunks were discarded by the fence, nothing else.
  ASSERT_EQ(b.discards.size(), 1u);
  EXPECT_EQ(b.discards[0].addr, a);
  EXPECT_EQ(b.discards[0].bytes, 4u << 20);
}

TEST(EngineSubAllocator, OnlyWholeDeadChunksAreDiscarded) {
  FenceBackend b;
  auto e = make_engine(b);
  // Two small blocks share a slab; while one lives, no discard may name the slab.
  auto [p, q] = two_small_blocks(*e);
  ASSERT_NE(p, 0u);
  ASSERT_EQ(p / kChunkBytes, q / kChunkBytes);
  bool ours = false;
  ASSERT_TRUE(e->release(p, std::nullopt, &ours).ok());
  e->reclaim(true);  // p's fence, recorded and completed while q lives
  ASSERT_GE(b.fences, 1u);
  for (int i = 0; i < 3; ++i) {  // more fences come and go while q lives
    std::uint64_t t = 0;
    ASSERT_TRUE(e->allocate(8 << 20, AllocKind::alloc, 0, &t).ok());
    ASSERT_TRUE(e->release(t, std::nullopt, &ours).ok());
    e->reclaim(true);
  }
  ASSERT_GE(b.discards.size(), 3u) << "the large blocks' chunks were discarded";
  for (const auto& d : b.discards) {
    EXPECT_TRUE(q + 4096 <= d.addr || d.addr + d.bytes <= q) << "discarded a range holding a live block";
    EXPECT_EQ(d.addr % kChunkBytes, 0u);
    EXPECT_EQ(d.bytes % kChunkBytes, 0u);
  }
  // The slab's last block: the slab is discarded by the fence after the one that frees it
  // (under demand, small frees are fenced in batches: reclaim(true) closes the batch).
  ASSERT_TRUE(e->release(q, std::nullopt, &ours).ok());
  const std::uint64_t slab = q / kChunkBytes * kChunkBytes;
  for (const auto& d : b.discards) EXPECT_NE(d.addr, slab) << "discarded before q's fence completed";
  e->reclaim(true);  // q's fence completes: the slab comes back empty and is fenced to be discarded
  bool slab_discarded = false;
  for (const auto& d : b.discards) slab_discarded = slab_discarded || (d.addr == slab && d.bytes == kChunkBytes);
  EXPECT_TRUE(slab_discarded);
}

TEST(EngineSubAllocator, FencesRefusedDuringACaptureKeepRangesParked) {
  FenceBackend b;
  auto e = make_engine(b);
  std::uint64_t a = 0, x = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &a).ok());
  b.refuse_fences = true;
  bool ours = false;
  ASSERT_TRUE(e->release(a, std::nullopt, &ours).ok());
  EXPECT_EQ(b.fences, 0u);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
    EXPECT_NE(x, a);
  }
  EXPECT_EQ(e->stats().backend_errors, 0u) << "not_ready is no error";
}

TEST(EngineSubAllocator, SecondFreeAndInteriorPointersAreOursAndRefused) {
  FenceBackend b;
  auto e = make_engine(b);
  auto [a, c] = two_small_blocks(*e);
  ASSERT_NE(a, 0u);
  bool ours = false;
  ASSERT_TRUE(e->release(a, std::nullopt, &ours).ok());
  Result again = e->release(a, std::nullopt, &ours);
  EXPECT_TRUE(ours) << "an address in our ranges never reaches the driver's free";
  EXPECT_EQ(again.status, Status::invalid_value);
  Result interior = e->release(c + 512, std::nullopt, &ours);
  EXPECT_TRUE(ours);
  EXPECT_EQ(interior.status, Status::invalid_value);
  Result foreign = e->release(0x1000, std::nullopt, &ours);
  EXPECT_FALSE(ours);
  EXPECT_TRUE(foreign.ok());
}

TEST(EngineSubAllocator, CapCountsRangesAndWaitsForParkedOnesBeforeRefusing) {
  FenceBackend b;
  // Room for one range of 64 MiB + 2 MiB and no more.
  auto e = make_engine(b, (66ull << 20) + 4096);
  std::vector<std::uint64_t> blocks;
  for (int i = 0; i < 16; ++i) {
    std::uint64_t p = 0;
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &p).ok()) << i;
    blocks.push_back(p);
  }
  EXPECT_EQ(b.ranges, 1u);
  std::uint64_t p = 0;
  // Full (2 MiB spare): the 17th would need a second range.
  EXPECT_EQ(e->allocate(4 << 20, AllocKind::alloc, 0, &p).status, Status::out_of_memory);
  ASSERT_TRUE(e->allocate(2 << 20, AllocKind::alloc, 0, &p).ok()) << "the range's spare chunk";
  bool ours = false;
  ASSERT_TRUE(e->release(blocks[3], std::nullopt, &ours).ok());
  // Its fence is pending: the allocation waits for it (only here, short of room) and reuses it.
  const std::uint64_t waits = b.waits;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &p).ok());
  EXPECT_EQ(p, blocks[3]);
  EXPECT_GT(b.waits, waits);
  EXPECT_EQ(b.ranges, 1u);
  EXPECT_EQ(e->stats().allocations_refused, 1u);
}

TEST(EngineSubAllocator, ADriverShortOfRoomForARangeStillGivesTheRequestItsOwn) {
  FenceBackend b;
  b.largest_allocation = 16ull << 20;  // no 64 MiB range
  auto e = make_engine(b);
  std::uint64_t p = 0;
  ASSERT_TRUE(e->allocate(4096, AllocKind::alloc, 0, &p).ok()) << "a range of the request's size (a chunk and a spare)";
  EXPECT_EQ(b.ranges, 1u);
  Result big = e->allocate(32ull << 20, AllocKind::alloc, 0, &p);
  EXPECT_EQ(big.status, Status::out_of_memory) << "the driver's own answer";
  EXPECT_EQ(big.native, 2);
  EXPECT_EQ(e->stats().managed_bytes, e->stats().suballocator_range_bytes) << "nothing reserved for the refused range";
}

// An allocation at the managed cap waits for the fences of parked ranges, but work that
// never ends (a persistent kernel) must not hold it for ever: the wait is bounded, and the
// allocation is refused with out-of-memory.
TEST(EngineSubAllocator, AnAllocationAtTheCapWaitsBoundedBehindWorkThatNeverEnds) {
  FenceBackend b;
  auto e = make_engine(b, 80ull << 20);  // one range of 64 MiB + 2 MiB, and no second
  std::uint64_t a = 0, p = 0;
  ASSERT_TRUE(e->allocate(48 << 20, AllocKind::alloc, 0, &a).ok());
  bool ours = false;
  ASSERT_TRUE(e->release(a, std::nullopt, &ours).ok());
  b.stuck = true;
  Result r = e->allocate(48 << 20, AllocKind::alloc, 0, &p);
  EXPECT_EQ(b.unbounded_waits, 0u) << "waited without bound for a fence that never completes";
  EXPECT_EQ(r.status, Status::out_of_memory);
  EXPECT_GT(b.bounded_wait.count(), 0);
  EXPECT_EQ(e->stats().allocations_refused, 1u);
  b.stuck = false;
  b.completed = b.fences;
  ASSERT_TRUE(e->allocate(48 << 20, AllocKind::alloc, 0, &p).ok()) << "once the work ends, the range comes back";
  EXPECT_EQ(p, a);
}

// A range that work captured by a capture in progress uses stays parked however many fences
// complete; the others come back.
TEST(EngineSubAllocator, ARangeACaptureUsesStaysParkedAndTheOthersComeBack) {
  FenceBackend b;
  auto e = make_engine(b);
  std::uint64_t x = 0, y = 0, p = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &y).ok());
  b.captured_addr = x;
  bool ours = false;
  ASSERT_TRUE(e->release(x, std::nullopt, &ours).ok());
  ASSERT_TRUE(e->release(y, std::nullopt, &ours).ok());
  bool x_back = false, y_back = false;
  std::vector<std::uint64_t> held;
  for (int round = 0; round < 4; ++round) {
    e->reclaim(true);  // fences recorded and completed
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &p).ok());
      x_back = x_back || p == x;
      y_back = y_back || p == y;
      held.push_back(p);
    }
    for (std::uint64_t h : held) ASSERT_TRUE(e->release(h, std::nullopt, &ours).ok());
    held.clear();
  }
  EXPECT_FALSE(x_back) << "reused while captured work may use it";
  EXPECT_TRUE(y_back);
  b.captured_addr = 0;  // the capture ended
  e->reclaim(true);
  e->reclaim(true);
  for (int i = 0; i < 40 && !x_back; ++i) {
    ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &p).ok());
    x_back = p == x;
  }
  EXPECT_TRUE(x_back);
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

bool discarded(const FenceBackend& b, std::uint64_t addr) {
  for (const auto& d : b.discards)
    if (d.addr == addr) return true;
  return false;
}

// Blocks are carved only from ranges made in their own context, and a context's end takes
// exactly its blocks and ranges: the other context's blocks stay, the cap and the report
// count the ended context's no more, and its addresses are no longer the Engine's.
TEST(EngineSubAllocatorContexts, AContextsEndTakesExactlyItsBlocksAndRanges) {
  FenceBackend b;
  auto e = make_engine(b);
  std::uint64_t x = 0, y = 0, z = 0;
  b.context = 1;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &x).ok());
  b.context = 2;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &y).ok());
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &z).ok());
  EXPECT_EQ(b.ranges, 2u) << "the second context's blocks came from the first one's range";
  EXPECT_NE(e->find(x)->context, e->find(y)->context);
  const std::uint64_t managed_before = e->managed_bytes();
  e->finish_context_end(2, true);
  EXPECT_TRUE(e->find(x).has_value()) << "the other context's block went too";
  EXPECT_FALSE(e->find(y).has_value());
  EXPECT_FALSE(e->find(z).has_value());
  EXPECT_EQ(e->live_blocks(), 1u);
  Stats s = e->stats();
  EXPECT_EQ(s.suballocator_ranges, 1u);
  EXPECT_EQ(s.frees, 2u) << "each ended block is a free";
  EXPECT_LT(e->managed_bytes(), managed_before - (60ull << 20)) << "the ended range is still counted under the cap";
  EXPECT_FALSE(e->in_suballocator_range(y));
  bool ours = true;
  e->release(y, std::nullopt, &ours);
  EXPECT_FALSE(ours) << "an ended context's address is the driver's to answer";
  // A context made later (the same handle again) gets a range of its own.
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &y).ok());
  EXPECT_EQ(b.ranges, 3u);
  b.context = 1;
  std::uint64_t w = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &w).ok());
  EXPECT_EQ(b.ranges, 3u) << "the first context still carves from its own range";
}

// While a context is ending, the fences over its freed ranges are waited for and no discard
// names its ranges (the driver may hand their addresses out again once it frees them); if it
// does not end after all, its frees are discarded again.
TEST(EngineSubAllocatorContexts, AnEndingContextsRangesAreFencedAndNeverDiscardedAfter) {
  FenceBackend b;
  auto e = make_engine(b);
  b.context = 7;
  std::uint64_t a = 0, c = 0, d = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &a).ok());
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &c).ok());
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &d).ok());
  bool ours = false;
  ASSERT_TRUE(e->release(a, std::nullopt, &ours).ok());
  // Another context's first allocation finds no room of its own: it records the fence that
  // holds `a` (not complete).
  b.context = 8;
  std::uint64_t other = 0;
  ASSERT_TRUE(e->allocate(4 << 20, AllocKind::alloc, 0, &other).ok());
  ASSERT_EQ(b.fences, 1u);
  ASSERT_EQ(b.completed, 0u);
  const std::uint64_t waits = b.waits;
  e->begin_context_end(7);
  EXPECT_GT(b.waits, waits) << "the fence over the ending context's freed range was not waited for";
  ASSERT_TRUE(e->release(c, std::nullopt, &ours).ok());
  e->reclaim(true);
  EXPECT_FALSE(discarded(b, c)) << "a discard was queued for a range whose context is ending";
  e->finish_context_end(7, false);  // (it did not end)
  EXPECT_TRUE(e->find(d).has_value());
  ASSERT_TRUE(e->release(d, std::nullopt, &ours).ok());
  e->reclaim(true);
  EXPECT_TRUE(discarded(b, d)) << "a context that did not end lost its discards";
}

// Blocks carved on adjacent chunks of one range (one managed allocation) move in one call,
// as the driver pipelines a call across its VA blocks; blocks that are adjacent in address but
// in two ranges (two allocations: a call may not span them) move in one call each.
TEST(EngineSubAllocator, AdjacentBlocksOfOneRangeMoveInOneCallAndNeverAcrossRanges) {
  FenceBackend b;
  auto e = make_engine(b, 1ull << 40, std::make_unique<FootprintOnly>());
  // A block of 22 MiB takes a range of 64 MiB + 2 MiB (FencedSubAllocator): three fill it, the
  // fourth opens the next range, which the backend places right after the first.
  constexpr std::uint64_t kBlock = 22ull << 20;
  std::uint64_t x[4] = {};
  for (std::uint64_t& p : x) ASSERT_TRUE(e->allocate(kBlock, AllocKind::alloc, 0, &p).ok());
  ASSERT_EQ(b.ranges, 2u);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(x[i + 1], x[i] + kBlock) << "placed one after the other";
  auto launch = [&, seq = std::uint64_t{0}](std::vector<Access> accesses) mutable {
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = accesses;
    e->launch(l);
  };
  // x[2] and x[3] lie on adjacent chunks, but in two ranges: their run is cut between them.
  launch({{x[2], kBlock, false}, {x[3], kBlock, false}});
  ASSERT_EQ(b.prefetches.size(), 2u);
  EXPECT_EQ(b.prefetches[0].addr, x[2]);
  EXPECT_EQ(b.prefetches[0].bytes, kBlock);
  EXPECT_EQ(b.prefetches[1].addr, x[3]);
  EXPECT_EQ(b.prefetches[1].bytes, kBlock);
  b.prefetches.clear();
  launch({{x[0], kBlock, false}, {x[1], kBlock, false}});
  ASSERT_EQ(b.prefetches.size(), 1u) << "two blocks of one range: one call";
  EXPECT_EQ(b.prefetches[0].addr, x[0]);
  EXPECT_EQ(b.prefetches[0].bytes, 2 * kBlock);
  EXPECT_EQ(b.prefetches[0].to, Location::gpu);
}

// A launch's fetches go to the Backend together, in batches of at most Engine::kMaxFetchBatch
// ranges (cuMemPrefetchBatchAsync in the shim), after its evictions, each of which is a call
// of its own (batched, they ran slower on the measured GPU).
TEST(EngineSubAllocator, ALaunchsFetchesGoInOneBatchAfterItsEvictions) {
  FenceBackend b;
  auto e = make_engine(b, 1ull << 40, std::make_unique<FootprintOnly>(), 1ull << 30);
  // 40 MiB blocks: one to a 64 MiB range, so no two share a call.
  constexpr std::uint64_t kBlock = 40ull << 20;
  std::vector<std::uint64_t> x(40);
  for (std::uint64_t& p : x) ASSERT_TRUE(e->allocate(kBlock, AllocKind::alloc, 0, &p).ok());
  ASSERT_EQ(b.ranges, 40u);
  auto launch = [&, seq = std::uint64_t{0}](std::size_t first, std::size_t n) mutable {
    std::vector<Access> accesses;
    for (std::size_t i = first; i < first + n; ++i) accesses.push_back({x[i], kBlock, false});
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = accesses;
    e->launch(l);
  };
  launch(0, 20);  // 800 MiB of a 1 GiB budget: fetches only
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].to, Location::gpu);
  EXPECT_EQ(b.calls[0].batch, 20u);
  ASSERT_EQ(b.prefetches.size(), 20u);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_EQ(b.prefetches[i].addr, x[i]) << "in plan order";
  b.calls.clear();
  launch(20, 20);  // room for 20 more means evictions first
  std::size_t evictions = 0, fetched = 0, batches = 0;
  bool fetching = false;
  for (const auto& c : b.calls) {
    if (c.to == Location::cpu) {
      EXPECT_FALSE(fetching) << "every eviction before the fetches";
      EXPECT_EQ(c.batch, 0u) << "evictions are not batched";
      ++evictions;
    } else {
      fetching = true;
      EXPECT_LE(c.batch, Engine::kMaxFetchBatch);
      fetched += c.batch == 0 ? 1 : c.batch;
      batches += c.batch != 0;
    }
  }
  EXPECT_GT(evictions, 0u);
  EXPECT_EQ(fetched, 20u);
  EXPECT_EQ(batches, 1u);
  const Stats s = e->stats();
  EXPECT_EQ(s.h2d_batches, 2u);
  EXPECT_EQ(s.h2d_batched_ranges, 40u);
  EXPECT_EQ(s.h2d_calls.calls(), 40u) << "a batch's ranges count as calls";
}

// Allocates x.size() blocks of `bytes` (40 MiB: one to a 64 MiB range, so no two share a
// move call) into `x`, then one launch using them all, in that order.
bool allocate_and_launch_all(Engine& e, std::uint64_t bytes, std::vector<std::uint64_t>& x) {
  std::vector<Access> accesses;
  for (std::uint64_t& p : x) {
    if (!e.allocate(bytes, AllocKind::alloc, 0, &p).ok()) return false;
    accesses.push_back({p, bytes, false});
  }
  Launch l;
  l.name = "k";
  l.accesses = accesses;
  e.launch(l);
  return true;
}

// A batch the Backend refuses as a whole: its ranges go one by one, in order, and the refusal
// counts as one refused call.
TEST(EngineSubAllocator, ARefusedBatchsRangesGoOneByOne) {
  FenceBackend b;
  b.refuse_batches = true;
  auto e = make_engine(b, 1ull << 40, std::make_unique<FootprintOnly>());
  constexpr std::uint64_t kBlock = 40ull << 20;
  std::vector<std::uint64_t> x(3);
  ASSERT_TRUE(allocate_and_launch_all(*e, kBlock, x));
  ASSERT_EQ(b.calls.size(), 4u);
  EXPECT_EQ(b.calls[0].batch, ~std::size_t{0}) << "the refused batch";
  ASSERT_EQ(b.prefetches.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(b.calls[i + 1].batch, 0u);
    EXPECT_EQ(b.prefetches[i].addr, x[i]);
  }
  const Stats s = e->stats();
  EXPECT_EQ(s.backend_errors, 1u);
  EXPECT_EQ(s.h2d_batches, 0u);
  EXPECT_EQ(s.h2d_calls.calls(), 3u);
  EXPECT_EQ(s.prefetch_to_gpu_bytes, 3 * kBlock);
}

TEST(EngineSubAllocator, MoreFetchesThanABatchHoldsGoInFullBatchesThenTheRest) {
  FenceBackend b;
  auto e = make_engine(b, 1ull << 40, std::make_unique<FootprintOnly>());
  constexpr std::uint64_t kBlock = 40ull << 20;
  std::vector<std::uint64_t> x(Engine::kMaxFetchBatch + 8);
  ASSERT_TRUE(allocate_and_launch_all(*e, kBlock, x));
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[0].batch, Engine::kMaxFetchBatch);
  EXPECT_EQ(b.calls[1].batch, 8u);
  EXPECT_EQ(b.prefetches.size(), x.size());
}

// A full batch flushed in the middle of a walk over adjacent blocks, while another thread
// frees the block the walk checked just before the flush: that block's range must not reach
// the Backend after its free (release_gate.h, rule 2: the section that covered the check is
// kept until the range is issued). Blocks in shared ranges but no shared allocation: one run
// over all of them, one call per block (move_pieces).
class FreeDuringBatchBackend final : public test_support::InstantBackend {
 public:
  bool blocks_share_ranges() override { return true; }
  bool can_batch_prefetches() override { return true; }
  Result free_managed(std::uint64_t addr) override {
    std::lock_guard l(mutex);
    freed.insert(addr);
    free_done = true;
    return {};
  }
  Result prefetch(std::uint64_t addr, std::uint64_t, Location, int) override {
    wait_for_free();
    check(&addr, 1);
    return {};
  }
  Result prefetch_batch(const std::uint64_t* addrs, const std::uint64_t*, std::size_t count, Location, int) override {
    if (++batches == 1) {  // the first full batch: the free of the block found before it starts
      freer = std::thread([this] {
        bool ours = false;
        engine->release(victim, std::nullopt, &ours);
      });
      while (engine->owns_base(victim)) std::this_thread::yield();  // out of the table
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // flipped, waiting for sections
    } else {
      wait_for_free();
    }
    check(addrs, count);
    return {};
  }
  void wait_for_free() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (!free_done && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void check(const std::uint64_t* addrs, std::size_t count) {
    std::lock_guard l(mutex);
    for (std::size_t i = 0; i < count; ++i) {
      if (freed.count(addrs[i]) != 0) issued_after_free.push_back(addrs[i]);
    }
  }
  Engine* engine = nullptr;
  std::uint64_t victim = 0;
  std::thread freer;
  std::mutex mutex;
  std::set<std::uint64_t> freed;
  std::atomic<bool> free_done{false};
  int batches = 0;
  std::vector<std::uint64_t> issued_after_free;
};

TEST(EngineSubAllocator, AFullBatchInTheMiddleOfAWalkKeepsItsSectionAgainstAFree) {
  FreeDuringBatchBackend b;
  Config c;
  c.budget = SizeSetting{1ull << 30, 0.0, false};
  Engine e(c, b, std::make_unique<FootprintOnly>());
  b.engine = &e;
  std::vector<std::uint64_t> x(40);
  std::vector<Access> accesses;
  for (std::uint64_t& p : x) {
    ASSERT_TRUE(e.allocate(kChunkBytes, AllocKind::alloc, 0, &p).ok());
    accesses.push_back({p, kChunkBytes, false});
  }
  ASSERT_FALSE(e.suballocating());
  for (std::size_t i = 1; i < x.size(); ++i) ASSERT_EQ(x[i], x[i - 1] + kChunkBytes) << "adjacent: one run";
  b.victim = x[Engine::kMaxFetchBatch];  // checked by the walk before the 32nd call fills the batch
  Launch l;
  l.name = "k";
  l.accesses = accesses;
  e.launch(l);
  if (b.freer.joinable()) b.freer.join();
  EXPECT_TRUE(b.free_done);
  EXPECT_TRUE(b.issued_after_free.empty()) << "a range prefetched after its block's free";
}

}  // namespace
}  // namespace spillway
