// Engine::launch: the residency plan per 2 MiB chunk, budget-driven eviction,
// the order and coalescing of the Backend calls, and the Policy hooks — with a Backend that
// only records what it is asked.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "policies.h"
#include "instant_backend.h"
#include "spillway/engine.h"
#include "policy_registry.h"

namespace spillway {
namespace {

struct Call {
  std::uint64_t addr, bytes;
  Location to;
};

// Records the prefetches the Engine hands to its Backend; everything else succeeds at once.
class RecordingBackend final : public test_support::InstantBackend {
 public:
  explicit RecordingBackend(std::uint64_t gpu_bytes) : InstantBackend(gpu_bytes) {}
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int) override {
    calls.push_back({addr, bytes, to});
    return {};
  }
  std::vector<Call> calls;
};

// Manages residency, prefetches nothing itself, records residency notifications.
class PlanOnly final : public Policy {
 public:
  std::string_view name() const override { return "plan-only"; }
  bool manages_residency() const override { return true; }
  void on_residency(ChunkIndex c, bool r) override { events.push_back((r ? "+" : "-") + std::to_string(c)); }
  std::vector<std::string> events;
};

struct Fixture {
  explicit Fixture(std::uint64_t budget_chunks, std::unique_ptr<Policy> p = std::make_unique<PlanOnly>())
      : backend(budget_chunks * kChunkBytes), policy(p.get()), engine(Config{}, backend, std::move(p)) {}
  std::uint64_t alloc(std::uint64_t bytes) {
    std::uint64_t a = 0;
    EXPECT_TRUE(engine.allocate(bytes, AllocKind::alloc, 0, &a).ok());
    return a;
  }
  void launch(std::vector<Access> acc) {
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = acc;
    engine.launch(l);
  }
  RecordingBackend backend;
  Policy* policy;
  Engine engine;
  std::uint64_t seq = 0;
};

TEST(EngineLaunch, FetchesTheFootprintAsOneCoalescedCall) {
  Fixture f(8);
  std::uint64_t a = f.alloc(5 * kChunkBytes);
  f.launch({{a, 5 * kChunkBytes, false}});
  ASSERT_EQ(f.backend.calls.size(), 1u);
  EXPECT_EQ(f.backend.calls[0].addr, a);
  EXPECT_EQ(f.backend.calls[0].bytes, 5 * kChunkBytes);
  EXPECT_EQ(f.backend.calls[0].to, Location::gpu);
  EXPECT_EQ(f.engine.planned_resident_chunks(), 5u);
  f.launch({{a, 5 * kChunkBytes, false}});  // resident: nothing to move
  EXPECT_EQ(f.backend.calls.size(), 1u);
  EXPECT_EQ(f.engine.stats().launches, 2u);
}

// Block `a` (4 chunks) resident on a 4-chunk budget, then a launch that needs block `b`
// (4 chunks): `a` must leave as one call and `b` arrive as one, whatever order the Policy
// gives its victims in.
void ExpectOneEvictionThenOneFetch(std::unique_ptr<Policy> policy) {
  Fixture f(4, std::move(policy));
  std::uint64_t a = f.alloc(4 * kChunkBytes), b = f.alloc(4 * kChunkBytes);
  f.launch({{a, 4 * kChunkBytes, false}});
  f.backend.calls.clear();
  f.launch({{b, 4 * kChunkBytes, false}});
  ASSERT_EQ(f.backend.calls.size(), 2u);
  EXPECT_EQ(f.backend.calls[0].addr, a);
  EXPECT_EQ(f.backend.calls[0].bytes, 4 * kChunkBytes);
  EXPECT_EQ(f.backend.calls[0].to, Location::cpu);
  EXPECT_EQ(f.backend.calls[1].addr, b);
  EXPECT_EQ(f.backend.calls[1].bytes, 4 * kChunkBytes);
  EXPECT_EQ(f.backend.calls[1].to, Location::gpu);
  EXPECT_EQ(f.engine.planned_resident_chunks(), 4u);
  EXPECT_FALSE(f.engine.planned_resident(chunk_of(a)));
  EXPECT_TRUE(f.engine.planned_resident(chunk_of(b)));
  Stats s = f.engine.stats();
  EXPECT_EQ(s.h2d_calls.calls(), 2u);
  EXPECT_EQ(s.h2d_calls.quantile(0.5), 4 * kChunkBytes);
  EXPECT_EQ(s.d2h_calls.calls(), 1u);
  EXPECT_EQ(s.d2h_calls.quantile(0.5), 4 * kChunkBytes);
}

// Making room one chunk at a time interleaves an eviction with each fetch; issued in that
// order, every call would move one chunk. Grouped by direction, a block that leaves and a
// block that arrives are one call each, and the chunk counts are those of the plan.
TEST(EngineLaunch, EvictionsAndFetchesFormOneRunEach) { ExpectOneEvictionThenOneFetch(std::make_unique<PlanOnly>()); }

// Victims taken highest chunk first (a furthest-use ranking breaks ties by the higher index)
// still leave as one call: a descending stretch of one block is one run.
class HighestFirst final : public Policy {
 public:
  std::string_view name() const override { return "highest-first"; }
  bool manages_residency() const override { return true; }
  bool choose_victim(const VictimQuery& q, ChunkIndex* victim) override {
    bool found = false;
    q.for_each_lru([&](ChunkIndex c) {
      if (!q.pinned(c) && (!found || c > *victim)) {
        *victim = c;
        found = true;
      }
      return true;
    });
    return found;
  }
};

TEST(EngineLaunch, VictimsTakenHighestFirstLeaveAsOneCall) {
  ExpectOneEvictionThenOneFetch(std::make_unique<HighestFirst>());
}

// One Engine plans one GPU: a launch from another device's context moves nothing and the
// Policy never sees it (a plan for the wrong GPU would pull the kernel's data away).
TEST(EngineLaunch, ALaunchOnAnotherDeviceIsLeftToTheDriver) {
  Fixture f(8);
  std::uint64_t a = f.alloc(2 * kChunkBytes);
  std::vector<Access> acc{{a, 2 * kChunkBytes, false}};
  Launch other;
  other.name = "k";
  other.accesses = acc;
  other.device = 1;  // the InstantBackend's current device is 0
  f.engine.launch(other);
  EXPECT_TRUE(f.backend.calls.empty());
  EXPECT_EQ(f.engine.planned_resident_chunks(), 0u);
  other.device = 0;
  other.seq = 1;
  f.engine.launch(other);
  ASSERT_EQ(f.backend.calls.size(), 1u) << "a launch on the Engine's own device is planned";
  Stats s = f.engine.stats();
  EXPECT_EQ(s.launches, 2u);
  EXPECT_EQ(s.launches_other_device, 1u);
}

// Device memory held outside managed memory shrinks the budget while it
// lives, on the Engine's own device only, and never below 0.
TEST(EngineLaunch, DeviceMemoryOutsideShrinksTheBudgetWhileItLives) {
  using Kind = Engine::DeviceMemory;
  Fixture f(8);
  f.engine.note_device_memory(Kind::allocation, 0x1000, kChunkBytes, 0);  // before start(): already not free
  EXPECT_EQ(f.engine.outside_device_bytes(), 0u);
  std::uint64_t a = f.alloc(kChunkBytes);  // starts the Engine (device 0)
  ASSERT_EQ(f.engine.device(), 0);
  const std::uint64_t budget = f.engine.budget_bytes();
  EXPECT_EQ(budget, 8 * kChunkBytes);
  EXPECT_EQ(f.engine.take_device_memory(Kind::allocation, 0x1000), 0u) << "noted before start: never counted";
  f.engine.note_device_memory(Kind::allocation, 0x2000, 3 * kChunkBytes, 0);
  f.engine.note_device_memory(Kind::vmm, 0x2000, kChunkBytes, 0);  // the same number, another kind
  f.engine.note_device_memory(Kind::allocation, 0x3000, 4 * kChunkBytes, 1);  // another GPU's
  EXPECT_EQ(f.engine.budget_bytes(), budget - 4 * kChunkBytes);
  f.engine.note_device_memory(Kind::allocation, 0x2000, 2 * kChunkBytes, 0);  // the key again: replaced
  EXPECT_EQ(f.engine.outside_device_bytes(), 3 * kChunkBytes);
  EXPECT_EQ(f.engine.take_device_memory(Kind::allocation, 0x2000), 2 * kChunkBytes);
  EXPECT_EQ(f.engine.take_device_memory(Kind::allocation, 0x2000), 0u);
  f.engine.note_device_memory(Kind::allocation, 0x2000, 2 * kChunkBytes, 0);  // the driver refused the free
  EXPECT_EQ(f.engine.outside_device_bytes(), 3 * kChunkBytes);
  f.engine.note_device_memory(Kind::vmm, 0x9000, 64 * kChunkBytes, 0);
  EXPECT_EQ(f.engine.budget_bytes(), 0u) << "never below 0";
  f.launch({{a, kChunkBytes, false}});
  EXPECT_EQ(f.engine.planned_resident_chunks(), 0u) << "no room: the kernel faults, as under demand paging";
  f.engine.take_device_memory(Kind::vmm, 0x9000);
  f.engine.take_device_memory(Kind::vmm, 0x2000);
  f.engine.take_device_memory(Kind::allocation, 0x2000);
  EXPECT_EQ(f.engine.budget_bytes(), budget);
  Stats s = f.engine.stats();
  EXPECT_EQ(s.outside_device_peak_bytes, 67 * kChunkBytes);
  EXPECT_EQ(s.start_budget_bytes, budget);
}

// Several GPUs: a Backend whose current device the test sets, each device
// with its own memory; it records the device each prefetch goes to.
class TwoDeviceBackend final : public test_support::InstantBackend {
 public:
  struct Move {
    std::uint64_t addr, bytes;
    Location to;
    int device;
  };
  TwoDeviceBackend(std::uint64_t gpu0_bytes, std::uint64_t gpu1_bytes) : gpu_{gpu0_bytes, gpu1_bytes} {}
  Result memory_info(std::uint64_t* free_bytes, std::uint64_t* total_bytes) override {
    *free_bytes = *total_bytes = gpu_[current];
    return {};
  }
  int current_device() override { return current; }
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int device) override {
    moves.push_back({addr, bytes, to, device});
    return {};
  }
  int current = 0;
  std::vector<Move> moves;

