// The Engine's launch path (engine.h, Engine::launch; docs/design.md, "One launch"): the
// launch's plan under the planning lock, then its moves in plan order, outside it.
#include <algorithm>
#include <chrono>
#include <cstdint>

#include "spillway/engine.h"
#include "spillway/log.h"
#include "device_plan.h"
#include "engine_actions.h"

namespace spillway {
namespace {

// fn(chunk) for each 2 MiB chunk [addr, addr + bytes) touches, until fn returns false.
template <class Fn>
void for_chunks(std::uint64_t addr, std::uint64_t bytes, Fn&& fn) {
  if (bytes == 0) return;
  for (ChunkIndex c = chunk_of(addr), last = chunk_of(addr + bytes - 1); c <= last; ++c) {
    if (!fn(c)) return;
  }
}

}  // namespace

Result Engine::send(Backend& backend, const Action& a, int device) {
  return a.kind == Action::Kind::prefetch ? backend.prefetch(a.addr, a.bytes, a.where, device)
                                          : backend.advise(a.addr, a.bytes, a.advice, a.where, device);
}

void Engine::send_checked(const Action& a, int device, DevicePlan* plan) {
  // One call per live block the range overlaps, clipped to it: nothing of a block freed
  // meanwhile, nothing outside blocks.
  const std::uint64_t end = a.addr + a.bytes < a.addr ? ~0ull : a.addr + a.bytes;
  for (std::uint64_t addr = a.addr; addr < end;) {
    Action piece = a;
    Result r;
    {
      ReleaseGate::IssueSection section(gate_);
      std::optional<Block> b = table_.first_overlapping(addr, end);
      if (!b) return;
      piece.addr = std::max(addr, b->base);
      piece.bytes = std::min(end, b->end()) - piece.addr;
      r = send(backend_, piece, device);
    }
    count_action(plan, piece, r);
    addr = piece.addr + piece.bytes;
  }
}

void Engine::count_move(DevicePlan& plan, Location to, std::uint64_t bytes, const Result& r) {
  if (!r.ok()) {
    ++counters_.backend_errors;
  } else if (to == Location::gpu) {
    plan.counters.prefetch_to_gpu_bytes += bytes;
    plan.counters.h2d_calls.add(bytes);
  } else {
    plan.counters.evict_to_cpu_bytes += bytes;
    plan.counters.d2h_calls.add(bytes);
  }
}

void Engine::count_action(DevicePlan* plan, const Action& a, const Result& r) {
  std::lock_guard lock(mutex_);
  if (!r.ok() || a.kind != Action::Kind::advise) {
    if (plan != nullptr) count_move(*plan, a.where, a.bytes, r);
    else if (!r.ok()) ++counters_.backend_errors;
    return;
  }
  ++counters_.advise_calls;
}

bool Engine::make_room(DevicePlan& plan, std::vector<Move>& moves) {
  const std::uint64_t budget_chunks = plan.budget() / kChunkBytes;
  ResidencyPlan& r = plan.residency;
  while (r.size() >= budget_chunks) {
    ChunkIndex victim = 0;
    bool ok = plan.policy->choose_victim(r, &victim) && r.contains(victim) && !r.pinned(victim);
    if (!ok && !r.lru_unpinned(&victim)) return false;
    plan_eviction(plan, victim, moves);
  }
  return true;
}

void Engine::plan_eviction(DevicePlan& plan, ChunkIndex c, std::vector<Move>& moves) {
  Move m{c, Location::cpu};
  plan.residency.erase(c, &m.base, &m.end);
  plan.policy->on_residency(c, false);
  moves.push_back(m);
  ++plan.counters.evicted_chunks;
}

void Engine::leave_other_plans(const DevicePlan& plan, ChunkIndex c) {
  if (plans_.count() < 2) return;
  // (A chunk held there — that device's launch in flight is about to use it — stays in its
  // plan: both count it until that launch ends, and its holds stay with its own node.)
  plans_.for_each([&](DevicePlan& p) {
    if (&p != &plan && !p.residency.held(c) && p.residency.erase(c)) p.policy->on_residency(c, false);
  });
}

void Engine::plan_launch(DevicePlan& plan, const Launch& launch, const EngineActions& actions, std::vector<Move>& moves,
                         std::vector<ChunkIndex>* held) {
  ++plan.residency.epoch;
  pin_footprint(plan, launch, held);
  plan_policy_evictions(plan, actions, moves);
  // The missing footprint, then the Policy's prefetches, in order of need. Each chunk's
  // block is looked up here, once: its moves, in and later out, then need no look-up to be
  // clipped to it.
  const AllocationTable::Reader table(table_);  // (no allocation, free or driver call below)
  fetch_missing(plan, launch, table, moves, held);
  fetch_policy_prefetches(plan, actions, table, moves);
  group_by_direction(moves);
}

void Engine::group_by_direction(std::vector<Move>& moves) {
  // make_room interleaves an eviction with each fetch, so neither direction's chunks are ever
  // adjacent in the list and run_end merges nothing: every call moves one 2 MiB chunk, the
  // shape that never pipelines in the driver (UvmMigrate in nvidia-uvm's uvm_migrate.c walks
  // one VA block at a time and overlaps copy and map only within a call that spans several;
  // docs/design.md, "One launch"). Evictions first, then fetches, each in plan order, lets
  // adjacent chunks form one call. The plan's outcome is unchanged: a chunk fetched by this
  // plan is pinned and never its victim, so no fetch precedes an eviction of the same chunk,
  // and an eviction followed by a fetch of one chunk keeps that order; the budget holds at
  // every step, since all the room is made before anything arrives.
  std::stable_partition(moves.begin(), moves.end(), [](const Move& m) { return m.to == Location::cpu; });
  // A ranking that takes the furthest predicted use first gives a tie's chunks highest index
  // first (learned's (next use, chunk) order): such a descending stretch of one block is
  // turned around, so that run_end finds it as one run. Its chunks all move the same way
  // before anything arrives, so their order among themselves changes nothing else.
  for (std::size_t i = 0; i < moves.size();) {
    std::size_t j = i + 1;
    while (j < moves.size() && moves[j].to == moves[i].to && moves[j].chunk + 1 == moves[j - 1].chunk &&
           moves[j].base == moves[i].base && moves[j].end == moves[i].end) {
      ++j;
    }
    std::reverse(moves.begin() + static_cast<std::ptrdiff_t>(i), moves.begin() + static_cast<std::ptrdiff_t>(j));
    i = j;
  }
}

void Engine::pin_footprint(DevicePlan& plan, const Launch& launch, std::vector<ChunkIndex>* held) {
  // What the launch touches and is resident is pinned (held too, for a launch in flight);
  // the rest is missing, with its access's index.
  const bool hold = held != nullptr;
  plan.missing.clear();
  for (std::size_t i = 0; i < launch.accesses.size(); ++i) {
    for_chunks(launch.accesses[i].addr, launch.accesses[i].bytes, [&](ChunkIndex c) {
      if (!plan.residency.touch_pin(c, hold)) plan.missing.emplace_back(c, i);
      else if (hold) held->push_back(c);
      return true;
    });
  }
}

void Engine::plan_policy_evictions(DevicePlan& plan, const EngineActions& actions, std::vector<Move>& moves) {
  for (const Action& a : actions.list) {
    if (a.kind != Action::Kind::prefetch || a.where != Location::cpu) continue;
    for_chunks(a.addr, a.bytes, [&](ChunkIndex c) {
      if (plan.residency.contains(c) && !plan.residency.pinned(c)) plan_eviction(plan, c, moves);
      return true;
    });
  }
}

bool Engine::fetch_chunk(DevicePlan& plan, ChunkIndex c, const Block* block, bool hold, std::vector<Move>& moves) {
  ResidencyPlan& r = plan.residency;
  if (r.touch_pin(c, hold)) return true;
  if (!make_room(plan, moves)) {
    ++plan.counters.dropped_prefetch_chunks;
    return false;
  }
  Move m{c, Location::gpu};
  if (block != nullptr) {
    m.base = block->base;
    m.end = block->end();
  }
  leave_other_plans(plan, c);
  r.insert_pinned(c, m.base, m.end, hold);
  plan.policy->on_residency(c, true);
  moves.push_back(m);
  ++plan.counters.prefetched_chunks;
  return true;
}

void Engine::fetch_missing(DevicePlan& plan, const Launch& launch, const AllocationTable::Reader& table,
                           std::vector<Move>& moves, std::vector<ChunkIndex>* held) {
  // A chunk the Policy leaves where it is (it advised remote access for it) is not fetched.
  // When one of an access's chunks finds no room, the rest of that access is not tried.
  const bool hold = held != nullptr;
  std::size_t failed = SIZE_MAX;
  std::optional<Block> b;  // the last block found: an access's missing chunks are mostly one block's
  for (const auto& [c, access] : plan.missing) {
    if (access == failed) continue;
    // (touch_pin: a chunk may appear twice)
    if (!plan.residency.touch_pin(c, hold)) {
      if (plan.policy->leave_remote(c)) continue;
      const std::uint64_t addr = std::max(launch.accesses[access].addr, c * kChunkBytes);
      if (!b || !b->contains(addr)) b = table.find(addr);
      if (!fetch_chunk(plan, c, b ? &*b : nullptr, hold, moves)) {
        failed = access;
        continue;
      }
    }
    if (hold) held->push_back(c);
  }
}

void Engine::fetch_policy_prefetches(DevicePlan& plan, const EngineActions& actions, const AllocationTable::Reader& table,
                                     std::vector<Move>& moves) {
  for (const Action& a : actions.list) {
    if (a.kind != Action::Kind::prefetch || a.where != Location::gpu) continue;
    std::optional<Block> b = table.find(a.addr);
    if (!b || a.bytes == 0 || a.bytes > b->end() - a.addr) continue;  // not inside one live block
    bool room = true;
    for_chunks(a.addr, a.bytes, [&](ChunkIndex c) { return room = fetch_chunk(plan, c, &*b, false, moves); });
    if (!room) break;
  }
}

namespace {

// The end of the run of moves that starts at moves[i]: adjacent chunks moving the same way.
// Where blocks cannot share a call (`across_blocks` false: each block its own allocation), the
// run is cut where the block its moves know changes (it would be cut there anyway), so that a
// run whose block is known needs no table look-up; otherwise move_pieces joins what it may.
template <class Moves>
std::size_t run_end(const Moves& moves, std::size_t i, bool across_blocks) {
  std::size_t j = i + 1;
  const bool one_block = moves[i].end > moves[i].base;  // every move of the run knows the same block
  while (j < moves.size() && moves[j].to == moves[i].to && moves[j].chunk == moves[j - 1].chunk + 1 &&
         (across_blocks || (one_block ? moves[j].base == moves[i].base && moves[j].end == moves[i].end
                                      : moves[j].end <= moves[j].base))) {
    ++j;
  }
  return j;
}

}  // namespace

void Engine::carry_out(DevicePlan& plan, const EngineActions& actions, const std::vector<Move>& moves, bool planned,
                       std::uint64_t frees_at_plan) {
  for (const Action& a : actions.list) {
    if (planned && a.kind == Action::Kind::prefetch) continue;  // went through the plan
    send_checked(a, plan.device, &plan);
  }
  // Runs of adjacent chunks moving the same way become one Backend call, clipped to the
  // block that holds them (run_end, move_run).
  // An eviction that finds its block freed since the plan was made moves nothing, yet the
  // plan counted its room: the data leaves the GPU only when that free's discard (or the
  // driver's free) is issued. The fetches after it wait for the frees in progress to finish
  // (at most 20 ms: a driver free that synchronises the device must not stall the plans
  // queued behind this one past their own wait), so they never land on a GPU still holding
  // the dead data, where the driver would evict something else — live data — to make room.
  // (Host-side order: with the driver's asynchronous copies, the shim's GPU stream also
  // waits for its host stream after evictions and discards: cuda_backend.h.)
  // The fetches go out together (FetchBatch), after the evictions, each issued as it comes.
  std::uint64_t await_frees = 0;  // frees_started() when such an eviction was dropped
  const bool across_blocks = blocks_share_ranges();
  FetchBatch batch;
  for (std::size_t i = 0, j = 0; i < moves.size(); i = j) {
    if (moves[i].to == Location::gpu) {
      if (await_frees != 0) {
        flush_fetches(plan, batch);  // (never wait inside a section: the frees wait for it)
        gate_.wait_for_frees(await_frees, std::chrono::milliseconds(20));
        await_frees = 0;
      }
      if (!batch.section) batch.section.emplace(gate_);  // before move_run checks the table
    } else {
      flush_fetches(plan, batch);
    }
    j = run_end(moves, i, across_blocks);
    if (const std::uint64_t frees = move_run(plan, moves, i, j, frees_at_plan, batch); frees != 0) await_frees = frees;
  }
  flush_fetches(plan, batch);
}

void Engine::issue_move(DevicePlan& plan, Location to, std::uint64_t addr, std::uint64_t bytes, FetchBatch& batch) {
  if (to == Location::gpu && batch.section) {
    batch.addrs[batch.count] = addr;
    batch.bytes[batch.count] = bytes;
    if (++batch.count == kMaxFetchBatch) {
      // Full: issued now, within the same section. (The walk may have checked the next
      // call's block already: a section entered now would not cover that check.)
      flush_fetches(plan, batch, true);
    }
    return;
  }
  flush_fetches(plan, batch);
  Result r = backend_.prefetch(addr, bytes, to, plan.device);
  std::lock_guard lock(mutex_);
  count_move(plan, to, bytes, r);
}

void Engine::flush_fetches(DevicePlan& plan, FetchBatch& batch, bool keep_section) {
  if (batch.count > 1 && backend_.can_batch_prefetches()) {
    Result r = backend_.prefetch_batch(batch.addrs.data(), batch.bytes.data(), batch.count, Location::gpu, plan.device);
    std::lock_guard lock(mutex_);
    if (r.ok()) {
      ++plan.counters.h2d_batches;
      plan.counters.h2d_batched_ranges += batch.count;
      for (std::size_t k = 0; k < batch.count; ++k) count_move(plan, Location::gpu, batch.bytes[k], r);
      batch.count = 0;
    } else {
      ++counters_.backend_errors;  // refused as a whole: the ranges one by one below
    }
  }
  for (std::size_t k = 0; k < batch.count; ++k) {
    Result r = backend_.prefetch(batch.addrs[k], batch.bytes[k], Location::gpu, plan.device);
    std::lock_guard lock(mutex_);
    count_move(plan, Location::gpu, batch.bytes[k], r);
  }
  batch.count = 0;
  if (!keep_section) batch.section.reset();
}

std::uint64_t Engine::move_run(DevicePlan& plan, const std::vector<Move>& moves, std::size_t i, std::size_t j,
                               std::uint64_t frees_at_plan, FetchBatch& batch) {
  // One Backend call per (run, block) piece. A run that one known block covers wholly is one
  // piece: no table look-up.
  const Move& first = moves[i];
  std::uint64_t addr = first.chunk * kChunkBytes;
  const std::uint64_t end = (moves[j - 1].chunk + 1) * kChunkBytes;
  ReleaseGate::IssueSection section(gate_);  // the checks below hold until the calls are made
  if (first.end > first.base && first.base <= addr && first.end >= end && gate_.frees_started() == frees_at_plan) {
    issue_move(plan, first.to, addr, end - addr, batch);
    return 0;
  }
  return move_pieces(plan, first.to, addr, end, batch);
}

bool Engine::same_managed_allocation(std::uint64_t a, std::uint64_t b) {
  return sub_.enabled() ? sub_.same_range_if_free(a, b) : backend_.same_managed_allocation(a, b);
}

std::uint64_t Engine::move_pieces(DevicePlan& plan, Location to, std::uint64_t addr, std::uint64_t end, FetchBatch& batch) {
  // One call per live block the run overlaps, clipped to it — except that the pieces of
  // blocks in shared ranges (Block::in_shared_range) that share a chunk, or that lie on
  // adjacent chunks of one managed allocation, are one call, the holes between them
  // included. A chunk lies inside one range (ranges are whole chunks inside their managed
  // allocation: FencedSubAllocator), and each block inside one range, so the call stays
  // inside one managed allocation, as cuMemPrefetchAsync requires (CUDA Driver API, "Unified
  // Addressing"); the driver then pipelines copy and map across its VA blocks (UvmMigrate,
  // nvidia-uvm uvm_migrate.c; docs/design.md, "One launch"). A hole lies in the chunks of the
  // run, which move anyway, and a move changes where bytes are, never what they hold: the
  // free or parked bytes of a hole lose nothing. (A chunk of the run with no live block ends
  // the call: it is not moved.)
  std::uint64_t await_frees = 0;
  std::uint64_t call_addr = 0, call_end = 0;  // the call being built; empty while equal
  bool call_shared = false;
  auto issue = [&] {
    if (call_end != call_addr) issue_move(plan, to, call_addr, call_end - call_addr, batch);
  };
  while (addr < end) {
    std::optional<Block> b = table_.find(addr);
    if (!b) {  // a chunk's head may hold no block (sub-chunk blocks): try its other bytes
      std::optional<Block> tail = table_.find(std::min(end, (addr / kChunkBytes + 1) * kChunkBytes) - 1);
      if (!tail || tail->base <= addr) {
        if (to == Location::cpu && gate_.frees_started() != gate_.frees_done()) await_frees = gate_.frees_started();
        addr = (addr / kChunkBytes + 1) * kChunkBytes;
        continue;
      }
      addr = tail->base;
      b = tail;
    }
    const std::uint64_t last_chunk = (call_end - 1) / kChunkBytes;
    const bool joins = call_end != call_addr && call_shared && b->in_shared_range &&
                       (last_chunk == addr / kChunkBytes ||
                        (last_chunk + 1 == addr / kChunkBytes && same_managed_allocation(call_addr, addr)));
    if (!joins) {
      issue();
      call_addr = addr;
      call_shared = b->in_shared_range;
    }
    call_end = addr = std::min(end, b->end());
  }
  issue();
  return await_frees;
}

void Engine::launch(const Launch& launch) { run_launch(launch, false); }

Engine::LaunchInFlight Engine::launch_in_flight(const Launch& launch) {
  int device = 0;
  const std::uint64_t epoch = run_launch(launch, true, &device);
  return LaunchInFlight(epoch == 0 ? nullptr : this, epoch, device);
}

std::uint64_t Engine::run_launch(const Launch& launch, bool in_flight, int* device_out) {
  if (!usable()) return 0;
  // The launching device's plan (opened now if it is new; the simulator's launches, -1: the first).
  const int device = launch.device >= 0 ? launch.device : plans_.first_device();
  DevicePlan* plan = device == plans_.first_device() ? plans_.of(device) : open_plan(device);
  LaunchPlan made;
  if (plans_.facts().manages_residency && plan != nullptr) {
    // One allocation each for a launch's usual plan (a few fetches, evictions and
    // prefetches), not one per doubling. (Other policies seldom ask for anything.)
    made.actions.list.reserve(16);
    made.moves.reserve(16);
  }
  notify_launch(launch);
  {
    std::lock_guard lock(mutex_);
    make_launch_plan(plan, launch, in_flight, made);
  }
  if (plan == nullptr) return 0;
  if (!made.planned) {
    carry_out(*plan, made.actions, made.moves, false);
    return made.epoch;
  }
  if (in_flight && device_out != nullptr) *device_out = device;
  plan_order_.wait_for_turn(made.ticket);
  carry_out(*plan, made.actions, made.moves, true, made.frees_at_plan);
  plan_order_.done(made.ticket);  // the next plan may go
  return made.epoch;
}

void Engine::make_launch_plan(DevicePlan* plan_ptr, const Launch& launch, bool in_flight, LaunchPlan& out) {
  ++counters_.launches;
  if (plan_ptr == nullptr) {
    if (counters_.launches_other_device++ == 0) {
      log(LogLevel::warn,
          "a kernel launched on device {}, for which Spillway has no plan (see the warnings above); launches there "
          "are left to the driver's demand paging",
          launch.device);
    }
    return;
  }
  DevicePlan& plan = *plan_ptr;
  ++plan.counters.launches;
  faults_.note_launch(launch.seq, plan.device);
  const Launch refined = refined_launch(plan, launch);
  plan.policy->on_launch(refined, out.actions);
  account_state_locked();
  out.planned = plans_.facts().manages_residency;
  if (!out.planned) return;
  std::vector<ChunkIndex> held;  // the launch's resident chunks, held while it is in flight
  out.frees_at_plan = gate_.frees_at_plan();
  plan_launch(plan, refined, out.actions, out.moves, in_flight ? &held : nullptr);
  out.ticket = plan_order_.take();
  if (in_flight) {
    out.epoch = plan.residency.epoch;
    plan.residency.in_flight.emplace_back(out.epoch, std::move(held));
  }
}

Launch Engine::refined_launch(DevicePlan& plan, const Launch& launch) {
  Launch refined = launch;
  if (!wants_fault_feedback() || !backend_.fault_feedback()) return refined;
  counters_.fault_records += faults_.deliver(backend_, plans_, plan.device);
  refined.accesses = plan.policy->refine_footprint(launch);
  if (refined.accesses.data() != launch.accesses.data()) {
    for (std::size_t i = 0; i < refined.accesses.size() && i < launch.accesses.size(); ++i) {
      counters_.refined_accesses += refined.accesses[i].bytes != launch.accesses[i].bytes;
    }
  }
  return refined;
}

void Engine::end_launch(int device, std::uint64_t epoch) {
  DevicePlan* plan = plans_.of(device);
  if (plan == nullptr) return;
  std::lock_guard lock(mutex_);
  auto& f = plan->residency.in_flight;
  auto it = std::find_if(f.begin(), f.end(), [&](const auto& e) { return e.first == epoch; });
  if (it == f.end()) return;
  plan->residency.release(it->second);
  f.erase(it);
}

bool Engine::planned_resident(ChunkIndex chunk) const {
  std::lock_guard lock(mutex_);
  bool found = false;
  plans_.for_each([&](const DevicePlan& p) { found = found || p.residency.contains(chunk); });
  return found;
}

bool Engine::planned_resident_on(ChunkIndex chunk, int device) const {
  const DevicePlan* p = plans_.of(device);
  if (p == nullptr) return false;
  std::lock_guard lock(mutex_);
  return p->residency.contains(chunk);
}

std::uint64_t Engine::planned_resident_chunks() const {
  std::lock_guard lock(mutex_);
  std::uint64_t n = 0;
  plans_.for_each([&](const DevicePlan& p) { n += p.residency.size(); });
  return n;
}

std::uint64_t Engine::planned_resident_chunks(int device) const {
  const DevicePlan* p = plans_.of(device);
  if (p == nullptr) return 0;
  std::lock_guard lock(mutex_);
  return p->residency.size();
}

}  // namespace spillway
