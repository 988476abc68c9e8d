// The Engine (uvm/src/engine.cpp) over a GMock Backend: budget, host cap, deferred frees,
// stream capture, concurrent-managed-access check, the advise policy, statistics and report.
#include "spillway/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "spillway/policy.h"
#include "spillway/report.h"
#include "policy_registry.h"

namespace spillway {
namespace {

using ::testing::_;
using ::testing::DoAll;
using ::testing::Invoke;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::SetArgPointee;

constexpr std::uint64_t MiB = 1ull << 20, GiB = 1ull << 30;
constexpr StreamHandle kStream = 0x5000;
constexpr EventHandle kEvent = 0x77;

class MockBackend : public Backend {
 public:
  MOCK_METHOD(Result, memory_info, (std::uint64_t*, std::uint64_t*), (override));
  MOCK_METHOD(std::uint64_t, host_memory_bytes, (), (override));
  MOCK_METHOD(bool, concurrent_managed_access, (), (override));
  MOCK_METHOD(int, current_device, (), (override));
  MOCK_METHOD(Result, allocate_managed, (std::uint64_t, std::uint64_t*), (override));
  MOCK_METHOD(Result, free_managed, (std::uint64_t), (override));
  MOCK_METHOD(Result, prefetch, (std::uint64_t, std::uint64_t, Location, int), (override));
  MOCK_METHOD(Result, advise, (std::uint64_t, std::uint64_t, Advice, Location, int), (override));
  MOCK_METHOD(Result, capture_status, (StreamHandle, bool*), (override));
  MOCK_METHOD(Result, record_event, (StreamHandle, EventHandle*), (override));
  MOCK_METHOD(Result, event_done, (EventHandle), (override));
  MOCK_METHOD(void, destroy_event, (EventHandle), (override));
  MOCK_METHOD(Result, wait_event, (EventHandle), (override));
};

Result ok() { return Result{}; }
Result not_ready() { return Result{Status::not_ready, 600}; }

// A device with `free` of `total` bytes free, 64 GiB of host RAM, concurrent managed access,
// and an allocator that hands out disjoint addresses.
class EngineTest : public ::testing::Test {
 protected:
  void SetUpDevice(std::uint64_t free = 10 * GiB, std::uint64_t total = 16 * GiB, bool cma = true) {
    ON_CALL(backend, concurrent_managed_access()).WillByDefault(Return(cma));
    ON_CALL(backend, memory_info(_, _))
        .WillByDefault(DoAll(SetArgPointee<0>(free), SetArgPointee<1>(total), Return(ok())));
    ON_CALL(backend, host_memory_bytes()).WillByDefault(Return(64 * GiB));
    ON_CALL(backend, current_device()).WillByDefault(Return(0));
    ON_CALL(backend, allocate_managed(_, _)).WillByDefault(Invoke([this](std::uint64_t bytes, std::uint64_t* addr) {
      *addr = next_;
      next_ += (bytes + 0xfff) / 0x1000 * 0x1000 + 0x1000;
      return ok();
    }));
    ON_CALL(backend, free_managed(_)).WillByDefault(Return(ok()));
    ON_CALL(backend, prefetch(_, _, _, _)).WillByDefault(Return(ok()));
    ON_CALL(backend, advise(_, _, _, _, _)).WillByDefault(Return(ok()));
    ON_CALL(backend, capture_status(_, _)).WillByDefault(DoAll(SetArgPointee<1>(false), Return(ok())));
    ON_CALL(backend, record_event(_, _)).WillByDefault(DoAll(SetArgPointee<1>(kEvent), Return(ok())));
    ON_CALL(backend, event_done(_)).WillByDefault(Return(ok()));
    ON_CALL(backend, wait_event(_)).WillByDefault(Return(ok()));
  }

  std::unique_ptr<Engine> MakeEngine(std::map<std::string, std::string> env = {}) {
    Config config;
    for (const auto& [k, v] : env) {
      std::string err = set_option(config, k, v, policy_names());
      EXPECT_EQ(err, "");
    }
    return std::make_unique<Engine>(config, backend, make_policy(config.policy));
  }

  std::uint64_t Allocate(Engine& e, std::uint64_t bytes, StreamHandle stream = 0) {
    std::uint64_t addr = 0;
    Result r = e.allocate(bytes, AllocKind::alloc, stream, &addr);
    EXPECT_TRUE(r.ok()) << static_cast<int>(r.status);
    return addr;
  }

