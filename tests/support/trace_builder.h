// Traces built in memory for the simulator tests (trace format v1 events, as the reader
// would produce them), and the slow link those tests reason in whole milliseconds with.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "spillway/sim/compiled_trace.h"
#include "spillway/sim/params.h"
#include "spillway/trace.h"

namespace spillway::sim::testing {

inline constexpr std::uint64_t kMs = 1'000'000;  // ns

struct Builder {
  trace::Trace t;
  std::map<std::uint64_t, std::uint64_t> live;  // id -> bytes of the live blocks
  explicit Builder(std::string path = "test.jsonl") { t.path = std::move(path); }
  Builder& alloc(std::uint64_t id, std::uint64_t bytes) {
    trace::Event e;
    e.kind = trace::EventKind::alloc;
    e.id = id;
    e.bytes = bytes;
    live[id] = bytes;
    t.events.push_back(e);
    return *this;
  }
  Builder& free(std::uint64_t id) {
    trace::Event e;
    e.kind = trace::EventKind::free;
    e.id = id;
    live.erase(id);
    t.events.push_back(e);
    return *this;
  }
  // A kernel reading and writing whole live blocks.
  Builder& kernel(const std::string& name, std::uint64_t dur, std::vector<std::uint64_t> reads,
                  std::vector<std::uint64_t> writes = {}) {
    trace::Event e;
    e.kind = trace::EventKind::kernel;
    e.name = name;
    e.dur_ns = dur;
    for (auto id : reads) e.reads.push_back(trace::Range{id, 0, live.at(id), true});
    for (auto id : writes) e.writes.push_back(trace::Range{id, 0, live.at(id), true});
    t.events.push_back(e);
    return *this;
  }
  // A kernel reading parts of blocks.
  Builder& kernel_ranges(const std::string& name, std::uint64_t dur, std::vector<trace::Range> reads) {
    trace::Event e;
    e.kind = trace::EventKind::kernel;
    e.name = name;
    e.dur_ns = dur;
    e.reads = std::move(reads);
    t.events.push_back(e);
    return *this;
  }
  CompiledTrace compile() const { return sim::compile(t); }
};

// A link that moves one 2 MiB chunk per ms each way, 10 us per fault batch, faults 2x slower,
// with a GPU of `capacity_chunks` chunks.
inline SimParams slow_link(std::uint64_t capacity_chunks) {
  SimParams p = default_params();
  p.link = LinkProfile{"test", 2097152e3, 2097152e3, 10'000, "test"};
  p.fault_slowdown = 2.0;
  p.capacity_bytes = capacity_chunks * kChunkBytes;
  return p;
}

}  // namespace spillway::sim::testing
