// The sub-allocator end to end: tests/programs/per_tensor under the real
// shim against the fake driver — a program that allocates per tensor as a framework's
// per-tensor mode does, and one that allocates like PyTorch's caching allocator.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kPrograms = PROGRAM_DIR;

struct ProgramRun {
  RunResult result;
  std::vector<std::string> log;  // FAKECUDA_LOG
  nlohmann::json report;         // SPILLWAY_REPORT
  nlohmann::json stats;          // FAKECUDA_STATS (residency model), when asked for
};

ProgramRun per_tensor(std::vector<std::string> args, Env extra = {}) {
  std::string dir = temp_dir();
  Env env{{"LD_LIBRARY_PATH", kFakeDir},
          {"LD_PRELOAD", kShim},
          {"FAKECUDA_LOG", dir + "/fake.log"},
          {"SPILLWAY_REPORT", dir + "/r.json"}};
  if (extra.count("FAKECUDA_GPU_MEMORY")) env["FAKECUDA_STATS"] = dir + "/stats.json";
  for (const auto& [k, v] : extra) env[k] = v;
  args.insert(args.begin(), kPrograms + "/per_tensor");
  ProgramRun r;
  r.result = run(args, env, 170);
  r.log = split_lines(read_file(dir + "/fake.log"));
  std::string report = read_file(dir + "/r.json");
  if (!report.empty()) r.report = nlohmann::json::parse(report);
  std::string stats = read_file(dir + "/stats.json");
  if (!stats.empty()) r.stats = nlohmann::json::parse(stats);
  return r;
}

std::string call_name(const std::string& line) { return line.substr(0, line.find(' ')); }

std::size_t count_calls(const ProgramRun& r, const std::string& name) {
  std::size_t n = 0;
  for (const std::string& l : r.log) n += call_name(l) == name;
  return n;
}

// The program frees tensor A while the kernel writing it is still pending (the fake runs
// stream work only when synchronized): A's range is not handed out again until that work
// has completed, the free itself waited for nothing, and A comes back once it has.
TEST(PerTensor, AFreedRangeIsNotReusedWhileItsKernelMayStillRun) {
  ProgramRun r = per_tensor({"reuse"}, {{"FAKECUDA_ASYNC", "1"}});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  const std::string a = field(r.result.out, "A");
  ASSERT_FALSE(a.empty());
  EXPECT_NE(field(r.result.out, "B"), a) << "A was reused while its kernel was pending";
  EXPECT_EQ(field(r.result.out, "pending_after_free"), "1") << "the free waited for the device";
  EXPECT_EQ(field(r.result.out, "pending_before_sync"), "1") << "1100 frees waited for the device";
  EXPECT_EQ(field(r.result.out, "reused"), "1") << "A never came back once its work was done";
  // Nothing before the program's own cuCtxSynchronize waited for the device.
  for (const std::string& l : r.log) {
    const std::string name = call_name(l);
    if (name == "cuCtxSynchronize") break;
    EXPECT_TRUE(name != "cuStreamSynchronize" && name != "cuEventSynchronize" && name != "cuMemFree_v2") << l;
  }
  // One range from the driver serves the 1100 tensors; fences on the legacy stream order reuse.
  EXPECT_LE(count_calls(r, "cuMemAllocManaged"), 3u);
  EXPECT_GE(r.report["suballocator"]["fences"].get<int>(), 1) << r.report.dump();
  bool legacy = false;
  for (const std::string& l : r.log) legacy = legacy || (call_name(l) == "cuEventRecord" && l.find("stream=0x1 ") != std::string::npos);
  EXPECT_TRUE(legacy) << "a fence records on the legacy stream";
}