 private:
  std::uint64_t gpu_[2];
};

struct TwoDeviceFixture {
  TwoDeviceFixture(std::uint64_t chunks0, std::uint64_t chunks1)
      : backend(chunks0 * kChunkBytes, chunks1 * kChunkBytes),
        engine(Config{}, backend, [this] {
          auto p = std::make_unique<PlanOnly>();
          policies.push_back(p.get());
          return std::unique_ptr<Policy>(std::move(p));
        }) {}
  std::uint64_t alloc(int device, std::uint64_t bytes) {
    backend.current = device;
    std::uint64_t a = 0;
    EXPECT_TRUE(engine.allocate(bytes, AllocKind::alloc, 0, &a).ok());
    return a;
  }
  void launch(int device, std::vector<Access> acc) {
    backend.current = device;
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = acc;
    l.device = device;
    engine.launch(l);
  }
  // Bytes moved toward `to` on `device` (the host: any device).
  std::uint64_t moved(Location to, int device) const {
    std::uint64_t n = 0;
    for (const auto& m : backend.moves) n += m.to == to && (to == Location::cpu || m.device == device) ? m.bytes : 0;
    return n;
  }
  TwoDeviceBackend backend;
  std::vector<PlanOnly*> policies;  // the factory's instances, in the order it made them
  Engine engine;
  std::uint64_t seq = 0;
};

