// End-to-end tests of launch observation: tests/programs/launches run under the
// preloaded libspillway.so against the fake driver; what the shim saw is read back from the
// trace it records (SPILLWAY_TRACE), what it issued from the fake's call log (FAKECUDA_LOG).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "harness.h"

namespace spillway::test {
namespace {

const std::string kShim = SPILLWAY_SHIM;
const std::string kFakeDir = FAKECUDA_DIR;
const std::string kPrograms = PROGRAM_DIR;
const std::string kCli = SPILLWAY_CLI;

Env fake_env(const Env& extra = {}) {
  Env env{{"LD_LIBRARY_PATH", kFakeDir}, {"LD_PRELOAD", kShim}};
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

RunResult launches(std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), kPrograms + "/launches");
  return run(args, env);
}

std::uint64_t hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

struct Trace {
  nlohmann::json header;
  std::vector<nlohmann::json> events;
  std::map<std::uint64_t, std::uint64_t> id_of_addr;  // alloc addr -> id
  std::vector<nlohmann::json> kernels() const {
    std::vector<nlohmann::json> k;
    for (const auto& e : events)
      if (e.value("ev", "") == "kernel") k.push_back(e);
    return k;
  }
};

Trace read_trace(const std::string& path) {
  Trace t;
  std::istringstream in(read_file(path));
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (first) {
      t.header = j;
      first = false;
      continue;
    }
    if (j.value("ev", "") == "alloc" && j.contains("addr")) t.id_of_addr[j["addr"].get<std::uint64_t>()] = j["id"].get<std::uint64_t>();
    t.events.push_back(j);
  }
  return t;
}

// A kernel's reads as (id, offset, bytes); a bare id is (id, 0, 0) meaning the whole block.
std::set<std::vector<std::uint64_t>> reads(const nlohmann::json& kernel) {
  std::set<std::vector<std::uint64_t>> out;
  for (const auto& r : kernel["reads"]) {
    if (r.is_number()) out.insert({r.get<std::uint64_t>(), 0, 0});
    else out.insert({r[0].get<std::uint64_t>(), r[1].get<std::uint64_t>(), r[2].get<std::uint64_t>()});
  }
  return out;
}

// Parses "key=value" fields of one FAKECUDA_LOG line.
std::string log_field(const std::string& line, const std::string& key) {
  std::string needle = " " + key + "=";
  auto p = line.find(needle);
  if (p == std::string::npos) return "";
  p += needle.size();
  return line.substr(p, line.find(' ', p) - p);
}