// Large and small tensors die around a live 4 MiB tensor and live small ones: the fake drops
// the pages of every discarded range (they read as zeros), so a discard that touched a live
// tensor fails the program's checks.
TEST(PerTensor, DiscardIsNeverAppliedToALiveRange) {
  ProgramRun r = per_tensor({"discard", "20"});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_NE(r.result.out.find("ok"), std::string::npos);
  EXPECT_GT(count_calls(r, "cuMemDiscardBatchAsync"), 0u) << "the dead chunks were discarded";
  EXPECT_GT(r.report["suballocator"]["discarded"].get<std::uint64_t>(), 0u);
  for (const std::string& l : r.log) {
    if (call_name(l) == "cuMemDiscardBatchAsync") EXPECT_NE(l.find("-> 0"), std::string::npos) << l;
  }
  EXPECT_EQ(r.report["bytes"]["live_blocks"], 0);
}

// A launch's fetches of tensors apart from one another go to the driver as one
// cuMemPrefetchBatchAsync, after its evictions, on a stream made to wait for the evictions'
// stream (cuStreamWaitEvent after the last eviction: the room the plan counts on is free on
// the device first), and every byte stays right. A driver that refuses a batch gets the
// ranges one by one from then on.
TEST(PerTensor, FetchesApartFromOneAnotherGoInOneBatchCall) {
  const Env env{{"FAKECUDA_GPU_MEMORY", std::to_string(16 << 20)}, {"SPILLWAY_BUDGET", "12MiB"},
                {"SPILLWAY_POLICY", "sequential"}, {"FAKECUDA_ASYNC", "1"}, {"SPILLWAY_LOG", "info"}};
  ProgramRun r = per_tensor({"gather", "6"}, env);
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_GT(count_calls(r, "cuMemPrefetchBatchAsync"), 0u);
  for (const std::string& l : r.log) {
    if (call_name(l) != "cuMemPrefetchBatchAsync") continue;
    EXPECT_NE(l.find(" count=3 locs=1 flags=0 "), std::string::npos) << "three 4 MiB tensors apart: " << l;
    EXPECT_NE(l.find(" loc_type=1 loc_id=0 "), std::string::npos) << "to device 0: " << l;
    EXPECT_NE(l.find("-> 0"), std::string::npos) << l;
  }
  std::size_t last_eviction = 0, batches_after_evictions = 0;
  std::map<std::string, std::size_t> last_wait;  // stream -> line of its last cuStreamWaitEvent
  auto stream_of = [](const std::string& l) { return field(l, "stream"); };
  for (std::size_t i = 0; i < r.log.size(); ++i) {
    const std::string& l = r.log[i];
    const std::string name = call_name(l);
    if (name == "cuStreamWaitEvent") last_wait[stream_of(l)] = i + 1;
    if (name == "cuMemPrefetchAsync_v2" && l.find(" loc_type=2 ") != std::string::npos) last_eviction = i + 1;
    if (name == "cuMemPrefetchBatchAsync" && last_eviction != 0) {
      ++batches_after_evictions;
      EXPECT_GT(last_wait[stream_of(l)], last_eviction) << "line " << i + 1 << ": not ordered after the evictions: " << l;
    }
  }
  EXPECT_GT(batches_after_evictions, 0u);
  EXPECT_EQ(r.stats["driver_evictions"], 0) << r.stats.dump();
  EXPECT_EQ(r.stats["faults"], 0) << r.stats.dump();
  const auto& calls = r.report["calls"];
  EXPECT_EQ(calls["h2d_batches"]["batches"].get<std::uint64_t>(), count_calls(r, "cuMemPrefetchBatchAsync"));
  EXPECT_EQ(calls["h2d_batches"]["ranges"].get<std::uint64_t>(), 3 * count_calls(r, "cuMemPrefetchBatchAsync"));

  Env refused = env;
  refused["FAKECUDA_FAIL"] = "cuMemPrefetchBatchAsync:1:1";  // CUDA_ERROR_INVALID_VALUE
  ProgramRun f = per_tensor({"gather", "6"}, refused);
  ASSERT_EQ(f.result.status, 0) << describe(f.result);
  EXPECT_EQ(count_calls(f, "cuMemPrefetchBatchAsync"), 1u) << "no batch after the refusal";
  EXPECT_NE(f.result.err.find("cuMemPrefetchBatchAsync refused a batch of 3 ranges (CUresult 1): prefetching range by range"),
            std::string::npos)
      << f.result.err;
  EXPECT_EQ(f.report["calls"]["h2d_batches"]["batches"], 0);
  EXPECT_EQ(f.report["calls"]["h2d"]["calls"], r.report["calls"]["h2d"]["calls"]) << "the same ranges, one by one";
  EXPECT_EQ(f.report["driver_calls_refused"], 1) << "the refused batch";
  EXPECT_EQ(f.stats["driver_evictions"], 0) << f.stats.dump();
}