TEST(EngineDevices, EachDevicePlansItsOwnBudgetWithItsOwnPolicy) {
  TwoDeviceFixture f(4, 8);
  const std::uint64_t a = f.alloc(0, 6 * kChunkBytes), b = f.alloc(1, 6 * kChunkBytes);
  EXPECT_TRUE(f.engine.plans_device(0));
  EXPECT_TRUE(f.engine.plans_device(1));
  EXPECT_EQ(f.engine.budget_bytes(0), 4 * kChunkBytes);
  EXPECT_EQ(f.engine.budget_bytes(1), 8 * kChunkBytes);
  EXPECT_EQ(f.engine.budget_bytes(), 12 * kChunkBytes);
  f.launch(0, {{a, 3 * kChunkBytes, false}});
  f.launch(1, {{b, 6 * kChunkBytes, false}});
  EXPECT_EQ(f.moved(Location::gpu, 0), 3 * kChunkBytes);
  EXPECT_EQ(f.moved(Location::gpu, 1), 6 * kChunkBytes) << "device 1's budget holds all of b: nothing of device 0's counts";
  EXPECT_EQ(f.moved(Location::cpu, 0), 0u);
  f.launch(0, {{a + 3 * kChunkBytes, 3 * kChunkBytes, false}});
  EXPECT_EQ(f.engine.planned_resident_chunks(0), 4u) << "device 0 keeps within its own 4 chunks";
  EXPECT_EQ(f.engine.planned_resident_chunks(1), 6u);
  EXPECT_EQ(f.moved(Location::cpu, 0), 2 * kChunkBytes);
  ASSERT_EQ(f.policies.size(), 2u) << "one Policy instance per device";
  EXPECT_FALSE(f.policies[0]->events.empty());
  EXPECT_EQ(f.policies[1]->events.size(), 6u) << "device 1's Policy sees only device 1's residency";

  Stats s = f.engine.stats();
  ASSERT_EQ(s.devices.size(), 2u);
  EXPECT_EQ(s.devices[0].device, 0);
  EXPECT_EQ(s.devices[1].device, 1);
  EXPECT_EQ(s.devices[0].launches, 2u);
  EXPECT_EQ(s.devices[1].launches, 1u);
  EXPECT_EQ(s.devices[0].prefetch_to_gpu_bytes, 6 * kChunkBytes);
  EXPECT_EQ(s.devices[1].prefetch_to_gpu_bytes, 6 * kChunkBytes);
  EXPECT_EQ(s.devices[0].evict_to_cpu_bytes, 2 * kChunkBytes);
  EXPECT_EQ(s.devices[1].evict_to_cpu_bytes, 0u);
  EXPECT_EQ(s.devices[0].live_block_bytes, 6 * kChunkBytes);
  EXPECT_EQ(s.devices[1].live_block_bytes, 6 * kChunkBytes);
  EXPECT_EQ(s.devices[0].resident_chunks, 4u);
  EXPECT_EQ(s.prefetch_to_gpu_bytes, 12 * kChunkBytes) << "the totals are the sums";
  EXPECT_EQ(s.launches_other_device, 0u);
}

TEST(EngineDevices, ABlockUsedFromAnotherDeviceMovesThereAndLeavesTheFirstPlan) {
  TwoDeviceFixture f(8, 8);
  const std::uint64_t a = f.alloc(0, 2 * kChunkBytes);
  f.launch(0, {{a, 2 * kChunkBytes, false}});
  EXPECT_TRUE(f.engine.planned_resident_on(chunk_of(a), 0));
  f.launch(1, {{a, 2 * kChunkBytes, false}});  // device 1 opens its plan now
  EXPECT_EQ(f.moved(Location::gpu, 1), 2 * kChunkBytes) << "fetched to the launching device";
  EXPECT_FALSE(f.engine.planned_resident_on(chunk_of(a), 0)) << "a chunk is planned on one device at most";
  EXPECT_TRUE(f.engine.planned_resident_on(chunk_of(a), 1));
  EXPECT_EQ(f.engine.planned_resident_chunks(), 2u);
  f.launch(0, {{a, kChunkBytes, false}});
  EXPECT_TRUE(f.engine.planned_resident_on(chunk_of(a), 0));
  EXPECT_FALSE(f.engine.planned_resident_on(chunk_of(a), 1));
  EXPECT_EQ(f.moved(Location::gpu, 0), 3 * kChunkBytes);
  // A free takes the block's chunks out of every plan.
  bool ours = false;
  ASSERT_TRUE(f.engine.release(a, std::nullopt, &ours).ok());
  EXPECT_EQ(f.engine.planned_resident_chunks(), 0u);
  Stats s = f.engine.stats();
  EXPECT_EQ(s.devices[0].live_block_bytes, 0u);
}