  NiceMock<MockBackend> backend;
  std::uint64_t next_ = 0x7f0000000000ull;
};

TEST_F(EngineTest, BudgetIsPhysicalFreeWhenUnset) {
  SetUpDevice(10 * GiB, 16 * GiB);
  auto e = MakeEngine();
  ASSERT_TRUE(e->usable());
  EXPECT_EQ(e->budget_bytes(), 10 * GiB);
  EXPECT_EQ(e->stats().physical_total_bytes, 16 * GiB);
}

TEST_F(EngineTest, BudgetIsMinOfFreeAndSetting) {
  SetUpDevice(10 * GiB, 16 * GiB);
  auto small = MakeEngine({{"SPILLWAY_BUDGET", "4GiB"}});
  ASSERT_TRUE(small->usable());
  EXPECT_EQ(small->budget_bytes(), 4 * GiB);
  auto large = MakeEngine({{"SPILLWAY_BUDGET", "12GiB"}});
  ASSERT_TRUE(large->usable());
  EXPECT_EQ(large->budget_bytes(), 10 * GiB) << "never more than is free";
}

TEST_F(EngineTest, PercentageBudgetIsShareOfTotal) {
  SetUpDevice(10 * GiB, 16 * GiB);
  auto half = MakeEngine({{"SPILLWAY_BUDGET", "50%"}});
  ASSERT_TRUE(half->usable());
  EXPECT_EQ(half->budget_bytes(), 8 * GiB);
  auto most = MakeEngine({{"SPILLWAY_BUDGET", "75%"}});
  ASSERT_TRUE(most->usable());
  EXPECT_EQ(most->budget_bytes(), 10 * GiB) << "75% of 16 GiB is more than the 10 GiB free";
}

TEST_F(EngineTest, MaxManagedPercentageIsShareOfHostRam) {
  SetUpDevice();
  ON_CALL(backend, host_memory_bytes()).WillByDefault(Return(1000 * MiB));
  auto def = MakeEngine();
  ASSERT_TRUE(def->usable());
  EXPECT_EQ(def->max_managed_bytes(), 800 * MiB) << "default 80% of host RAM";
  auto half = MakeEngine({{"SPILLWAY_MAX_MANAGED", "50%"}});
  ASSERT_TRUE(half->usable());
  EXPECT_EQ(half->max_managed_bytes(), 500 * MiB);
}

TEST_F(EngineTest, HostCapRefusesWithOutOfMemoryAndLaterSmallerAllocationWorks) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_MAX_MANAGED", "64MiB"}});
  EXPECT_CALL(backend, allocate_managed(48 * MiB, _)).Times(1);
  EXPECT_CALL(backend, allocate_managed(32 * MiB, _)).Times(0);
  EXPECT_CALL(backend, allocate_managed(8 * MiB, _)).Times(1);
  Allocate(*e, 48 * MiB);
  std::uint64_t addr = 0xdead;
  Result r = e->allocate(32 * MiB, AllocKind::alloc, 0, &addr);
  EXPECT_EQ(r.status, Status::out_of_memory);
  EXPECT_EQ(addr, 0xdeadu) << "no address on failure";
  Allocate(*e, 8 * MiB);
  Stats s = e->stats();
  EXPECT_EQ(s.allocations_refused, 1u);
  EXPECT_EQ(s.allocations_redirected, 2u);
  EXPECT_EQ(e->managed_bytes(), 56 * MiB);
  EXPECT_EQ(s.max_managed_bytes, 64 * MiB);
}

TEST_F(EngineTest, BackendOutOfMemoryIsReturnedAndNotCounted) {
  SetUpDevice();
  auto e = MakeEngine();
  EXPECT_CALL(backend, allocate_managed(_, _)).WillOnce(Return(Result{Status::out_of_memory, 2}));
  std::uint64_t addr = 0;
  Result r = e->allocate(MiB, AllocKind::alloc, 0, &addr);
  EXPECT_EQ(r.status, Status::out_of_memory);
  EXPECT_EQ(r.native, 2) << "the driver's own code is kept";
  EXPECT_EQ(e->managed_bytes(), 0u);
  EXPECT_EQ(e->live_blocks(), 0u);
  EXPECT_EQ(e->stats().allocations_redirected, 0u);
}

TEST_F(EngineTest, NoConcurrentManagedAccessMeansNotSupported) {
  SetUpDevice(10 * GiB, 16 * GiB, /*cma=*/false);
  auto e = MakeEngine();
  EXPECT_CALL(backend, allocate_managed(_, _)).Times(0);
  std::uint64_t addr = 0;
  EXPECT_EQ(e->allocate(MiB, AllocKind::alloc, 0, &addr).status, Status::not_supported);
  EXPECT_FALSE(e->usable());
  EXPECT_EQ(e->live_blocks(), 0u);
}

TEST_F(EngineTest, ZeroBytesIsInvalid) {
  SetUpDevice();
  auto e = MakeEngine();
  EXPECT_CALL(backend, allocate_managed(_, _)).Times(0);
  std::uint64_t addr = 0;
  EXPECT_EQ(e->allocate(0, AllocKind::alloc, 0, &addr).status, Status::invalid_value);
}

TEST_F(EngineTest, PlainFreeReleasesAtOnce) {
  SetUpDevice();
  auto e = MakeEngine();
  std::uint64_t a = Allocate(*e, 3 * MiB);
  EXPECT_TRUE(e->find(a + MiB).has_value());
  EXPECT_CALL(backend, free_managed(a)).Times(1);
  EXPECT_CALL(backend, record_event(_, _)).Times(0);
  bool ours = false;
  EXPECT_TRUE(e->release(a, std::nullopt, &ours).ok());
  EXPECT_TRUE(ours);
  EXPECT_FALSE(e->find(a).has_value());
  EXPECT_EQ(e->managed_bytes(), 0u);
  EXPECT_EQ(e->stats().frees, 1u);
  EXPECT_EQ(e->stats().frees_deferred, 0u);
}

TEST_F(EngineTest, ReleaseOfUnknownAddressIsNotOurs) {
  SetUpDevice();
  auto e = MakeEngine();
  std::uint64_t a = Allocate(*e, MiB);
  EXPECT_CALL(backend, free_managed(_)).Times(0);
  bool ours = true;
  e->release(0x1234, std::nullopt, &ours);
  EXPECT_FALSE(ours);
  ours = true;
  e->release(a + 8, std::nullopt, &ours);
  EXPECT_FALSE(ours) << "only the exact base frees a block";
  EXPECT_EQ(e->live_blocks(), 1u);
}

TEST_F(EngineTest, DeferredFreeWaitsForItsEventAndIsReleasedWhenItCompletes) {
  SetUpDevice();
  auto e = MakeEngine();
  std::uint64_t a = Allocate(*e, 2 * MiB, kStream);
  EXPECT_CALL(backend, record_event(kStream, _)).WillOnce(DoAll(SetArgPointee<1>(kEvent), Return(ok())));
  EXPECT_CALL(backend, event_done(kEvent)).WillRepeatedly(Return(not_ready()));
  EXPECT_CALL(backend, free_managed(_)).Times(0);
  bool ours = false;
  EXPECT_TRUE(e->release(a, kStream, &ours).ok());
  EXPECT_TRUE(ours);
  e->reclaim(false);
  EXPECT_EQ(e->managed_bytes(), 2 * MiB) << "still held until the stream gets there";
  EXPECT_FALSE(e->find(a).has_value()) << "but no longer a live block";
  ::testing::Mock::VerifyAndClearExpectations(&backend);

  EXPECT_CALL(backend, record_event(_, _)).Times(0);
  EXPECT_CALL(backend, event_done(kEvent)).WillOnce(Return(ok()));
  EXPECT_CALL(backend, destroy_event(kEvent)).Times(1);
  EXPECT_CALL(backend, free_managed(a)).Times(1);
  e->reclaim(false);
  EXPECT_EQ(e->managed_bytes(), 0u);
  Stats s = e->stats();
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.frees_deferred, 1u);
  ::testing::Mock::VerifyAndClearExpectations(&backend);
  EXPECT_CALL(backend, free_managed(_)).Times(0);
  e->reclaim(true);  // nothing left
}