// A forward/backward pattern through a GPU a quarter of its working set: exact extents, every
// tensor checked before its free, one driver allocation instead of one per tensor, dead
// chunks discarded, and the driver never has to evict (dead or live).
TEST(PerTensor, TrainingPatternMovesNoDeadDataAndNeedsNoDriverEviction) {
  const std::string gpu = std::to_string(16 << 20);
  Env env{{"FAKECUDA_GPU_MEMORY", gpu}, {"SPILLWAY_BUDGET", gpu}, {"SPILLWAY_POLICY", "learned"}};
  ProgramRun on = per_tensor({"training", "20"}, env);
  env["SPILLWAY_SUBALLOCATOR"] = "off";
  ProgramRun off = per_tensor({"training", "20"}, env);
  for (const ProgramRun* r : {&on, &off}) {
    ASSERT_EQ(r->result.status, 0) << describe(r->result);
    ASSERT_TRUE(r->stats.is_object());
    EXPECT_EQ(r->stats["faults"], 0) << r->stats.dump();
  }
  std::printf("training x20, 16 MiB GPU: sub-allocator on: %zu driver allocations, evicted %llu B, discarded %llu chunks, "
              "driver evictions %llu; off: %zu driver allocations, evicted %llu B\n",
              count_calls(on, "cuMemAllocManaged"), on.report["bytes"]["evicted_to_host"].get<unsigned long long>(),
              on.stats["discarded"].get<unsigned long long>(), on.stats["driver_evictions"].get<unsigned long long>(),
              count_calls(off, "cuMemAllocManaged"), off.report["bytes"]["evicted_to_host"].get<unsigned long long>());
  EXPECT_EQ(count_calls(on, "cuMemAllocManaged"), 1u);
  EXPECT_EQ(count_calls(off, "cuMemAllocManaged"), 320u);
  EXPECT_EQ(on.stats["driver_evictions"], 0) << on.stats.dump();
  EXPECT_GT(on.stats["discarded"].get<int>(), 0) << on.stats.dump();
  // (The bytes `learned` evicts depend on the kernel times it measures: 250 MB against
  // 320-332 MB here, but about equal under TSan's slowdown; printed, not compared.)
}

// The caching allocator's way: segments are blocks of their own (exact address range), kernels
// point into their middle, the data stays right.
TEST(PerTensor, CachingAllocatorSegmentsKeepTheirExtentAndData) {
  ProgramRun r = per_tensor({"segments", "4"});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_EQ(field(r.result.out, "segment_range"), "exact");
}