TEST(Launch, PointersDirectAndInsideStructsAreSeen) {
  std::string dir = temp_dir();
  RunResult r = launches({"args"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  std::uint64_t a = hex(field(r.out, "A")), b = hex(field(r.out, "B")), c = hex(field(r.out, "C"));
  Trace t = read_trace(dir + "/t.jsonl");
  EXPECT_EQ(t.header["format"], "spillway-trace");
  ASSERT_EQ(t.id_of_addr.count(a) + t.id_of_addr.count(b) + t.id_of_addr.count(c), 3u);
  std::uint64_t ia = t.id_of_addr[a], ib = t.id_of_addr[b], ic = t.id_of_addr[c];
  auto k = t.kernels();
  ASSERT_EQ(k.size(), 4u) << read_file(dir + "/t.jsonl");
  using R = std::set<std::vector<std::uint64_t>>;
  EXPECT_EQ(reads(k[0]), (R{{ia, 0, 0}})) << k[0].dump();                          // kernelParams
  EXPECT_EQ(reads(k[1]), (R{{ib, 2u << 20, 4u << 20}})) << k[1].dump();             // inside a by-value struct, mid-block
  EXPECT_EQ(reads(k[2]), (R{{ic, 0, 0}, {ia, 0, 0}})) << k[2].dump();               // CU_LAUNCH_PARAM_BUFFER
  EXPECT_EQ(reads(k[3]), (R{{ib, 0, 0}})) << k[3].dump();                           // cooperative
}

TEST(Launch, NothingIsIssuedOnACapturingStream) {
  std::string dir = temp_dir();
  RunResult r = launches({"capture"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"},
                                                {"FAKECUDA_LOG", dir + "/log"},
                                                {"SPILLWAY_POLICY", "sequential"},
                                                {"SPILLWAY_BUDGET", "64MiB"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  std::string stream = field(r.out, "stream");
  std::string log = read_file(dir + "/log");
  int captured_launches = 0;
  for (const std::string& line : lines_with(log, "capturing=1")) {
    std::string fn = line.substr(0, line.find(' '));
    // The program's own launch and end of capture, and the shim's query: no work issued.
    EXPECT_TRUE(fn == "cuLaunchKernel" || fn == "cuStreamEndCapture" || fn == "cuStreamIsCapturing" ||
                fn == "cuStreamGetCaptureInfo_v3")
        << "the shim issued on a capturing stream: " << line;
    if (fn == "cuLaunchKernel") ++captured_launches;
  }
  EXPECT_EQ(captured_launches, 1);
  // The captured kernel is not a launch now; each graph launch is one, with the captured footprint.
  Trace t = read_trace(dir + "/t.jsonl");
  auto k = t.kernels();
  ASSERT_EQ(k.size(), 3u) << read_file(dir + "/t.jsonl");
  std::uint64_t ia = t.id_of_addr[hex(field(r.out, "A"))];
  EXPECT_EQ(k[1]["name"], "graph");
  EXPECT_EQ(reads(k[1]), reads(k[0]));
  EXPECT_EQ(reads(k[2]), (std::set<std::vector<std::uint64_t>>{{ia, 0, 0}}));
}

class OwnStreams : public ::testing::TestWithParam<const char*> {};

// 8 blocks of 8 MiB cycled 3 times under a 32 MiB budget.
TEST_P(OwnStreams, PrefetchesOnTheShimsStreamsWithinTheBudget) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "3", "8"}, fake_env({{"FAKECUDA_LOG", dir + "/log"},
                                                        {"SPILLWAY_POLICY", GetParam()},
                                                        {"SPILLWAY_BUDGET", "32MiB"},
                                                        {"SPILLWAY_REPORT", dir + "/report.json"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  std::string program_stream = field(r.out, "stream");
  std::string log = read_file(dir + "/log");
  auto prefetches = lines_with(log, "cuMemPrefetchAsync_v2 ");
  ASSERT_FALSE(prefetches.empty()) << "the shim issued no prefetch";
  std::set<std::string> to_gpu_streams, to_host_streams;
  std::map<std::uint64_t, bool> resident;  // chunk -> on the GPU
  std::size_t peak = 0;
  for (const std::string& line : prefetches) {
    std::string s = log_field(line, "stream");
    EXPECT_NE(s, program_stream) << line;
    EXPECT_NE(hex(s), 0u) << "prefetch on the legacy stream: " << line;
    bool to_gpu = log_field(line, "loc_type") == "1";
    (to_gpu ? to_gpu_streams : to_host_streams).insert(s);
    std::uint64_t p = hex(log_field(line, "dptr")), n = std::stoull(log_field(line, "count"));
    for (std::uint64_t c = p >> 21; c <= (p + n - 1) >> 21; ++c) {
      if (to_gpu) resident[c] = true;
      else resident.erase(c);
    }
    peak = std::max(peak, resident.size());
  }
  EXPECT_LE(peak, 16u) << "planned past the 32 MiB budget";
  EXPECT_EQ(to_gpu_streams.size(), 1u);
  if (!to_host_streams.empty()) {
    EXPECT_EQ(to_host_streams.size(), 1u);
    EXPECT_NE(*to_host_streams.begin(), *to_gpu_streams.begin()) << "one stream each way";
  }
  nlohmann::json report = nlohmann::json::parse(read_file(dir + "/report.json"));
  EXPECT_EQ(report["bytes"]["budget"], 32u << 20);
  EXPECT_GT(report["bytes"]["prefetched_to_gpu"].get<std::uint64_t>(), 0u);
  EXPECT_GT(report["bytes"]["evicted_to_host"].get<std::uint64_t>(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, OwnStreams, ::testing::Values("sequential", "correlation"));

// Device memory held beside the managed data: a buffer of the NCCL-like
// library (excluded by default, so it stays device memory) or VMM physical memory takes
// 16 MiB of the 32 MiB budget while it lives: the plan keeps within the 16 MiB left, and
// within the whole budget again once it is released.
class OutsideMemory : public ::testing::TestWithParam<const char*> {};

TEST_P(OutsideMemory, ShrinksTheBudgetWhileItLives) {
  const std::string dir = temp_dir(), mode = GetParam();
  std::vector<std::string> args{kPrograms + "/outside_memory", mode};
  if (mode == "nccl") args.push_back(FAKE_NCCL_LIB);
  RunResult r = run(args, fake_env({{"FAKECUDA_LOG", dir + "/log"},
                                    {"SPILLWAY_BUDGET", "32MiB"},
                                    {"SPILLWAY_REPORT", dir + "/report.json"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  if (mode == "vmm") {  // (memory the program maps itself cannot spill: said once)
    ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
    EXPECT_NE(r.err.find("cuMemCreate"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("cannot spill to host memory"), std::string::npos) << r.err;
  } else {
    EXPECT_EQ(r.err, "");
  }
  if (mode == "nccl") EXPECT_EQ(field(r.out, "nccl_managed"), "0") << "NCCL's buffer stays device memory";
  // The prefetches before and after the release (the log holds the program's calls too).
  std::map<std::uint64_t, bool> resident;
  std::size_t peak[2] = {0, 0};
  int phase = 0;
  std::istringstream log(read_file(dir + "/log"));
  for (std::string line; std::getline(log, line);) {
    if (line.starts_with("cuMemRelease ") ||
        (line.starts_with("cuMemFree_v2 ") && hex(log_field(line, "dptr")) == hex(field(r.out, "nccl_buffer")))) {
      phase = 1;
    }
    if (!line.starts_with("cuMemPrefetchAsync_v2 ")) continue;
    const bool to_gpu = log_field(line, "loc_type") == "1";
    const std::uint64_t p = hex(log_field(line, "dptr")), n = std::stoull(log_field(line, "count"));
    for (std::uint64_t c = p >> 21; c <= (p + n - 1) >> 21; ++c) {
      if (to_gpu) resident[c] = true;
      else resident.erase(c);
    }
    peak[phase] = std::max(peak[phase], resident.size());
  }
  ASSERT_EQ(phase, 1) << "the release is in the log";
  EXPECT_GT(peak[0], 0u) << "the shim prefetched";
  EXPECT_LE(peak[0], 8u) << "planned past the 16 MiB the other memory leaves";
  EXPECT_GT(peak[1], 8u) << "the budget came back with the release";
  EXPECT_LE(peak[1], 16u) << "planned past the 32 MiB budget";
  nlohmann::json report = nlohmann::json::parse(read_file(dir + "/report.json"));
  EXPECT_EQ(report["bytes"]["outside_device_peak"], 16u << 20) << report.dump();
  EXPECT_EQ(report["bytes"]["outside_device_now"], 0u) << report.dump();
  EXPECT_EQ(report["bytes"]["budget"], 32u << 20) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(Kinds, OutsideMemory, ::testing::Values("nccl", "vmm"));

// Several GPUs, on the fake with two devices.

std::vector<std::uint64_t> block_list(const std::string& out, const std::string& key) {
  std::vector<std::uint64_t> blocks;
  std::istringstream in(field(out, key));
  for (std::string b; std::getline(in, b, ',');) blocks.push_back(std::stoull(b));
  return blocks;
}

TEST(MultiDevice, EachDeviceIsPlannedOnItsOwnGpuWithinItsOwnBudget) {
  const std::string dir = temp_dir();
  RunResult r = run({kPrograms + "/multi_device", "devices"},
                    fake_env({{"FAKECUDA_DEVICES", "2"},
                              {"FAKECUDA_GPU_MEMORY", "33554432"},
                              {"FAKECUDA_LOG", dir + "/log"},
                              {"FAKECUDA_STATS", dir + "/stats.json"},
                              {"SPILLWAY_BUDGET", "32MiB"},
                              {"SPILLWAY_REPORT", dir + "/report.json"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("ok"), std::string::npos) << describe(r);
  // Where each block belongs, by 2 MiB chunk.
  std::map<std::uint64_t, int> owner;
  for (int d = 0; d < 2; ++d) {
    const auto blocks = block_list(r.out, d == 0 ? "blocks0" : "blocks1");
    ASSERT_EQ(blocks.size(), 6u) << describe(r);
    for (std::uint64_t b : blocks) {
      for (std::uint64_t c = b >> 21; c <= (b + (8u << 20) - 1) >> 21; ++c) owner[c] = d;
    }
  }
  const std::uint64_t shared = block_list(r.out, "blocks0")[0];  // also used from device 1
  // Every prefetch toward a GPU goes to the device whose launches use the chunk, and each
  // GPU's plan stays within its own 32 MiB (16 chunks).
  std::map<std::uint64_t, int> resident;  // chunk -> the GPU the shim moved it to
  std::size_t peak[2] = {0, 0}, to_gpu[2] = {0, 0};
  std::istringstream log(read_file(dir + "/log"));
  for (std::string line; std::getline(log, line);) {
    if (!line.starts_with("cuMemPrefetchAsync_v2 ") || !line.ends_with("-> 0")) continue;
    const std::uint64_t p = hex(log_field(line, "dptr")), n = std::stoull(log_field(line, "count"));
    const bool gpu = log_field(line, "loc_type") == "1";
    const int device = std::stoi(log_field(line, "loc_id"));
    for (std::uint64_t c = p >> 21; c <= (p + n - 1) >> 21; ++c) {
      if (!gpu) {
        resident.erase(c);
        continue;
      }
      ASSERT_TRUE(owner.count(c)) << line;
      const bool in_shared = c >= shared >> 21 && c <= (shared + (8u << 20) - 1) >> 21;
      if (!in_shared) EXPECT_EQ(device, owner[c]) << "a block prefetched to the other GPU: " << line;
      resident[c] = device;
      ++to_gpu[device];
    }
    std::size_t on[2] = {0, 0};
    for (const auto& [c, d] : resident) ++on[d];
    for (int d = 0; d < 2; ++d) peak[d] = std::max(peak[d], on[d]);
  }
  for (int d = 0; d < 2; ++d) {
    EXPECT_GT(to_gpu[d], 0u) << "device " << d << " was planned";
    EXPECT_LE(peak[d], 16u) << "device " << d << " planned past its budget";
  }
  nlohmann::json report = nlohmann::json::parse(read_file(dir + "/report.json"));
  ASSERT_EQ(report["devices"].size(), 2u) << report.dump();
  for (int d = 0; d < 2; ++d) {
    const nlohmann::json& dev = report["devices"][d];
    EXPECT_EQ(dev["device"], d) << report.dump();
    EXPECT_EQ(dev["bytes"]["budget"], 32u << 20) << report.dump();
    EXPECT_GE(dev["launches"].get<int>(), 18) << report.dump();
    EXPECT_GT(dev["bytes"]["prefetched_to_gpu"].get<std::uint64_t>(), 0u) << report.dump();
  }
  EXPECT_EQ(report["bytes"]["budget"], 64u << 20) << "the totals are the sums: " << report.dump();
  EXPECT_EQ(report["launches_other_device"], 0) << report.dump();
  nlohmann::json stats = nlohmann::json::parse(read_file(dir + "/stats.json"));
  ASSERT_EQ(stats["devices"].size(), 2u) << stats.dump();
  for (int d = 0; d < 2; ++d) EXPECT_GE(stats["devices"][d]["launches"].get<int>(), 18) << stats.dump();
}

// A freed range is reused only once the work of every device that may use it is done: the
// fence records on each context the program used, not only on the current one.
TEST(MultiDevice, AFreedRangeWaitsForEveryDevicesWork) {
  RunResult r = run({kPrograms + "/multi_device", "fence"}, fake_env({{"FAKECUDA_DEVICES", "2"}, {"FAKECUDA_ASYNC", "1"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  // (In the fake, synchronizing device 0 completes the work its streams wait for: the fence's
  // wait on device 1's event makes device 1's kernel complete first.)
  EXPECT_EQ(field(r.out, "reused"), "1") << "the fence completes once the work it covers is done\n" << describe(r);
  EXPECT_EQ(field(r.out, "device1_done"), "1") << "reused while device 1 may still write it\n" << describe(r);
}

// Two torchrun workers on a two-GPU machine, each selecting its GPU as torchrun's do.
class TwoRanks : public ::testing::TestWithParam<const char*> {};

TEST_P(TwoRanks, EachPlansItsOwnDeviceAndWritesItsOwnFiles) {
  const std::string dir = temp_dir(), how = GetParam();
  auto worker = [&](int rank) {
    Env env = fake_env({{"FAKECUDA_DEVICES", "2"},
                        {"FAKECUDA_GPU_MEMORY", "33554432"},
                        {"FAKECUDA_STATS", dir + "/fake-" + std::to_string(rank) + ".json"},
                        {"RANK", std::to_string(rank)},
                        {"LOCAL_RANK", std::to_string(rank)},
                        {"SPILLWAY_BUDGET", "24MiB"},
                        {"SPILLWAY_REPORT", dir + "/report-%r.json"},
                        {"SPILLWAY_TRACE", dir + "/trace-%r.jsonl"}});
    if (how == "visible_devices") env["CUDA_VISIBLE_DEVICES"] = std::to_string(rank);
    return run({kPrograms + "/multi_device", "rank"}, env);
  };
  auto first = std::async(std::launch::async, worker, 0);
  RunResult second = worker(1);
  RunResult results[2] = {first.get(), second};
  for (int rank = 0; rank < 2; ++rank) {
    const RunResult& r = results[rank];
    ASSERT_EQ(r.status, 0) << describe(r);
    EXPECT_EQ(r.err, "");
    const int device = how == "visible_devices" ? 0 : rank;  // the ordinal the worker sees
    EXPECT_EQ(field(r.out, "device"), std::to_string(device)) << describe(r);
    nlohmann::json report = nlohmann::json::parse(read_file(dir + "/report-" + std::to_string(rank) + ".json"));
    ASSERT_EQ(report["devices"].size(), 1u) << report.dump();
    EXPECT_EQ(report["devices"][0]["device"], device) << report.dump();
    EXPECT_GE(report["devices"][0]["launches"].get<int>(), 18) << report.dump();
    EXPECT_GT(report["devices"][0]["bytes"]["prefetched_to_gpu"].get<std::uint64_t>(), 0u) << report.dump();
    EXPECT_EQ(read_trace(dir + "/trace-" + std::to_string(rank) + ".jsonl").kernels().size(), 18u);
    // The fake names the physical GPU each worker's launches ran on.
    nlohmann::json fake = nlohmann::json::parse(read_file(dir + "/fake-" + std::to_string(rank) + ".json"));
    int busy = -1;
    for (const auto& d : fake["devices"]) {
      if (d["launches"].get<int>() > 0) busy = d["physical"].get<int>();
    }
    EXPECT_EQ(busy, rank) << fake.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Select, TwoRanks, ::testing::Values("local_rank", "visible_devices"));

TEST(Launch, MultiThreadedLaunchesStayCorrect) {
  std::string dir = temp_dir();
  RunResult r = launches({"threads", "8", "200"}, fake_env({{"SPILLWAY_POLICY", "correlation"},
                                                           {"SPILLWAY_BUDGET", "16MiB"},
                                                           {"SPILLWAY_TRACE", dir + "/t.jsonl"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(read_trace(dir + "/t.jsonl").kernels().size(), 8u * 200u * 2u);
}

TEST(Launch, RecordedTraceReplaysToTheSameFootprints) {
  std::string dir = temp_dir();
  RunResult r = run({kCli, "run", "--trace", dir + "/t.jsonl", "--", kPrograms + "/launches", "cycle", "2", "4"},
                    fake_env());
  ASSERT_EQ(r.status, 0) << describe(r);
  Trace t = read_trace(dir + "/t.jsonl");
  auto k = t.kernels();
  ASSERT_EQ(k.size(), 8u);
  std::vector<std::uint64_t> ids;
  for (const auto& e : t.events)
    if (e.value("ev", "") == "alloc") ids.push_back(e["id"].get<std::uint64_t>());
  ASSERT_EQ(ids.size(), 4u);
  for (std::size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(reads(k[i]), (std::set<std::vector<std::uint64_t>>{{ids[i % 4], 0, 0}})) << k[i].dump();
  }
  RunResult replay = run({kCli, "replay", dir + "/t.jsonl", "--policy", "demand", "--capacity", "0.5"}, {});
  ASSERT_EQ(replay.status, 0) << describe(replay);
  EXPECT_NE(replay.out.find("kernels 8,"), std::string::npos) << replay.out;
  EXPECT_NE(replay.out.find("peak footprint 32 MiB"), std::string::npos) << replay.out;
}

// SPILLWAY_TRACE reaches every process of a tree. Only a process that uses
// CUDA writes, and no two processes write one file.
TEST(Launch, TraceThroughAProcessTreeIsWrittenOnlyByProcessesThatUseCuda) {
  std::string dir = temp_dir();
  RunResult r = run({kCli, "run", "--trace", dir + "/t.jsonl.gz", "--", "timeout", "60", kPrograms + "/launches", "cycle",
                     "2", "4"},
                    fake_env());
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  RunResult replay = run({kCli, "replay", dir + "/t.jsonl.gz", "--policy", "demand", "--capacity", "0.5"}, {});
  ASSERT_EQ(replay.status, 0) << describe(replay);
  EXPECT_NE(replay.out.find("kernels 8,"), std::string::npos) << replay.out;

  // Two CUDA processes under one shell: the first takes the name, the second one of its own.
  std::string prog = kPrograms + "/launches cycle 2 4";
  RunResult two = run({kCli, "run", "--trace", dir + "/u.jsonl", "--", "sh", "-c", prog + " && " + prog}, fake_env());
  ASSERT_EQ(two.status, 0) << describe(two);
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("u.", 0) == 0) files.push_back(name);
  }
  ASSERT_EQ(files.size(), 2u) << two.err;
  for (const std::string& f : files) {
    EXPECT_EQ(read_trace(dir + "/" + f).kernels().size(), 8u) << f;
  }
  EXPECT_EQ(two.err_lines().size(), 1u) << two.err;
  EXPECT_NE(two.err.find("records its trace to"), std::string::npos) << two.err;
}

TEST(Launch, BadTracePathIsOneLineAndTheProgramRuns) {
  RunResult r = launches({"args"}, fake_env({{"SPILLWAY_TRACE", "/nonexistent-dir/t.jsonl"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("SPILLWAY_TRACE"), std::string::npos) << r.err;
  EXPECT_EQ(field(r.out, "ok"), "") ;
  EXPECT_NE(r.out.find("ok"), std::string::npos);
}

// The capture rule under the learned policy, which prefetches ahead of the launches it
// predicts: still nothing on the capturing stream.
TEST(Launch, NothingIsIssuedOnACapturingStreamUnderLearned) {
  std::string dir = temp_dir();
  RunResult r = launches({"capture"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"},
                                                {"FAKECUDA_LOG", dir + "/log"},
                                                {"SPILLWAY_POLICY", "learned"},
                                                {"SPILLWAY_BUDGET", "2MiB"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(r.err, "");
  std::string log = read_file(dir + "/log");
  for (const std::string& line : lines_with(log, "capturing=1")) {
    std::string fn = line.substr(0, line.find(' '));
    EXPECT_TRUE(fn == "cuLaunchKernel" || fn == "cuStreamEndCapture" || fn == "cuStreamIsCapturing" ||
                fn == "cuStreamGetCaptureInfo_v3")
        << "the shim issued on a capturing stream: " << line;
  }
  EXPECT_FALSE(lines_with(log, "cuMemPrefetchAsync_v2 ").empty()) << "learned issued nothing at all";
  EXPECT_EQ(read_trace(dir + "/t.jsonl").kernels().size(), 3u);
}

// Durations are sampled once per execution id (kernel + its pointers), and later launches of
// that id carry the measured duration: 8 blocks cycled 4 times are 8 ids. (Execution ids of
// one kernel on different blocks differ only in bits above the blocks' alignment.)
TEST(Launch, DurationsAreSampledOncePerExecutionId) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "4", "8"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"},
                                                        {"FAKECUDA_LOG", dir + "/log"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_EQ(lines_with(read_file(dir + "/log"), "cuEventElapsedTime_v2 ").size(), 8u);
  auto k = read_trace(dir + "/t.jsonl").kernels();
  ASSERT_EQ(k.size(), 32u);
  for (std::size_t i = 8; i < k.size(); ++i) EXPECT_GT(k[i].value("dur_ns", 0u), 0u) << i << ": " << k[i].dump();
}

// ---- the runtime's launches: cudaLaunchKernel, cudaLaunchKernelExC (+ _ptsz) ---------------
// tests/programs/runtime_launches makes four launches through the fake libcudart, which
// launches through the driver entry points it got from cuGetProcAddress (the shim's hooks).

RunResult runtime_launches(const std::vector<std::string>& args, const Env& env) {
  std::vector<std::string> argv{kPrograms + "/runtime_launches"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env);
}

// The driver launches the runtime made, in order (from FAKECUDA_LOG); " failed" appended
// to one that did not succeed.
std::vector<std::string> driver_launches(const std::string& log) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(log)) {
    if (line.rfind("cuLaunch", 0) != 0) continue;
    bool ok = line.size() >= 5 && line.compare(line.size() - 5, 5, " -> 0") == 0;
    out.push_back(line.substr(0, line.find(' ')) + (ok ? "" : " failed"));
  }
  return out;
}

const std::vector<std::string> kRuntimeDriverLaunches{"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel_ptsz",
                                                      "cuLaunchKernelEx_ptsz"};

TEST(RuntimeLaunch, EachLaunchIsObservedOnceWithItsFootprint) {
  std::string dir = temp_dir();
  RunResult r = runtime_launches({}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"},
                                               {"FAKECUDA_LOG", dir + "/log"},
                                               {"SPILLWAY_LOG", "debug"}}));
  ASSERT_EQ(r.status, 0) << describe(r);  // the program checked its data
  std::string log = read_file(dir + "/log");
  EXPECT_EQ(driver_launches(log), kRuntimeDriverLaunches);
  // The shim mapped the stubs to their CUfunctions and read their layouts.
  EXPECT_NE(r.err.find("cudaGetFuncBySymbol found"), std::string::npos) << r.err;
  EXPECT_FALSE(lines_with(log, "cuFuncGetParamInfo ").empty());
  std::uint64_t a = hex(field(r.out, "A")), b = hex(field(r.out, "B")), c = hex(field(r.out, "C"));
  Trace t = read_trace(dir + "/t.jsonl");
  ASSERT_EQ(t.id_of_addr.count(a) + t.id_of_addr.count(b) + t.id_of_addr.count(c), 3u);
  std::uint64_t ia = t.id_of_addr[a], ib = t.id_of_addr[b], ic = t.id_of_addr[c];
  auto k = t.kernels();
  // Four, not eight: the driver launch under each runtime launch is not observed again.
  ASSERT_EQ(k.size(), 4u) << read_file(dir + "/t.jsonl");
  using R = std::set<std::vector<std::uint64_t>>;
  EXPECT_EQ(reads(k[0]), (R{{ia, 0, 0}})) << k[0].dump();                  // cudaLaunchKernel
  EXPECT_EQ(reads(k[1]), (R{{ic, 0, 0}, {ia, 0, 0}})) << k[1].dump();      // cudaLaunchKernelExC
  EXPECT_EQ(reads(k[2]), (R{{ib, 0, 0}})) << k[2].dump();                  // cudaLaunchKernel_ptsz
  EXPECT_EQ(reads(k[3]), (R{{ib, 2u << 20, 4u << 20}})) << k[3].dump();    // cudaLaunchKernelExC_ptsz, by-value struct
  EXPECT_EQ(k[0]["name"], k[2]["name"]);  // one kernel (fill_u32) through both forms
}

// Without a CUfunction for the stub (cudaGetFuncBySymbol fails, or the runtime has none) the
// shim still observes each runtime launch once, with an empty footprint (the args array's
// length is unknown), and the program runs unchanged.
class RuntimeLaunchFallback : public ::testing::TestWithParam<bool> {};

TEST_P(RuntimeLaunchFallback, EachLaunchIsObservedOnceWithoutAFootprint) {
  bool absent = GetParam();
  std::string dir = temp_dir();
  Env env = fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"}, {"FAKECUDA_LOG", dir + "/log"}, {"SPILLWAY_LOG", "debug"}});
  if (absent) env["LD_LIBRARY_PATH"] = kFakeDir + "/no-get-func:" + kFakeDir;
  RunResult r = runtime_launches(absent ? std::vector<std::string>{} : std::vector<std::string>{"--unresolvable"}, env);
  ASSERT_EQ(r.status, 0) << describe(r);
  EXPECT_NE(r.err.find(absent ? "cudaGetFuncBySymbol missing" : "cudaGetFuncBySymbol failed"), std::string::npos)
      << r.err;
  EXPECT_EQ(driver_launches(read_file(dir + "/log")), kRuntimeDriverLaunches);
  auto k = read_trace(dir + "/t.jsonl").kernels();
  ASSERT_EQ(k.size(), 4u) << read_file(dir + "/t.jsonl");
  for (const auto& e : k) EXPECT_TRUE(e.value("reads", nlohmann::json::array()).empty()) << e.dump();
}

INSTANTIATE_TEST_SUITE_P(GetFuncBySymbol, RuntimeLaunchFallback, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Absent" : "Fails"; });


// ---- SPILLWAY_TRACE_WINDOW ------------------------------------------------
// `cycle 6 8`: 8 blocks of 8 MiB allocated, 48 launches (each block filled 6 times), freed.

// Every kernel's blocks have their alloc before it, and no block is freed twice or used
// after its free: what the trace reader checks (`spillway replay` reads the whole file).
void expect_replayable(const std::string& path) {
  RunResult r = run({kCli, "replay", path, "--policy", "demand", "--capacity", "0.5"}, Env{});
  EXPECT_EQ(r.status, 0) << path << "\n" << describe(r);
}

TEST(TraceWindow, AfterAWarmUpTheNextLaunchesAreWrittenWithTheBlocksLiveThen) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "6", "8"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"}, {"SPILLWAY_TRACE_WINDOW", "10+12"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  Trace t = read_trace(dir + "/t.jsonl");
  ASSERT_TRUE(t.header.contains("window")) << t.header.dump();
  EXPECT_EQ(t.header["window"]["mode"], "after-warmup");
  EXPECT_EQ(t.header["window"]["first_launch"], 10);
  EXPECT_EQ(t.header["window"]["left_out_launches"], 10);
  auto k = t.kernels();
  ASSERT_EQ(k.size(), 12u);
  // The 8 blocks come first, then launches 10..21, and nothing after: the frees at the end
  // of the program are outside the window.
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(t.events[i].value("ev", ""), "alloc") << i;
  EXPECT_EQ(t.events.size(), 8u + 12u);
  // Launch 10 fills block 10 % 8 = 2.
  EXPECT_EQ(k[0]["reads"][0].is_array() ? k[0]["reads"][0][0] : k[0]["reads"][0], t.events[2]["id"]);
  expect_replayable(dir + "/t.jsonl");
}

TEST(TraceWindow, TheLastLaunchesAreWrittenAtExitInZstd) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "6", "8"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl.zst"}, {"SPILLWAY_TRACE_WINDOW", "last:20"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  std::string bytes = read_file(dir + "/t.jsonl.zst");
  ASSERT_GE(bytes.size(), 4u);
  EXPECT_EQ(bytes.substr(0, 4), std::string("\x28\xb5\x2f\xfd", 4)) << "not zstd";
  // Decompressed by the CLI's reader: replayable, and `spillway replay` prints nothing wrong.
  expect_replayable(dir + "/t.jsonl.zst");
}

TEST(TraceWindow, TheLastLaunchesKeepTheirBlocksAllocationsAndTheFreesAfterThem) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "6", "8"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"}, {"SPILLWAY_TRACE_WINDOW", "last:20"}}));
  ASSERT_EQ(r.status, 0) << describe(r);
  Trace t = read_trace(dir + "/t.jsonl");
  ASSERT_TRUE(t.header.contains("window")) << t.header.dump();
  EXPECT_EQ(t.header["window"]["mode"], "last");
  EXPECT_EQ(t.header["window"]["first_launch"], 28);
  EXPECT_EQ(t.header["window"]["left_out_launches"], 28);
  EXPECT_EQ(t.kernels().size(), 20u);
  std::size_t allocs = 0, frees = 0;
  for (const auto& e : t.events) {
    allocs += e.value("ev", "") == "alloc";
    frees += e.value("ev", "") == "free";
  }
  EXPECT_EQ(allocs, 8u);
  EXPECT_EQ(frees, 8u);
  expect_replayable(dir + "/t.jsonl");
}

TEST(TraceWindow, ABadWindowIsOneLineNamingTheVariable) {
  std::string dir = temp_dir();
  RunResult r = launches({"cycle", "1", "2"}, fake_env({{"SPILLWAY_TRACE", dir + "/t.jsonl"}, {"SPILLWAY_TRACE_WINDOW", "last:0"}}));
  EXPECT_EQ(r.status, 0) << describe(r);
  EXPECT_NE(r.err.find("SPILLWAY_TRACE_WINDOW"), std::string::npos) << r.err;
}

// PyTorch's allocator trace under --framework-allocator keep (interpose/torch_tracker.h),
// against the fake libc10_cuda.so laid out as torch 2.5's: the tracker attaches and the
// launch of a tensor in a segment's middle gets the tensor's extent, not the scan's 64 MiB.
struct TorchRun {
  RunResult r;
  nlohmann::json report;
  Trace trace;
};

TorchRun run_torch_trace(const std::string& lib, const std::string& mode, Env extra = {}) {
  const std::string dir = temp_dir();
  extra.emplace("SPILLWAY_FRAMEWORK_ALLOCATOR", "keep");
  extra["SPILLWAY_REPORT"] = dir + "/report.json";
  extra["SPILLWAY_TRACE"] = dir + "/t.jsonl";
  extra["SPILLWAY_LOG"] = "info";
  TorchRun t;
  t.r = run({kPrograms + "/torch_trace", lib, mode}, fake_env(extra));
  if (t.r.status == 0) {
    t.report = nlohmann::json::parse(read_file(dir + "/report.json"));
    t.trace = read_trace(dir + "/t.jsonl");
  }
  return t;
}

// The one kernel's read of the segment: (id, offset, bytes).
std::vector<std::uint64_t> segment_read(const TorchRun& t) {
  const std::uint64_t seg = hex(field(t.r.out, "SEG"));
  auto k = t.trace.kernels();
  if (k.size() != 1 || !t.trace.id_of_addr.count(seg)) return {};
  auto r = reads(k[0]);
  return r.size() == 1 ? *r.begin() : std::vector<std::uint64_t>{};
}

// A copy of the fake in dir/torch/lib with a torch/version.py of `version`.
std::string fake_torch_copy(const std::string& version) {
  const std::string dir = temp_dir();
  std::filesystem::create_directories(dir + "/torch/lib");
  std::filesystem::copy_file(FAKE_C10_CUDA_LIB, dir + "/torch/lib/libc10_cuda.so");
  std::ofstream(dir + "/torch/version.py") << "__version__ = '" << version << "'\n";
  return dir + "/torch/lib/libc10_cuda.so";
}

constexpr std::uint64_t kMiB = 1ull << 20;

TEST(TorchTrace, KeepFollowsTheCachingAllocatorsTensors) {
  TorchRun t = run_torch_trace(FAKE_C10_CUDA_LIB, "follow");
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  EXPECT_EQ(lines_with(t.r.err, "PyTorch's allocator trace: attached: torch 2.5").size(), 1u) << t.r.err;
  const nlohmann::json& f = t.report["framework_trace"];
  EXPECT_EQ(f["state"], "attached: torch 2.5");
  EXPECT_EQ(f["extents_from"], "allocator trace");
  EXPECT_EQ(f["tensor_allocs"], 4) << "A, B, C and the small segment's tensor";
  EXPECT_EQ(f["live_tensors"], 1) << "A: B and C were freed (C once its events completed)";
  EXPECT_EQ(f["segments"], 1) << "the small segment was released";
  EXPECT_EQ(f["events_refused"], 0);
  const std::uint64_t seg = hex(field(t.r.out, "SEG"));
  EXPECT_EQ(segment_read(t), (std::vector<std::uint64_t>{t.trace.id_of_addr.at(seg), 100 * kMiB, 10 * kMiB}))
      << "the tensor's 10 MiB";
}

TEST(TorchTrace, AVersionNotCheckedIsRefusedWithOneLineAndTheScanStays) {
  TorchRun t = run_torch_trace(fake_torch_copy("2.1.2+cu121"), "follow");
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  const std::string why = "off: torch 2.1 is not a version whose trace layout was checked (2.2 to 2.15)";
  EXPECT_EQ(lines_with(t.r.err, "PyTorch's allocator trace: " + why).size(), 1u) << t.r.err;
  EXPECT_EQ(t.report["framework_trace"]["state"], why);
  EXPECT_EQ(t.report["framework_trace"]["extents_from"], "argument scan") << "the fake driver gives no fault feedback";
  EXPECT_EQ(t.report["framework_trace"]["tensor_allocs"], 0);
  const std::uint64_t seg = hex(field(t.r.out, "SEG"));
  EXPECT_EQ(segment_read(t), (std::vector<std::uint64_t>{t.trace.id_of_addr.at(seg), 100 * kMiB, 64 * kMiB}))
      << "a pointer into the segment's middle: the scan's 64 MiB";
}

TEST(TorchTrace, AnAllocatorWithoutItsSymbolTableIsRefused) {
  const std::string lib = fake_torch_copy("2.5.1");
  if (std::system(("objcopy --strip-all " + lib + " 2>/dev/null").c_str()) != 0) GTEST_SKIP() << "no objcopy";
  TorchRun t = run_torch_trace(lib, "follow");
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  EXPECT_TRUE(t.report["framework_trace"]["state"].get<std::string>().starts_with(
      "off: the CUDA allocator is not torch 2.5's native caching allocator as its symbol table shows it"))
      << t.report["framework_trace"];
  EXPECT_EQ(t.report["framework_trace"]["tensor_allocs"], 0);
}

TEST(TorchTrace, AVtableNotLaidOutAsTheVersionSaysIsRefusedBeforeAnyCall) {
  // The fake is laid out as 2.5 (attach at 240); 2.6 puts it at 280: the entry there is not
  // the native allocator's attachAllocatorTraceTracker.
  TorchRun t = run_torch_trace(fake_torch_copy("2.6.0"), "follow");
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  EXPECT_TRUE(t.report["framework_trace"]["state"].get<std::string>().starts_with(
      "off: the CUDA allocator is not torch 2.6's native caching allocator"))
      << t.report["framework_trace"];
  EXPECT_EQ(t.report["framework_trace"]["tensor_allocs"], 0);
  EXPECT_EQ(t.report["framework_trace"]["extents_from"], "argument scan");
}

TEST(TorchTrace, AnAllocatorNotInitializedIsNotAttachedYet) {
  TorchRun t = run_torch_trace(FAKE_C10_CUDA_LIB, "uninit");
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  EXPECT_EQ(t.report["framework_trace"]["state"], "off so far: PyTorch's CUDA allocator is not initialized (2 tries)")
      << "the segment's allocation and the launch";
  EXPECT_EQ(t.report["framework_trace"]["tensor_allocs"], 0);
  EXPECT_EQ(t.report["framework_trace"]["extents_from"], "argument scan");
}

// With several devices the attach never happens inside an allocation (it would take every
// device allocator's lock while PyTorch holds one): it waits for the first launch, so the
// tensors allocated before it are not followed, and their frees are refused, counted.
TEST(TorchTrace, SeveralDevicesAttachAtALaunchNotInsideTheAllocator) {
  TorchRun t = run_torch_trace(FAKE_C10_CUDA_LIB, "follow", {{"FAKECUDA_DEVICES", "2"}});
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  const nlohmann::json& f = t.report["framework_trace"];
  EXPECT_EQ(f["state"], "attached: torch 2.5");
  EXPECT_EQ(f["tensor_allocs"], 1) << "only the small segment's tensor, after the launch";
  EXPECT_EQ(f["events_refused"], 2) << "B's and C's frees: their allocations came before the attach";
  const std::uint64_t seg = hex(field(t.r.out, "SEG"));
  EXPECT_EQ(segment_read(t), (std::vector<std::uint64_t>{t.trace.id_of_addr.at(seg), 100 * kMiB, 64 * kMiB}))
      << "the launch that attached was planned with the scan's extent";
}

TEST(TorchTrace, PerTensorModeFollowsNothing) {
  TorchRun t = run_torch_trace(FAKE_C10_CUDA_LIB, "follow", {{"SPILLWAY_FRAMEWORK_ALLOCATOR", "per-tensor"}});
  ASSERT_EQ(t.r.status, 0) << describe(t.r);
  EXPECT_TRUE(lines_with(t.r.err, "PyTorch's allocator trace").empty()) << t.r.err;
  EXPECT_EQ(t.report["framework_trace"]["extents_from"], "per-tensor");
  EXPECT_EQ(t.report["framework_trace"]["tensor_allocs"], 0);
}

}  // namespace
}  // namespace spillway::test