// A stream the driver does not know is no state: its error is returned,
// and the block stays live, so that a free on a valid stream then succeeds.
TEST_F(EngineTest, StreamOrderedFreeOnAnUnknownStreamReturnsItsErrorAndKeepsTheBlock) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_POLICY", "advise"}});
  std::uint64_t a = Allocate(*e, MiB);
  constexpr StreamHandle kDead = 0x6666;
  ON_CALL(backend, capture_status(kDead, _)).WillByDefault(Return(Result{Status::error, 400}));
  EXPECT_CALL(backend, free_managed(a)).Times(0);
  bool ours = false;
  Result r = e->release(a, kDead, &ours);
  EXPECT_TRUE(ours);
  EXPECT_EQ(r.native, 400);
  EXPECT_TRUE(e->find(a).has_value()) << "the block stays the program's";
  e->reclaim(true);
  ::testing::Mock::VerifyAndClearExpectations(&backend);
  EXPECT_CALL(backend, free_managed(a)).Times(1);
  EXPECT_TRUE(e->release(a, kStream, &ours).ok());
  e->reclaim(true);
  EXPECT_EQ(e->managed_bytes(), 0u);
}

// A block whose stream-ordered release is pending is still the shim's: a
// second free of it is the program's error and never reaches the driver.
TEST_F(EngineTest, SecondFreeOfABlockWhoseReleaseIsPendingIsRefused) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_POLICY", "advise"}});
  std::uint64_t a = Allocate(*e, MiB);
  ON_CALL(backend, event_done(_)).WillByDefault(Return(not_ready()));
  EXPECT_CALL(backend, free_managed(a)).Times(1);
  bool ours = false;
  ASSERT_TRUE(e->release(a, kStream, &ours).ok());
  Result second = e->release(a, std::nullopt, &ours);
  EXPECT_TRUE(ours) << "a pending release is the shim's: the driver must not free it";
  EXPECT_EQ(second.status, Status::invalid_value);
  ON_CALL(backend, event_done(_)).WillByDefault(Return(ok()));
  e->reclaim(false);
  EXPECT_EQ(e->managed_bytes(), 0u);
  e->release(a, std::nullopt, &ours);  // released now: the driver answers
  EXPECT_FALSE(ours);
}

