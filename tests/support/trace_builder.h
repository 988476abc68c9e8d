// Traces built in memory for the simulator tests (trace format v1 events, as the reader
// would produce them), and the slow link those tests reason in whole milliseconds with.
#pragma once

#include <cstdint>
#include <map>
#include <random>
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
    std::vector<trace::Range> r, w;
    for (auto id : reads) r.push_back(trace::Range{id, 0, live.at(id), true});
    for (auto id : writes) w.push_back(trace::Range{id, 0, live.at(id), true});
    return event(name, dur, std::move(r), std::move(w));
  }
  // A kernel reading parts of blocks.
  Builder& kernel_ranges(const std::string& name, std::uint64_t dur, std::vector<trace::Range> reads) {
    return event(name, dur, std::move(reads), {});
  }
  // A kernel (or, with `host`, a host event: the CPU) reading and writing parts of blocks.
  Builder& event(const std::string& name, std::uint64_t dur, std::vector<trace::Range> reads, std::vector<trace::Range> writes,
                 bool host = false) {
    trace::Event e;
    e.kind = host ? trace::EventKind::host : trace::EventKind::kernel;
    if (!host) {
      e.name = name;
      e.dur_ns = dur;
    }
    e.reads = std::move(reads);
    e.writes = std::move(writes);
    t.events.push_back(e);
    return *this;
  }
  Builder& iteration(std::uint64_t n) {
    trace::Event e;
    e.kind = trace::EventKind::iter;
    e.n = n;
    t.events.push_back(e);
    return *this;
  }
  CompiledTrace compile() const { return sim::compile(t); }
};

// A training-like loop: weights persist; each iteration allocates activations in forward
// order, reads them back in reverse in backward, frees them.
inline CompiledTrace training_loop(int iterations, int layers, std::uint64_t act_bytes, std::uint64_t weight_bytes) {
  Builder b;
  std::uint64_t id = 0;
  std::vector<std::uint64_t> weights;
  for (int l = 0; l < layers; ++l) {
    b.alloc(++id, weight_bytes);
    weights.push_back(id);
  }
  for (int it = 0; it < iterations; ++it) {
    std::vector<std::uint64_t> acts;
    for (int l = 0; l < layers; ++l) {
      b.alloc(++id, act_bytes);
      std::vector<std::uint64_t> in{weights[l]};
      if (!acts.empty()) in.push_back(acts.back());
      b.kernel("fwd" + std::to_string(l), 2 * kMs, in, {id});
      acts.push_back(id);
    }
    for (int l = layers - 1; l >= 0; --l) {
      b.kernel("bwd" + std::to_string(l), 3 * kMs, {weights[l], acts[l]}, {weights[l]});
      b.free(acts[l]);
    }
  }
  return b.compile();
}

// The shape of a seeded random trace: per step, with `what` = rng() % 10, a block is
// allocated when what < alloc_below or fewer than min_live are live (1 to max_chunks chunks'
// worth of bytes), freed when what < free_below and more than min_live are live, else a
// kernel ("k0".."k<names-1>", 1 us to 2 ms) touches 1 to max_ranges random parts of live
// blocks, each read or written. Sub-chunk and multi-chunk blocks, partial ranges.
struct RandomShape {
  int steps;
  int alloc_below, free_below;
  std::size_t min_live;
  std::uint64_t max_chunks;
  int names, max_ranges;
};

inline Builder random_trace(std::uint64_t seed, const RandomShape& shape) {
  std::mt19937_64 rng(seed);
  Builder b;
  std::vector<std::uint64_t> live;
  std::uint64_t next = 1;
  for (int step = 0; step < shape.steps; ++step) {
    int what = static_cast<int>(rng() % 10);
    if (what < shape.alloc_below || live.size() < shape.min_live) {
      b.alloc(next, 1 + rng() % (shape.max_chunks * kChunkBytes));
      live.push_back(next++);
    } else if (what < shape.free_below && live.size() > shape.min_live) {
      std::size_t i = rng() % live.size();
      b.free(live[i]);
      live.erase(live.begin() + static_cast<long>(i));
    } else {
      trace::Event e;
      e.kind = trace::EventKind::kernel;
      e.name = "k" + std::to_string(rng() % static_cast<std::uint64_t>(shape.names));
      e.dur_ns = 1000 + rng() % (2 * kMs);
      int n = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(shape.max_ranges));
      for (int j = 0; j < n; ++j) {
        std::uint64_t id = live[rng() % live.size()];
        std::uint64_t bytes = b.live.at(id);
        std::uint64_t off = rng() % bytes;
        trace::Range r{id, off, 1 + rng() % (bytes - off), false};
        (rng() % 2 ? e.reads : e.writes).push_back(r);
      }
      b.t.events.push_back(e);
    }
  }
  return b;
}

// A link that moves one 2 MiB chunk per ms each way, 10 us per fault batch, faults 2x slower,
// with a GPU of `capacity_chunks` chunks.
inline SimParams slow_link(std::uint64_t capacity_chunks) {
  SimParams p = default_params();
  p.link = LinkProfile{};
  p.link.name = "test";
  p.link.h2d_bytes_per_s = p.link.d2h_bytes_per_s = 2097152e3;
  p.link.fault_batch_ns = 10'000;
  p.fault_slowdown = 2.0;
  p.capacity_bytes = capacity_chunks * kChunkBytes;
  return p;
}

}  // namespace spillway::sim::testing