// While a non-blocking stream is captured, fences go on: nothing is recorded on the
// capturing stream (it would join the capture), but the legacy stream, which does not follow
// a non-blocking stream, is used as usual (CUDA Programming Guide, "Stream Capture"; only a
// blocking stream's capture keeps its context's legacy stream from use:
// tests/reliability/hostile_streams_test.cpp). Captures into an existing graph count the same.
TEST(PerTensor, FencesGoOnWhileANonBlockingStreamIsCaptured) {
  for (const char* kind : {"plain", "to_graph"}) {
    ProgramRun r = per_tensor({"capture", kind});
    ASSERT_EQ(r.result.status, 0) << kind << "\n" << describe(r.result);
    const std::string begin = std::string(kind) == "plain" ? "cuStreamBeginCapture_v2" : "cuStreamBeginCaptureToGraph";
    bool capturing = false, fenced_during = false, fenced_after = false;
    std::string captured;  // "stream=0x.. " of the capturing stream
    int begins = 0;
    for (const std::string& l : r.log) {
      const std::string name = call_name(l);
      if (name == begin) {
        capturing = true;
        ++begins;
        const std::size_t at = l.find("stream=");
        captured = l.substr(at, l.find(' ', at) - at + 1);
      } else if (name == "cuStreamEndCapture" && capturing) {
        capturing = false;
      }
      const bool legacy = name == "cuEventRecord" && l.find("stream=0x1 ") != std::string::npos;
      if (capturing && name == "cuEventRecord") {
        EXPECT_EQ(l.find(captured), std::string::npos) << kind << ": an event on the capturing stream: " << l;
      }
      if (capturing && legacy) fenced_during = true;
      if (!capturing && begins > 0 && legacy) fenced_after = true;
    }
    EXPECT_GE(begins, 1) << kind;
    EXPECT_TRUE(fenced_during) << kind << ": fences go on during the capture";
    EXPECT_TRUE(fenced_after) << kind << ": and after it";
    EXPECT_EQ(r.report["bytes"]["live_blocks"], 0) << r.report.dump();
  }
}

TEST(PerTensor, SixteenThreadsAllocatingLaunchingAndFreeing) {
  ProgramRun r = per_tensor({"threads", "16", "400"});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_EQ(field(r.result.out, "failures"), "0");
  EXPECT_EQ(r.report["bytes"]["live_blocks"], 0) << r.report.dump();
  EXPECT_EQ(r.report["allocations"]["redirected"], 16 * 400) << r.report.dump();
  EXPECT_EQ(r.report["allocations"]["frees"], 16 * 400) << r.report.dump();
  EXPECT_EQ(r.report["driver_calls_refused"], 0) << r.report.dump();
}

}  // namespace
// ---- fault feedback: CUPTI end to end against the fake libcupti ----

// `per_tensor arena` under `learned` with the fake libcupti on the library path, the fake
// GPU holding 64 chunks and feedback `on` or `off`.
ProgramRun arena_run(const std::string& feedback, Env extra = {}, std::vector<std::string> args = {"arena", "6"}) {
  Env env{{"LD_LIBRARY_PATH", kFakeDir + ":" + kFakeDir + "/cupti"},
          {"FAKECUDA_GPU_MEMORY", std::to_string(128ull << 20)},
          {"SPILLWAY_POLICY", "learned"},
          {"SPILLWAY_BUDGET", "128MiB"},
          {"SPILLWAY_FAULT_FEEDBACK", feedback}};
  for (const auto& [k, v] : extra) env[k] = v;
  return per_tensor(args, env);
}