TEST(EngineDevices, AChunkHeldByAnotherDevicesLaunchInFlightStaysInItsPlan) {
  TwoDeviceFixture f(8, 8);
  const std::uint64_t a = f.alloc(0, kChunkBytes);
  std::vector<Access> acc{{a, kChunkBytes, false}};
  Launch l;
  l.name = "k";
  l.accesses = acc;
  l.device = 0;
  {
    Engine::LaunchInFlight guard = f.engine.launch_in_flight(l);  // device 0's kernel not issued yet
    f.launch(1, {{a, kChunkBytes, false}});
    EXPECT_TRUE(f.engine.planned_resident_on(chunk_of(a), 0)) << "held: stays in device 0's plan";
    EXPECT_TRUE(f.engine.planned_resident_on(chunk_of(a), 1));
  }
  EXPECT_EQ(f.engine.planned_resident_chunks(), 2u) << "both plans count it, until one of them evicts it";
  EXPECT_EQ(f.moved(Location::gpu, 1), kChunkBytes) << "device 1's kernel got its data";
}

TEST(EngineDevices, OutsideMemoryShrinksOnlyItsOwnDevicesBudget) {
  using Kind = Engine::DeviceMemory;
  TwoDeviceFixture f(8, 8);
  f.alloc(0, kChunkBytes);
  f.engine.note_device_memory(Kind::allocation, 0x1000, 2 * kChunkBytes, 1);  // no plan on device 1 yet
  EXPECT_EQ(f.engine.outside_device_bytes(), 0u);
  f.alloc(1, kChunkBytes);
  f.engine.note_device_memory(Kind::allocation, 0x2000, 3 * kChunkBytes, 1);
  EXPECT_EQ(f.engine.budget_bytes(0), 8 * kChunkBytes);
  EXPECT_EQ(f.engine.budget_bytes(1), 5 * kChunkBytes);
  int device = -1;
  EXPECT_EQ(f.engine.take_device_memory(Kind::allocation, 0x2000, &device), 3 * kChunkBytes);
  EXPECT_EQ(device, 1);
  EXPECT_EQ(f.engine.budget_bytes(1), 8 * kChunkBytes);
  f.engine.note_device_memory(Kind::allocation, 0x2000, 3 * kChunkBytes, device);
  Stats s = f.engine.stats();
  EXPECT_EQ(s.devices[1].outside_device_bytes, 3 * kChunkBytes);
  EXPECT_EQ(s.devices[0].outside_device_bytes, 0u);
}

TEST(EngineDevices, ALaunchOnADeviceThatIsNotCurrentOpensNoPlan) {
  TwoDeviceFixture f(8, 8);
  const std::uint64_t a = f.alloc(0, kChunkBytes);
  std::vector<Access> acc{{a, kChunkBytes, false}};
  Launch l;
  l.name = "k";
  l.accesses = acc;
  l.device = 1;  // but device 0 is current: device 1's facts cannot be read
  f.engine.launch(l);
  EXPECT_FALSE(f.engine.plans_device(1));
  EXPECT_TRUE(f.backend.moves.empty());
  EXPECT_EQ(f.engine.stats().launches_other_device, 1u);
}

TEST(EngineLaunch, RunsAreSplitAtBlockBoundariesAndClippedToBlocks) {
  Fixture f(8);
  std::uint64_t a = f.alloc(kChunkBytes + 100);  // 2 chunks, the second mostly empty
  std::uint64_t b = f.alloc(kChunkBytes);
  ASSERT_EQ(b, a + 2 * kChunkBytes);
  f.launch({{a, kChunkBytes + 100, false}, {b, kChunkBytes, true}});
  ASSERT_EQ(f.backend.calls.size(), 2u);
  EXPECT_EQ(f.backend.calls[0].addr, a);
  EXPECT_EQ(f.backend.calls[0].bytes, kChunkBytes + 100);
  EXPECT_EQ(f.backend.calls[1].addr, b);
  EXPECT_EQ(f.backend.calls[1].bytes, kChunkBytes);
}

TEST(EngineLaunch, EvictsLeastRecentlyUsedWithinTheBudgetBeforeFetching) {
  Fixture f(2);
  std::uint64_t a = f.alloc(kChunkBytes), b = f.alloc(kChunkBytes), c = f.alloc(kChunkBytes);
  f.launch({{a, kChunkBytes, false}});
  f.launch({{b, kChunkBytes, false}});
  f.launch({{a, kChunkBytes, false}});  // a is now more recent than b
  f.backend.calls.clear();
  f.launch({{c, kChunkBytes, false}});
  ASSERT_EQ(f.backend.calls.size(), 2u);
  EXPECT_EQ(f.backend.calls[0].addr, b);  // out first ...
  EXPECT_EQ(f.backend.calls[0].to, Location::cpu);
  EXPECT_EQ(f.backend.calls[1].addr, c);  // ... then in
  EXPECT_EQ(f.backend.calls[1].to, Location::gpu);
  EXPECT_TRUE(f.engine.planned_resident(chunk_of(a)));
  EXPECT_FALSE(f.engine.planned_resident(chunk_of(b)));
  EXPECT_EQ(f.engine.planned_resident_chunks(), 2u);
  EXPECT_EQ(f.engine.stats().evicted_chunks, 1u);
}