TEST_F(EngineTest, FreeOnCapturingStreamIssuesNothingOnItUntilCaptureEnds) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_POLICY", "advise"}});
  std::uint64_t a = Allocate(*e, MiB, kStream);
  bool capturing = true;
  ON_CALL(backend, capture_status(kStream, _)).WillByDefault(Invoke([&](StreamHandle, bool* c) {
    *c = capturing;
    return ok();
  }));
  EXPECT_CALL(backend, record_event(kStream, _)).Times(0);
  EXPECT_CALL(backend, prefetch(_, _, _, _)).Times(0);
  EXPECT_CALL(backend, free_managed(a)).Times(0);
  EXPECT_CALL(backend, wait_event(_)).Times(0);
  bool ours = false;
  EXPECT_TRUE(e->release(a, kStream, &ours).ok());
  e->reclaim(false);
  e->reclaim(true);  // even when asked to wait: a capturing stream cannot be waited on
  Allocate(*e, MiB, 0x6000);  // other work goes on meanwhile
  EXPECT_EQ(e->managed_bytes(), 2 * MiB);
  ::testing::Mock::VerifyAndClearExpectations(&backend);

  capturing = false;  // capture ended
  ::testing::InSequence order;
  EXPECT_CALL(backend, record_event(kStream, _)).WillOnce(DoAll(SetArgPointee<1>(kEvent), Return(ok())));
  EXPECT_CALL(backend, event_done(kEvent)).WillOnce(Return(ok()));
  EXPECT_CALL(backend, destroy_event(kEvent));
  EXPECT_CALL(backend, free_managed(a));
  e->reclaim(false);
  EXPECT_EQ(e->managed_bytes(), MiB);
  EXPECT_EQ(e->stats().frees_deferred, 1u);
}

TEST_F(EngineTest, CapWaitsForDeferredFreesBeforeRefusing) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_MAX_MANAGED", "64MiB"}});
  std::uint64_t a = Allocate(*e, 48 * MiB, kStream);
  EXPECT_CALL(backend, event_done(kEvent)).WillRepeatedly(Return(not_ready()));
  bool ours = false;
  e->release(a, kStream, &ours);
  ::testing::InSequence order;
  EXPECT_CALL(backend, wait_event(kEvent)).WillOnce(Return(ok()));
  EXPECT_CALL(backend, free_managed(a));
  EXPECT_CALL(backend, allocate_managed(32 * MiB, _));
  std::uint64_t b = 0;
  EXPECT_TRUE(e->allocate(32 * MiB, AllocKind::alloc, 0, &b).ok());
  EXPECT_EQ(e->stats().allocations_refused, 0u);
  EXPECT_EQ(e->managed_bytes(), 32 * MiB);
}