// An 80 MiB tensor 20 MiB into a 100 MiB arena: the argument scan gives the pointer 64 MiB
// (kInteriorExtent), so without feedback the rest faults at every iteration; the faults the
// fake CUPTI reports widen it, and from the second iteration on it is prefetched.
TEST(FaultFeedback, CorrectsAFootprintTheArgumentScanGotWrong) {
  ProgramRun on = arena_run("on"), off = arena_run("off");
  ASSERT_EQ(on.result.status, 0) << describe(on.result);
  ASSERT_EQ(off.result.status, 0) << describe(off.result);
  EXPECT_NE(on.result.out.find("ok"), std::string::npos);
  const nlohmann::json& f = on.report["fault_feedback"];
  EXPECT_EQ(f["state"], "cupti") << on.report.dump();
  EXPECT_GT(f["faults"].get<std::uint64_t>(), 0u);
  EXPECT_GE(f["refined_accesses"].get<std::uint64_t>(), 4u) << "iterations 2..6 plan the tensor's whole extent";
  EXPECT_GT(f["migrated_to_gpu"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(off.report["fault_feedback"]["state"], "off: SPILLWAY_FAULT_FEEDBACK=off");
  EXPECT_EQ(off.report["fault_feedback"]["faults"], 0);
  // The tensor's 8 chunks past the guess fault in each of the 6 iterations without feedback;
  // with it, only in the first. (Migrations on demand: a write to a read-mostly copy, which
  // feedback's learned advice causes once per chunk, is a fault that migrates nothing.)
  const auto faults_on = on.stats["faults"].get<std::uint64_t>() - on.stats["collapses"].get<std::uint64_t>(),
             faults_off = off.stats["faults"].get<std::uint64_t>() - off.stats["collapses"].get<std::uint64_t>();
  EXPECT_GE(faults_off, 5u * 8u) << off.stats.dump();
  EXPECT_LT(faults_on * 4, faults_off) << "on: " << on.stats.dump() << "\noff: " << off.stats.dump();
}

// Read-mostly learned from write faults (the shim's part): `per_tensor
// weights` under `learned` with the fake libcupti, a GPU of 64 MiB and a budget of 48 MiB
// for 96 MiB of tensors. Launches do not say what they write; write faults do, and the
// policy's prefetches leave no fault but those: a chunk is advised read-mostly until a write
// meets its read-mostly copy (a write fault), then never again while it lives. So the
// weights, only ever read, stay read-mostly and leave the GPU with nothing copied; each
// activation chunk, written by every iteration, collapses once and is un-advised; weight 0,
// written once by a kernel the history never saw, is un-advised after that write; weights 1
// and 2 never are; every activation is right at every iteration.
TEST(FaultFeedback, ReadMostlyAdviceFromWriteFaults) {
  ProgramRun r = per_tensor({"weights", "8"}, {{"LD_LIBRARY_PATH", kFakeDir + ":" + kFakeDir + "/cupti"},
                                               {"FAKECUDA_GPU_MEMORY", std::to_string(64ull << 20)},
                                               {"SPILLWAY_POLICY", "learned"},
                                               {"SPILLWAY_BUDGET", "48MiB"},
                                               {"SPILLWAY_FAULT_FEEDBACK", "on"}});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_NE(r.result.out.find("ok"), std::string::npos) << describe(r.result);
  EXPECT_EQ(r.report["fault_feedback"]["state"], "cupti") << r.report.dump();
  // The tensors' ranges, as the program printed them.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> weights, acts;
  for (const std::string& line : split_lines(r.result.out)) {
    unsigned long long w = 0, a = 0;
    std::size_t wb = 0, ab = 0;
    if (std::sscanf(line.c_str(), "weights=%llu,%zu acts=%llu,%zu", &w, &wb, &a, &ab) == 4) {
      weights.emplace_back(w, w + wb);
      acts.emplace_back(a, a + ab);
    }
  }
  ASSERT_EQ(weights.size(), 3u) << describe(r.result);
  // The cuMemAdvise calls: (range, advice) per call, in order.
  struct Advice {
    std::uint64_t base, end;
    int advice;
  };
  std::vector<Advice> advice;
  for (const std::string& line : r.log) {
    if (call_name(line).rfind("cuMemAdvise", 0) != 0) continue;
    unsigned long long p = 0, n = 0;
    int a = -1;
    const std::size_t at = line.find(" dptr=");
    if (at != std::string::npos && std::sscanf(line.c_str() + at, " dptr=%llx count=%llu advice=%d", &p, &n, &a) == 3) {
      advice.push_back(Advice{p, p + n, a});
    }
  }
  const auto within = [](const Advice& a, const std::pair<std::uint64_t, std::uint64_t>& t) {
    return a.base >= t.first && a.end <= t.second;
  };
  constexpr int kSet = 1, kUnset = 2;  // CU_MEM_ADVISE_SET_READ_MOSTLY, CU_MEM_ADVISE_UNSET_READ_MOSTLY
  constexpr std::size_t kChunks = 8;  // per 16 MiB tensor
  for (int i = 0; i < 3; ++i) {
    std::size_t set = 0, unset = 0, act_set = 0, act_unset = 0;
    for (const Advice& a : advice) {
      set += a.advice == kSet && within(a, weights[i]);
      unset += a.advice == kUnset && within(a, weights[i]);
      act_set += a.advice == kSet && within(a, acts[i]);
      act_unset += a.advice == kUnset && within(a, acts[i]);
    }
    EXPECT_GE(set, 1u) << "weight " << i << " is only read";
    if (i == 0) EXPECT_GE(unset, 1u) << "weight 0 was written";
    else EXPECT_EQ(unset, 0u) << "weight " << i << " is never written";
    EXPECT_LE(act_set, kChunks) << "activation " << i << ": each chunk is advised at most once";
    EXPECT_EQ(act_unset, act_set) << "activation " << i << ": each advised chunk is un-advised after its write";
  }
  // Evicted weights are read-mostly duplicates: they leave the GPU with nothing copied. Writes
  // met read-mostly copies only on the chunks written (the activations', weight 0's): once
  // each, or twice where the chunk came back as a duplicate before the first write's fault
  // record had arrived (CUPTI delivers its records in buffers, after the kernel).
  EXPECT_GT(r.stats["read_mostly_drops"].get<std::uint64_t>(), 0u) << r.stats.dump();
  EXPECT_LE(r.stats["collapses"].get<std::uint64_t>(), 2 * 4 * kChunks) << r.stats.dump();
}

// A profiler that subscribes to CUPTI mid-run (through the shim's cuptiSubscribe, as a client
// linked to libcupti reaches it) gets CUPTI as if the shim were not there; the feedback stops
// and the report says why.
TEST(FaultFeedback, StopsWhenAnotherCuptiClientAppears) {
  ProgramRun r = arena_run("on", {}, {"arena", "4", "profile"});
  ASSERT_EQ(r.result.status, 0) << describe(r.result);
  EXPECT_NE(r.result.out.find("subscribed=0"), std::string::npos) << r.result.out;
  EXPECT_EQ(r.report["fault_feedback"]["state"], "off: another CUPTI client appeared (cuptiSubscribe)") << r.report.dump();
  EXPECT_GT(r.report["fault_feedback"]["faults"].get<std::uint64_t>(), 0u) << "records came before it";
}

// Off, with the reason in the report, where CUPTI is claimed by an injected profiler or
// refuses unified-memory profiling; the program runs as without feedback.
TEST(FaultFeedback, OffWhenInjectedOrRefused) {
  ProgramRun injected = arena_run("on", {{"CUDA_INJECTION64_PATH", "/opt/profiler/libinject.so"}}, {"arena", "2"});
  ASSERT_EQ(injected.result.status, 0) << describe(injected.result);
  EXPECT_EQ(injected.report["fault_feedback"]["state"], "off: another CUPTI client is injected (CUDA_INJECTION64_PATH)");
  ProgramRun refused = arena_run("on", {{"FAKECUPTI_FAIL", "cuptiActivityConfigureUnifiedMemoryCounter"}}, {"arena", "2"});
  ASSERT_EQ(refused.result.status, 0) << describe(refused.result);
  EXPECT_EQ(refused.report["fault_feedback"]["state"].get<std::string>().rfind("off: cuptiActivityConfigureUnifiedMemoryCounter failed", 0), 0u)
      << refused.report.dump();
  EXPECT_EQ(refused.report["fault_feedback"]["faults"], 0);
  // CUPTI writes external correlation records only beside API records: without the launch
  // calls' API records there is no attribution, so the feedback is off, not silently empty.
  ProgramRun no_api = arena_run("on", {{"FAKECUPTI_FAIL", "cuptiActivityEnableDriverApi"}}, {"arena", "2"});
  ASSERT_EQ(no_api.result.status, 0) << describe(no_api.result);
  EXPECT_EQ(no_api.report["fault_feedback"]["state"].get<std::string>().rfind("off: enabling the launch calls' API records failed", 0), 0u)
      << no_api.report.dump();
  ProgramRun demand = arena_run("on", {{"SPILLWAY_POLICY", "demand"}}, {"arena", "2"});
  EXPECT_EQ(demand.report["fault_feedback"]["state"], "off: policy demand does not use it");
}

}  // namespace spillway::test