TEST(EngineLaunch, NeverEvictsTheLaunchsOwnFootprint) {
  Fixture f(2);
  std::uint64_t a = f.alloc(3 * kChunkBytes);
  f.launch({{a, 3 * kChunkBytes, false}});  // 3 chunks, room for 2: the third is left to fault
  EXPECT_EQ(f.engine.planned_resident_chunks(), 2u);
  EXPECT_EQ(f.engine.stats().dropped_prefetch_chunks, 1u);
  for (const Call& c : f.backend.calls) EXPECT_EQ(c.to, Location::gpu);
}

// Two threads: one has planned its launch (a, b) but not issued the kernel yet while the
// other plans launches that need room. The first launch's chunks stay pinned until its
// guard ends, although they are the least recently used: the others evict around them.
TEST(EngineLaunch, ALaunchInFlightKeepsItsChunksUntilItsKernelIsIssued) {
  Fixture f(3);
  std::uint64_t a = f.alloc(kChunkBytes), b = f.alloc(kChunkBytes), c = f.alloc(kChunkBytes);
  std::uint64_t d = f.alloc(kChunkBytes), e = f.alloc(kChunkBytes);
  f.launch({{c, kChunkBytes, false}});
  Launch first;
  first.seq = f.seq++;
  first.name = "k";
  std::vector<Access> ab{{a, kChunkBytes, false}, {b, kChunkBytes, false}};
  first.accesses = ab;
  {
    Engine::LaunchInFlight guard = f.engine.launch_in_flight(first);
    f.launch({{d, kChunkBytes, false}});  // evicts c, the only chunk not in flight
    EXPECT_FALSE(f.engine.planned_resident(chunk_of(c)));
    f.launch({{e, kChunkBytes, false}});  // evicts d (its launch's pins ended), not a or b
    EXPECT_FALSE(f.engine.planned_resident(chunk_of(d)));
    EXPECT_TRUE(f.engine.planned_resident(chunk_of(a)));
    EXPECT_TRUE(f.engine.planned_resident(chunk_of(b)));
    EXPECT_TRUE(f.engine.planned_resident(chunk_of(e)));
  }
  f.launch({{c, kChunkBytes, false}});  // issued: a, the least recently used, goes now
  EXPECT_FALSE(f.engine.planned_resident(chunk_of(a)));
  EXPECT_TRUE(f.engine.planned_resident(chunk_of(b)));
  EXPECT_EQ(f.engine.stats().evicted_chunks, 3u);
}

// A chunk held by two launches in flight stays pinned until both kernels are issued: the
// later launch's guard ending first must not unpin it for the earlier one.
TEST(EngineLaunch, AChunkHeldByTwoLaunchesInFlightStaysUntilBothAreIssued) {
  Fixture f(3);
  std::uint64_t a = f.alloc(kChunkBytes), b = f.alloc(kChunkBytes), c = f.alloc(kChunkBytes);
  std::uint64_t d = f.alloc(kChunkBytes);
  auto in_flight = [&](std::vector<Access>& acc) {
    Launch l;
    l.seq = f.seq++;
    l.name = "k";
    l.accesses = acc;
    return f.engine.launch_in_flight(l);
  };
  std::vector<Access> first_acc{{a, kChunkBytes, false}};
  std::vector<Access> second_acc{{a, kChunkBytes, false}, {b, kChunkBytes, false}};
  Engine::LaunchInFlight first = in_flight(first_acc);
  { Engine::LaunchInFlight second = in_flight(second_acc); }  // issued at once
  f.launch({{c, kChunkBytes, false}});
  f.launch({{d, kChunkBytes, false}});  // room for d: b goes, not a (the first still needs it)
  EXPECT_TRUE(f.engine.planned_resident(chunk_of(a)));
  EXPECT_FALSE(f.engine.planned_resident(chunk_of(b)));
}