TEST_F(EngineTest, AdvisePolicySetsPreferredLocationAndAccessedBy) {
  SetUpDevice();
  ON_CALL(backend, current_device()).WillByDefault(Return(3));
  auto e = MakeEngine({{"SPILLWAY_POLICY", "advise"}});
  EXPECT_CALL(backend, allocate_managed(5 * MiB, _)).WillOnce(DoAll(SetArgPointee<1>(0xa0000000ull), Return(ok())));
  EXPECT_CALL(backend, advise(0xa0000000ull, 5 * MiB, Advice::preferred_location, Location::gpu, 3));
  EXPECT_CALL(backend, advise(0xa0000000ull, 5 * MiB, Advice::accessed_by, Location::gpu, 3));
  EXPECT_CALL(backend, prefetch(_, _, _, _)).Times(0);
  Allocate(*e, 5 * MiB);
  Stats s = e->stats();
  EXPECT_EQ(s.advise_calls, 2u);
  EXPECT_EQ(s.policy, "advise");
}

TEST_F(EngineTest, DemandPolicyAdvisesNothing) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_POLICY", "demand"}});
  EXPECT_CALL(backend, advise(_, _, _, _, _)).Times(0);
  EXPECT_CALL(backend, prefetch(_, _, _, _)).Times(0);
  Allocate(*e, 5 * MiB);
  EXPECT_EQ(e->stats().policy, "demand");
}

TEST_F(EngineTest, RefusedAdviceIsCountedAsBackendError) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_POLICY", "advise"}});
  EXPECT_CALL(backend, advise(_, _, _, _, _)).WillRepeatedly(Return(Result{Status::invalid_value, 1}));
  Allocate(*e, MiB);
  Stats s = e->stats();
  EXPECT_EQ(s.advise_calls, 0u);
  EXPECT_EQ(s.backend_errors, 2u);
  EXPECT_EQ(s.allocations_redirected, 1u) << "the allocation itself stands";
}

TEST_F(EngineTest, StatsPeakAndOverBudget) {
  SetUpDevice();
  auto e = MakeEngine({{"SPILLWAY_BUDGET", "4MiB"}});
  std::uint64_t a = Allocate(*e, 3 * MiB);
  Allocate(*e, 3 * MiB);
  bool ours = false;
  e->release(a, std::nullopt, &ours);
  Allocate(*e, MiB);
  e->note_passed_through(false);
  e->note_passed_through(true);
  Stats s = e->stats();
  EXPECT_EQ(s.budget_bytes, 4 * MiB);
  EXPECT_EQ(s.managed_bytes, 4 * MiB);
  EXPECT_EQ(s.peak_managed_bytes, 6 * MiB);
  EXPECT_EQ(s.peak_over_budget_bytes, 2 * MiB);
  EXPECT_EQ(s.allocations_redirected, 3u);
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(s.allocations_passed_through, 2u);
  EXPECT_EQ(s.allocations_excluded, 1u);
}

TEST(Report, JsonHasEveryFigure) {
  Stats s;
  s.policy = "advise";
  s.allocations_redirected = 11;
  s.allocations_passed_through = 12;
  s.allocations_excluded = 13;
  s.allocations_refused = 14;
  s.frees = 15;
  s.frees_deferred = 16;
  s.managed_bytes = 17;
  s.peak_managed_bytes = 18;
  s.peak_over_budget_bytes = 19;
  s.budget_bytes = 20;
  s.max_managed_bytes = 21;
  s.physical_total_bytes = 22;
  s.prefetch_to_gpu_bytes = 23;
  s.evict_to_cpu_bytes = 24;
  s.advise_calls = 25;
  s.backend_errors = 26;
  for (int i = 0; i < 9; ++i) s.h2d_calls.add(2u << 20);  // nine 2 MiB prefetches
  s.h2d_calls.add(96u << 20);                                // one 96 MiB prefetch
  s.d2h_calls.add(4096);
  nlohmann::json j = stats_json(s);
  EXPECT_EQ(j["policy"], "advise");
  EXPECT_EQ(j["allocations"]["redirected"], 11);
  EXPECT_EQ(j["allocations"]["passed_through"], 12);
  EXPECT_EQ(j["allocations"]["excluded"], 13);
  EXPECT_EQ(j["allocations"]["refused"], 14);
  EXPECT_EQ(j["allocations"]["frees"], 15);
  EXPECT_EQ(j["allocations"]["frees_deferred"], 16);
  EXPECT_EQ(j["bytes"]["managed_now"], 17);
  EXPECT_EQ(j["bytes"]["peak_managed"], 18);
  EXPECT_EQ(j["bytes"]["peak_over_budget"], 19);
  EXPECT_EQ(j["bytes"]["budget"], 20);
  EXPECT_EQ(j["bytes"]["max_managed"], 21);
  EXPECT_EQ(j["bytes"]["gpu_total"], 22);
  EXPECT_EQ(j["bytes"]["prefetched_to_gpu"], 23);
  EXPECT_EQ(j["bytes"]["evicted_to_host"], 24);
  EXPECT_EQ(j["advise_calls"], 25);
  EXPECT_EQ(j["driver_calls_refused"], 26);
  EXPECT_EQ(j["calls"]["h2d"]["calls"], 10);
  EXPECT_EQ(j["calls"]["h2d"]["bytes_median"], 2u << 20);
  EXPECT_EQ(j["calls"]["h2d"]["bytes_p90"], 2u << 20) << "nearest rank: the 9th of 10";
  EXPECT_EQ(j["calls"]["d2h"]["calls"], 1);
  EXPECT_EQ(j["calls"]["d2h"]["bytes_median"], 4096);
  // Asked against migrated: the driver's figure only where fault feedback counted it.
  EXPECT_EQ(j["prefetch_reconciliation"]["asked_to_gpu"], 23);
  EXPECT_TRUE(j["prefetch_reconciliation"]["driver_migrated_to_gpu"].is_null()) << j.dump();
  EXPECT_EQ(j["prefetch_reconciliation"]["counted_by"], "not counted: fault feedback off");
  s.fault_feedback = "cupti";
  s.migrated_to_gpu_bytes = 7;
  j = stats_json(s);
  EXPECT_EQ(j["prefetch_reconciliation"]["driver_migrated_to_gpu"], 7);
  EXPECT_EQ(j["prefetch_reconciliation"]["counted_by"], "fault feedback (cupti)");
  s.fault_feedback = "off: another CUPTI client appeared";  // (stopped after counting some)
  EXPECT_EQ(stats_json(s)["prefetch_reconciliation"]["driver_migrated_to_gpu"], 7);
  s.fault_feedback = "cupti";
  EXPECT_NE(j["prefetch_reconciliation"]["why_they_differ"].get<std::string>().find("never written"), std::string::npos);
  std::string table = stats_table(s);
  EXPECT_NE(table.find("23 B asked; the driver migrated 7 B (pages already resident"), std::string::npos) << table;
  EXPECT_NE(table.find("move calls"), std::string::npos) << table;
  EXPECT_NE(table.find("allocations redirected"), std::string::npos) << table;
  EXPECT_NE(table.find("11"), std::string::npos) << table;
  EXPECT_NE(table.find("advise"), std::string::npos) << table;
  EXPECT_EQ(table.find("device 0"), std::string::npos) << "one device: no per-device rows\n" << table;
}

TEST(Report, GivesEachDevice) {
  Stats s;
  s.policy = "learned";
  DeviceStats d0, d1;
  d0.device = 0;
  d0.launches = 5;
  d0.budget_bytes = 100;
  d0.prefetch_to_gpu_bytes = 7;
  d1.device = 3;
  d1.launches = 9;
  d1.evict_to_cpu_bytes = 11;
  d1.resident_chunks = 2;
  s.devices = {d0, d1};
  nlohmann::json j = stats_json(s);
  ASSERT_EQ(j["devices"].size(), 2u);
  EXPECT_EQ(j["devices"][0]["device"], 0);
  EXPECT_EQ(j["devices"][0]["launches"], 5);
  EXPECT_EQ(j["devices"][0]["bytes"]["budget"], 100);
  EXPECT_EQ(j["devices"][0]["bytes"]["prefetched_to_gpu"], 7);
  EXPECT_EQ(j["devices"][1]["device"], 3);
  EXPECT_EQ(j["devices"][1]["launches"], 9);
  EXPECT_EQ(j["devices"][1]["bytes"]["evicted_to_host"], 11);
  EXPECT_EQ(j["devices"][1]["resident_chunks"], 2);
  std::string table = stats_table(s);
  EXPECT_NE(table.find("device 0"), std::string::npos) << table;
  EXPECT_NE(table.find("device 3"), std::string::npos) << table;
  EXPECT_NE(table.find("9 launches"), std::string::npos) << table;
}