// Two threads' plans are carried out in the order they were made. Thread A's first Backend
// call stalls until thread B has started its launch, and then 50 ms more: B, planned after
// A against the residency A's plan leaves, must not move anything before A's moves are
// done (else B's eviction could overtake a fetch A counted on, or the reverse).
TEST(EngineLaunch, PlansAreCarriedOutInTheOrderTheyWereMade) {
  struct StallingBackend final : test_support::InstantBackend {
    StallingBackend() : InstantBackend(2 * kChunkBytes) {}
    Result prefetch(std::uint64_t addr, std::uint64_t, Location, int) override {
      if (calls.fetch_add(1) == 0) {
        for (int i = 0; i < 2000 && !second_launch_seen.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::lock_guard lock(mutex);
      order.push_back(addr);
      return {};
    }
    std::atomic<int> calls{0};
    std::atomic<bool> second_launch_seen{false};
    std::mutex mutex;
    std::vector<std::uint64_t> order;
  };
  struct Signalling final : Policy {
    explicit Signalling(StallingBackend& b) : backend(b) {}
    std::string_view name() const override { return "signalling"; }
    bool manages_residency() const override { return true; }
    void on_launch(const Launch&, Actions&) override {
      if (++launches == 2) backend.second_launch_seen = true;
    }
    StallingBackend& backend;
    int launches = 0;  // under the Engine's lock
  };
  StallingBackend backend;
  Engine engine(Config{}, backend, std::make_unique<Signalling>(backend));
  std::uint64_t a = 0, b = 0;
  ASSERT_TRUE(engine.allocate(kChunkBytes, AllocKind::alloc, 0, &a).ok());
  ASSERT_TRUE(engine.allocate(kChunkBytes, AllocKind::alloc, 0, &b).ok());
  auto launch = [&](std::uint64_t addr, std::uint64_t seq) {
    Launch l;
    l.seq = seq;
    l.name = "k";
    std::vector<Access> acc{{addr, kChunkBytes, false}};
    l.accesses = acc;
    engine.launch(l);
  };
  std::thread first([&] { launch(a, 0); });
  while (backend.calls.load() == 0) std::this_thread::yield();  // A has planned and is moving
  std::thread second([&] { launch(b, 1); });
  first.join();
  second.join();
  ASSERT_EQ(backend.order.size(), 2u);
  EXPECT_EQ(backend.order[0], a);
  EXPECT_EQ(backend.order[1], b);
}

TEST(EngineLaunch, FreeDropsTheBlocksChunksFromThePlan) {
  Fixture f(4);
  std::uint64_t a = f.alloc(2 * kChunkBytes);
  f.launch({{a, 2 * kChunkBytes, false}});
  bool ours = false;
  ASSERT_TRUE(f.engine.release(a, std::nullopt, &ours).ok());
  EXPECT_TRUE(ours);
  EXPECT_EQ(f.engine.planned_resident_chunks(), 0u);
  auto& ev = static_cast<PlanOnly*>(f.policy)->events;
  EXPECT_EQ(ev, (std::vector<std::string>{"+" + std::to_string(chunk_of(a)), "+" + std::to_string(chunk_of(a) + 1),
                                          "-" + std::to_string(chunk_of(a)), "-" + std::to_string(chunk_of(a) + 1)}));
}

// A Backend that knows which blocks the driver holds, records every prefetch of a range
// outside them, and can run "another thread" inside free_managed or inside a prefetch.
class LiveBlocksBackend final : public test_support::InstantBackend {
 public:
  explicit LiveBlocksBackend(std::uint64_t gpu_bytes) : InstantBackend(gpu_bytes) {}
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override {
    std::lock_guard lock(mutex);
    InstantBackend::allocate_managed(bytes, addr);
    live[*addr] = *addr + bytes;
    return {};
  }
  Result free_managed(std::uint64_t addr) override {
    {
      std::lock_guard lock(mutex);
      live.erase(addr);
    }
    run(in_free);
    return {};
  }
  Result prefetch(std::uint64_t addr, std::uint64_t bytes, Location to, int) override {
    check(addr, bytes, to);
    run(in_prefetch);
    return {};
  }
  Result advise(std::uint64_t addr, std::uint64_t bytes, Advice, Location where, int) override {
    check(addr, bytes, where);
    return {};
  }
  void check(std::uint64_t addr, std::uint64_t bytes, Location to) {
    std::lock_guard lock(mutex);
    bool inside = false;
    for (const auto& [base, end] : live) inside = inside || (base <= addr && addr + bytes <= end);
    if (!inside) dead.push_back({addr, bytes, to});
  }
  static void run(std::function<void()>& once) {
    if (!once) return;
    auto f = std::move(once);
    once = nullptr;
    f();
  }
  std::mutex mutex;                              // guards live and dead
  std::map<std::uint64_t, std::uint64_t> live;  // base -> end
  std::vector<Call> dead;
  std::function<void()> in_free, in_prefetch;
};

// A block may be freed while another thread plans or carries out a launch: between the
// block leaving the allocation table and its chunks leaving the plan, or between a plan and
// its moves. No move may reach the driver for the freed block's range (a refused call, or
// the pages of whatever the driver puts there next).
TEST(EngineLaunch, NoMoveReachesTheDriverForABlockFreedMeanwhile) {
  auto launch = [](Engine& engine, std::uint64_t& seq, std::vector<Access> acc) {
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = acc;
    engine.launch(l);
  };
  {  // planned while the free is under way: x is out of the table, still in the plan
    LiveBlocksBackend backend(2 * kChunkBytes);
    Engine engine(Config{}, backend, std::make_unique<PlanOnly>());
    std::uint64_t x = 0, y = 0, z = 0, seq = 0;
    for (std::uint64_t* b : {&x, &y, &z}) ASSERT_TRUE(engine.allocate(kChunkBytes, AllocKind::alloc, 0, b).ok());
    launch(engine, seq, {{x, kChunkBytes, false}});
    launch(engine, seq, {{y, kChunkBytes, false}});
    backend.in_free = [&] { launch(engine, seq, {{z, kChunkBytes, false}}); };  // evicts x's chunk
    bool ours = false;
    ASSERT_TRUE(engine.release(x, std::nullopt, &ours).ok());
    EXPECT_EQ(seq, 3u);
    for (const Call& call : backend.dead) ADD_FAILURE() << "moved freed " << std::hex << call.addr << " +" << call.bytes;
  }
  {  // freed between the plan and its moves: y's eviction is planned, then y is freed
    LiveBlocksBackend backend(2 * kChunkBytes);
    Engine engine(Config{}, backend, std::make_unique<PlanOnly>());
    std::uint64_t x = 0, y = 0, z = 0, w = 0, seq = 0;
    for (std::uint64_t* b : {&x, &y, &z, &w}) ASSERT_TRUE(engine.allocate(kChunkBytes, AllocKind::alloc, 0, b).ok());
    launch(engine, seq, {{x, kChunkBytes, false}});
    launch(engine, seq, {{y, kChunkBytes, false}});
    // Another thread frees y while the first move is being issued; its free waits until no
    // move that may name y is being issued, and the moves issued after it skip y.
    std::atomic<bool> freed{false};
    std::thread releaser;
    backend.in_prefetch = [&] {
      releaser = std::thread([&] {
        bool ours = false;
        freed = engine.release(y, std::nullopt, &ours).ok() && ours;
      });
    };
    launch(engine, seq, {{z, kChunkBytes, false}, {w, kChunkBytes, false}});  // evicts x, then y
    releaser.join();
    EXPECT_TRUE(freed);
    for (const Call& call : backend.dead) ADD_FAILURE() << "moved freed " << std::hex << call.addr << " +" << call.bytes;
  }
}

// Threads allocating, launching and freeing at once. Whatever the
// interleaving — a table check passed just before another thread's free, a plan carried out
// after it — no prefetch or advice may reach the Backend for a range already freed.
// A free on the very thread that is issuing a move (a signal handler's, or an atexit
// handler's after exit() from one) must not wait for that move: the thread would wait for
// itself (found in review). Without the fix this test hangs.
TEST(EngineLaunch, AFreeInsideAMoveOnTheSameThreadDoesNotWaitForItself) {
  LiveBlocksBackend backend(2 * kChunkBytes);
  Engine engine(Config{}, backend, std::make_unique<PlanOnly>());
  std::uint64_t x = 0, y = 0, z = 0, w = 0, seq = 0;
  for (std::uint64_t* b : {&x, &y, &z, &w}) ASSERT_TRUE(engine.allocate(kChunkBytes, AllocKind::alloc, 0, b).ok());
  auto launch = [&](std::vector<Access> acc) {
    Launch l;
    l.seq = seq++;
    l.name = "k";
    l.accesses = acc;
    engine.launch(l);
  };
  launch({{x, kChunkBytes, false}});
  launch({{y, kChunkBytes, false}});
  bool freed = false;
  backend.in_prefetch = [&] {
    bool ours = false;
    freed = engine.release(y, std::nullopt, &ours).ok() && ours;
  };
  launch({{z, kChunkBytes, false}, {w, kChunkBytes, false}});  // evicts x, then y
  EXPECT_TRUE(freed);
  std::lock_guard lock(backend.mutex);
  EXPECT_TRUE(backend.dead.empty()) << "y's eviction, planned before its free, was still skipped";
}

TEST(EngineLaunch, NoMoveOrAdviceReachesTheBackendForAFreedRangeUnderThreads) {
  for (const char* policy : {"learned", "sequential", "advise"}) {
    LiveBlocksBackend backend(3 * kChunkBytes);
    Engine engine(Config{}, backend, make_policy(policy));
    std::uint64_t shared = 0;
    ASSERT_TRUE(engine.allocate(2 * kChunkBytes, AllocKind::alloc, 0, &shared).ok());
    std::atomic<std::uint64_t> seq{0};
    auto worker = [&](int t) {
      for (int i = 0; i < 1500; ++i) {
        std::uint64_t a = 0, b = 0;
        if (!engine.allocate(kChunkBytes, AllocKind::alloc, 0, &a).ok()) return;
        if (!engine.allocate(kChunkBytes / 2, AllocKind::alloc, 0, &b).ok()) return;
        std::vector<Access> acc{{a, kChunkBytes, false}, {b, kChunkBytes / 2, false},
                                {shared + (i % 2) * kChunkBytes, kChunkBytes, false}};
        Launch l;
        l.seq = seq.fetch_add(1);
        l.name = t % 2 ? "odd" : "even";
        l.exec_id = static_cast<std::uint64_t>(t * 7 + i % 5);
        l.accesses = acc;
        engine.launch(l);
        bool ours = false;
        engine.release(a, std::nullopt, &ours);
        l.seq = seq.fetch_add(1);
        l.accesses = std::span<const Access>(acc).subspan(1);
        engine.launch(l);
        engine.release(b, t % 2 ? std::optional<StreamHandle>(0x5000) : std::nullopt, &ours);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
    for (std::thread& t : threads) t.join();
    engine.reclaim(true);
    std::lock_guard lock(backend.mutex);
    EXPECT_TRUE(backend.dead.empty()) << policy << ": " << backend.dead.size() << " calls named a freed range, first "
                                      << std::hex << backend.dead.front().addr;
  }
}

TEST(EngineLaunch, DemandPolicyMovesNothing) {
  Fixture f(2, make_policy("demand"));
  std::uint64_t a = f.alloc(4 * kChunkBytes);
  f.launch({{a, 4 * kChunkBytes, false}});
  EXPECT_TRUE(f.backend.calls.empty());
  EXPECT_EQ(f.engine.planned_resident_chunks(), 0u);
}

TEST(EngineLaunch, PolicyPrefetchesOutsideLiveBlocksAreDropped) {
  class Wild final : public Policy {
   public:
    std::string_view name() const override { return "wild"; }
    bool manages_residency() const override { return true; }
    void on_launch(const Launch&, Actions& a) override { a.prefetch(0x1000, kChunkBytes, Location::gpu); }
  };
  Fixture f(4, std::make_unique<Wild>());
  std::uint64_t a = f.alloc(kChunkBytes);
  f.launch({{a, kChunkBytes, false}});
  ASSERT_EQ(f.backend.calls.size(), 1u);
  EXPECT_EQ(f.backend.calls[0].addr, a);
}

// The policy's prefetches and the evictions of what they brought go to the Backend in runs
// clipped to their blocks, whether or not the plan knew the block: a run one block covers
// wholly as one call, a block ending inside a chunk clipped at its end.
TEST(EngineLaunch, PolicyPrefetchRunsAndTheirEvictionsAreClippedToTheirBlocks) {
  class Ahead final : public Policy {
   public:
    std::string_view name() const override { return "ahead"; }
    bool manages_residency() const override { return true; }
    void on_launch(const Launch&, Actions& a) override {
      for (const Access& x : next) a.prefetch(x.addr, x.bytes, Location::gpu);
      next.clear();
    }
    std::vector<Access> next;
  };
  auto owned = std::make_unique<Ahead>();
  Ahead* policy = owned.get();
  Fixture f(4, std::move(owned));
  const std::uint64_t a = f.alloc(3 * kChunkBytes), b = f.alloc(kChunkBytes + kChunkBytes / 2);
  const std::uint64_t c = f.alloc(4 * kChunkBytes), k = f.alloc(kChunkBytes);
  auto inside = [](const Call& call, std::uint64_t base, std::uint64_t bytes) {
    return call.addr >= base && call.addr + call.bytes <= base + bytes;
  };
  // Bytes moved each way; every call inside one of the blocks.
  auto moved = [&](Location to) {
    std::uint64_t n = 0;
    for (const Call& call : f.backend.calls) {
      EXPECT_TRUE(inside(call, a, 3 * kChunkBytes) || inside(call, b, kChunkBytes + kChunkBytes / 2) ||
                  inside(call, c, 4 * kChunkBytes) || inside(call, k, kChunkBytes))
          << std::hex << call.addr << " +" << call.bytes;
      if (call.to == to) n += call.bytes;
    }
    return n;
  };
  policy->next = {{a, 3 * kChunkBytes, false}};
  f.launch({{k, kChunkBytes, false}});
  // k (the footprint), then a's three chunks as one call.
  ASSERT_EQ(f.backend.calls.size(), 2u);
  EXPECT_EQ(f.backend.calls[1].addr, a);
  EXPECT_EQ(f.backend.calls[1].bytes, 3 * kChunkBytes);
  f.backend.calls.clear();
  policy->next = {{b, kChunkBytes + kChunkBytes / 2, false}};
  f.launch({{k, kChunkBytes, false}});
  // Room for 2: two of a's chunks leave; b comes in, its second chunk clipped to b's end.
  EXPECT_EQ(moved(Location::cpu), 2 * kChunkBytes);
  EXPECT_EQ(moved(Location::gpu), kChunkBytes + kChunkBytes / 2);
  f.backend.calls.clear();
  policy->next = {{c, 3 * kChunkBytes, false}};
  f.launch({{k, kChunkBytes, false}});
  // Out: a's last chunk and all of b (its second chunk clipped to b); in: c's first three.
  EXPECT_EQ(moved(Location::cpu), 2 * kChunkBytes + kChunkBytes / 2);
  EXPECT_EQ(moved(Location::gpu), 3 * kChunkBytes);
  EXPECT_EQ(f.engine.planned_resident_chunks(), 4u);
}

TEST(EngineLaunch, CorrelationPrefetchesWhatFollowedLastTime) {
  Fixture f(2, make_policy("correlation"));
  std::uint64_t a = f.alloc(kChunkBytes), b = f.alloc(kChunkBytes), c = f.alloc(kChunkBytes);
  auto run = [&](std::uint64_t addr, std::uint64_t id) {
    Launch l;
    l.seq = f.seq++;
    l.name = "k";
    l.exec_id = id;
    std::vector<Access> acc{{addr, kChunkBytes, false}};
    l.accesses = acc;
    f.engine.launch(l);
  };
  run(a, 1);
  run(b, 2);
  run(c, 3);  // the budget holds 2 chunks: a (least recently used) left
  EXPECT_FALSE(f.engine.planned_resident(chunk_of(a)));
  f.backend.calls.clear();
  run(a, 1);
  // Launch 1 needs a (b goes, the least recently used); last time 1 was followed by 2,
  // which used b: the policy prefetches b, and c (used by 3, after 2) goes to make room.
  // The evictions are issued first, then the fetches, each in the order the plan made them.
  ASSERT_EQ(f.backend.calls.size(), 4u);
  EXPECT_EQ(f.backend.calls[0].addr, b);
  EXPECT_EQ(f.backend.calls[0].to, Location::cpu);
  EXPECT_EQ(f.backend.calls[1].addr, c);
  EXPECT_EQ(f.backend.calls[1].to, Location::cpu);
  EXPECT_EQ(f.backend.calls[2].addr, a);
  EXPECT_EQ(f.backend.calls[2].to, Location::gpu);
  EXPECT_EQ(f.backend.calls[3].addr, b);
  EXPECT_EQ(f.backend.calls[3].to, Location::gpu);
}

}  // namespace
}  // namespace spillway