TEST(Report, WriteReportWritesJsonAndNamesTheFileOnError) {
  Stats s;
  s.policy = "demand";
  s.allocations_redirected = 3;
  s.frees = 2;
  auto dir = std::filesystem::temp_directory_path() / ("spillway_report_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "r.json").string();
  EXPECT_EQ(write_report(path, s), "");
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["allocations"]["redirected"], 3);
  EXPECT_EQ(j["allocations"]["frees"], 2);
  std::filesystem::remove_all(dir);

  std::string bad = (dir / "missing-dir" / "r.json").string();
  std::string err = write_report(bad, s);
  EXPECT_NE(err.find(bad), std::string::npos) << err;
  EXPECT_NE(err.find("SPILLWAY_REPORT"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << "one line";
}

// A thread-safe stand-in for the device: disjoint addresses, no events pending.
class CountingBackend final : public Backend {
 public:
  Result memory_info(std::uint64_t* f, std::uint64_t* t) override {
    *f = 10 * GiB;
    *t = 16 * GiB;
    return {};
  }
  std::uint64_t host_memory_bytes() override { return 64 * GiB; }
  bool concurrent_managed_access() override { return true; }
  int current_device() override { return 0; }
  Result allocate_managed(std::uint64_t bytes, std::uint64_t* addr) override {
    *addr = next.fetch_add((bytes + 0xffff) / 0x10000 * 0x10000);
    allocs.fetch_add(1);
    return {};
  }
  Result free_managed(std::uint64_t) override {
    frees.fetch_add(1);
    return {};
  }
  Result prefetch(std::uint64_t, std::uint64_t, Location, int) override { return {}; }
  Result advise(std::uint64_t, std::uint64_t, Advice, Location, int) override { return {}; }
  Result capture_status(StreamHandle, bool* capturing) override {
    *capturing = false;
    return {};
  }
  Result record_event(StreamHandle, EventHandle* e) override {
    *e = 1;
    return {};
  }
  Result event_done(EventHandle) override { return {}; }
  void destroy_event(EventHandle) override {}
  Result wait_event(EventHandle) override { return {}; }
  std::atomic<std::uint64_t> next{0x100000000ull}, allocs{0}, frees{0};
};

TEST(EngineThreads, SixteenThreadsAllocatingAndFreeingLeaveTheTableConsistent) {
  CountingBackend backend;
  Engine e(Config{}, backend, make_policy("demand"));
  constexpr int kThreads = 16, kPairs = 200'000 / kThreads;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::uint64_t> live;
      for (int i = 0; i < kPairs; ++i) {
        std::uint64_t addr = 0;
        if (!e.allocate(4096 + static_cast<std::uint64_t>(i % 7) * 512, AllocKind::alloc,
                        (i % 3 == 0) ? StreamHandle(t + 1) : 0, &addr).ok()) ++failures;
        live.push_back(addr);
        if (live.size() > 4 || i == kPairs - 1) {
          while (!live.empty()) {
            bool ours = false;
            std::optional<StreamHandle> s;
            if (live.back() % 2 == 0 && i % 5 == 0) s = StreamHandle(t + 1);
            if (!e.release(live.back(), s, &ours).ok() || !ours) ++failures;
            live.pop_back();
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  e.reclaim(true);
  EXPECT_EQ(failures.load(), 0);
  Stats s = e.stats();
  EXPECT_EQ(s.allocations_redirected, static_cast<std::uint64_t>(kThreads) * kPairs);
  EXPECT_EQ(s.frees, s.allocations_redirected);
  EXPECT_EQ(backend.frees.load(), backend.allocs.load());
  EXPECT_EQ(e.live_blocks(), 0u);
  EXPECT_EQ(e.managed_bytes(), 0u);
}

// A framework's allocator, followed: segments are blocks, the tensors it reports inside them
// are what launches' pointers are given; the Policies still see only the blocks.
class RecordingPolicy : public Policy {
 public:
  std::string_view name() const override { return "recording"; }
  void on_alloc(const Block& block, Actions&) override { bases.push_back(block.base); }
  void on_free(const Block& block, Actions&) override { bases.push_back(block.base); }
  std::vector<std::uint64_t> bases;
};

TEST_F(EngineTest, FollowsAFrameworksTensorsInsideItsSegments) {
  SetUpDevice();
  auto owned = std::make_unique<RecordingPolicy>();
  RecordingPolicy& policy = *owned;
  Engine e(Config{}, backend, std::move(owned));
  const std::uint64_t seg = Allocate(e, 20 * MiB);
  EXPECT_FALSE(e.follow_segment(seg + 30 * MiB, 2 * MiB)) << "not inside a block of ours";
  EXPECT_FALSE(e.follow_segment(seg, 21 * MiB)) << "runs past the block";
  ASSERT_TRUE(e.follow_segment(seg, 20 * MiB));
  EXPECT_FALSE(e.note_tensor_alloc(seg + 40 * MiB, MiB)) << "outside the segment";
  ASSERT_TRUE(e.note_tensor_alloc(seg + 3 * MiB, 5 * MiB));
  EXPECT_FALSE(e.note_tensor_alloc(seg + 4 * MiB, MiB)) << "overlaps a live tensor";
  // A launch's pointer into the tensor gets the tensor's extent; elsewhere, the segment's.
  std::optional<Block> in = e.find_extent(seg + 3 * MiB + 4096);
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->base, seg + 3 * MiB);
  EXPECT_EQ(in->bytes, 5 * MiB);
  std::optional<Block> out = e.find_extent(seg + 9 * MiB);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->base, seg);
  EXPECT_EQ(out->bytes, 20 * MiB);
  EXPECT_EQ(e.find(seg + 3 * MiB)->base, seg) << "find() still gives the block";
  Stats s = e.stats();
  EXPECT_EQ(s.framework_segments, 1u);
  EXPECT_EQ(s.framework_tensors, 1u);
  EXPECT_EQ(s.framework_tensor_allocs, 1u);
  EXPECT_EQ(s.framework_events_refused, 4u);
  // FREE_COMPLETED: the pointer falls back to the segment.
  EXPECT_FALSE(e.note_tensor_free(seg + 4 * MiB)) << "no tensor based there";
  ASSERT_TRUE(e.note_tensor_free(seg + 3 * MiB));
  EXPECT_EQ(e.find_extent(seg + 3 * MiB + 4096)->base, seg);
  EXPECT_FALSE(e.note_tensor_free(seg + 3 * MiB)) << "a second free";
  EXPECT_EQ(e.stats().framework_events_refused, 6u);
  EXPECT_EQ(policy.bases, std::vector<std::uint64_t>{seg}) << "the Policy saw the segment alone";
}

TEST_F(EngineTest, ReleasingASegmentsBlockStopsFollowingIt) {
  SetUpDevice();
  auto e = MakeEngine();
  const std::uint64_t seg = Allocate(*e, 20 * MiB);
  ASSERT_TRUE(e->follow_segment(seg, 20 * MiB));
  ASSERT_TRUE(e->note_tensor_alloc(seg, MiB));
  bool ours = false;
  ASSERT_TRUE(e->release(seg, std::nullopt, &ours).ok());
  EXPECT_TRUE(ours);
  EXPECT_EQ(e->stats().framework_segments, 0u);
  EXPECT_EQ(e->stats().framework_tensors, 0u);
  // The driver may hand the range out again: a block there is not followed until reported.
  next_ = seg;
  const std::uint64_t again = Allocate(*e, 20 * MiB);
  ASSERT_EQ(again, seg);
  EXPECT_FALSE(e->note_tensor_alloc(seg, MiB));
  EXPECT_EQ(e->find_extent(seg)->bytes, 20 * MiB);
  // SEGMENT_FREE stops it too.
  ASSERT_TRUE(e->follow_segment(seg, 20 * MiB));
  ASSERT_TRUE(e->note_tensor_alloc(seg, MiB));
  e->unfollow_segment(seg, 20 * MiB);
  EXPECT_EQ(e->stats().framework_tensors, 0u);
  EXPECT_EQ(e->find_extent(seg)->bytes, 20 * MiB);
}

}  // namespace
}  // namespace spillway
