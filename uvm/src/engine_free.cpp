// The Engine's free path (engine.h, Engine::release and reclaim; docs/design.md, "One
// free"): the release claim, the block out of the table, then one of three ends — a carved
// block parked behind a fence, a direct block freed now, or a stream-ordered free deferred
// until its stream's work is done — and the ends of contexts.
#include <algorithm>
#include <cstdint>

#include "spillway/engine.h"
#include "spillway/log.h"
#include "spillway/size.h"
#include "device_plan.h"
#include "engine_actions.h"

namespace spillway {

Result Engine::release(std::uint64_t addr, std::optional<StreamHandle> stream, bool* ours,
                       std::optional<bool> capturing_known) {
  // The address is claimed first: a block being released (by another thread now, or
  // stream-ordered and pending) holds a claim, and the driver must not free it a second time.
  const std::uint64_t claim = gate_.claim(addr);
  if (claim == 0) {
    *ours = true;
    return Result{Status::invalid_value, 0};
  }
  auto not_a_block = [&] {  // inside a range of ours but no block's base: never the driver's to free
    gate_.end_claim(addr, claim);
    *ours = in_suballocator_range(addr);
    return *ours ? Result{Status::invalid_value, 0} : Result{};
  };
  bool capturing = capturing_known.value_or(false);
  if (stream) {
    if (!table_.find_base(addr)) return not_a_block();
    // Never guess the state of a stream the driver does not know: its own error, block kept.
    if (Result st = capturing_known ? Result{} : backend_.capture_status(*stream, &capturing); !st.ok()) {
      gate_.end_claim(addr, claim);
      *ours = true;
      return st;
    }
  }
  // Counted from before the block leaves the table until its chunks have left the plan (and
  // its data the GPU: its discard or the driver's free is issued): a plan made meanwhile, or
  // carried out after another free started, may hold moves of the freed block's chunks
  // (frees_at_plan; carry_out's wait). (One carried out before this count moves, moves them
  // before the driver frees the block: no harm.)
  const ReleaseGate::FreeInProgress free_in_progress(gate_);
  std::optional<Block> block = table_.erase(addr);
  *ours = block.has_value();
  if (!block) return not_a_block();
  if (framework_.segments() != 0) framework_.drop_segments(block->base, block->end());
  if (block->suballocated) {
    release_carved(*block, claim, stream.has_value());
    return Result{};
  }
  if (!stream) return release_now(*block, claim);
  defer_release(*block, claim, *stream, capturing);
  return Result{};
}

void Engine::release_carved(const Block& block, std::uint64_t claim, bool stream_ordered) {
  // Dead now: the range waits for a fence (no device wait), and then its own chunks leave
  // the plan — after the fence that discards them is issued, so that no plan counts their
  // room as free while the driver may still hold them.
  gate_.wait_for_issuers();
  // Under a policy that plans residency, a free whose chunks die with it is fenced at once
  // (a block on whole chunks of its own; the last live block of a slab the plan holds
  // resident): the fence discards them as soon as the work before it is done (a slab: the
  // fence after the one that frees it), so the driver never writes the dead data back to
  // make room the plan already counts as free. Other frees are fenced in batches.
  const bool small = SubAllocator::is_small(block.bytes);
  const ChunkIndex chunk = chunk_of(block.base);
  const bool chunk_died = plans_.facts().manages_residency &&
                          (!small || (planned_resident(chunk) &&
                                      !table_.first_overlapping(chunk * kChunkBytes, (chunk + 1) * kChunkBytes)));
  sub_.park_freed(block.base, block.bytes, block.context, chunk_died);
  run_policy_free(block);
  gate_.end_claim(block.base, claim);
  finish_release(block.bytes, stream_ordered, false);
}

Result Engine::release_now(const Block& block, std::uint64_t claim) {
  gate_.wait_for_issuers();
  Result r = backend_.free_managed(block.base);
  if (!r.ok()) {
    // The driver still holds the block: keep it ours, so that the program can free it again.
    table_.insert(block);
    gate_.end_claim(block.base, claim);
    return r;
  }
  gate_.end_claim(block.base, claim);
  run_policy_free(block);
  finish_release(block.bytes, false);
  if (deferred_.any()) reclaim(false);
  return r;
}

void Engine::defer_release(const Block& block, std::uint64_t claim, StreamHandle stream, bool capturing) {
  run_policy_free(block);
  PendingFree pending{block.base, block.bytes, claim, stream, 0};
  pending.context = block.context;
  if (!capturing) {
    Result r = backend_.record_event(stream, &pending.event);
    if (!r.ok()) {
      // Without an event we cannot order the release after the stream's work: wait for it.
      pending.event = 0;
      std::lock_guard lock(mutex_);
      ++counters_.backend_errors;
    }
  }
  deferred_.push(pending);
  reclaim(false);
}

void Engine::finish_release(std::uint64_t bytes, bool deferred, bool unreserve_bytes) {
  if (unreserve_bytes) cap_.unreserve(bytes);
  counts_.frees.fetch_add(1, std::memory_order_relaxed);
  if (deferred) counts_.frees_deferred.fetch_add(1, std::memory_order_relaxed);
}

void Engine::run_policy_free(const Block& block) {
  if (DevicePlan* owner = plans_.of(block.device)) owner->live_bytes.fetch_sub(block.bytes, std::memory_order_relaxed);
  const PolicyFacts& facts = plans_.facts();
  if (!facts.sees_allocations && !facts.manages_residency && observer_.load(std::memory_order_acquire) == nullptr) return;
  notify_free(block);
  EngineActions actions;  // a policy may not move a dying block; requests are dropped
  std::lock_guard lock(mutex_);
  plans_.for_each([&](DevicePlan& p) { p.policy->on_free(block, actions); });
  if (!facts.manages_residency) return;
  // The block's chunks leave the plans (at no cost: the data is dead), on whichever device
  // they are. A chunk the block shares with another live block (sub-chunk blocks in the
  // shim) stays.
  // (The block has left the table: any block found in the chunk is another.)
  ChunkIndex first = chunk_of(block.base), last = chunk_of(block.end() - 1);
  plans_.for_each([&](DevicePlan& p) {
    if (p.residency.size() == 0) return;
    for (ChunkIndex c = first; c <= last; ++c) {
      const bool partial = (c == first && block.base % kChunkBytes != 0) || (c == last && block.end() % kChunkBytes != 0);
      if (partial && table_.first_overlapping(c * kChunkBytes, (c + 1) * kChunkBytes)) continue;
      if (p.residency.erase(c)) p.policy->on_residency(c, false);
    }
  });
}

void Engine::stream_destroyed(StreamHandle stream) {
  std::vector<PendingFree> orphans =
      deferred_.take_if([stream](const PendingFree& p) { return p.stream == stream && p.event == 0; });
  for (PendingFree& p : orphans) {
    bool capturing = false;
    if (backend_.capture_status(stream, &capturing).ok() && !capturing && backend_.record_event(stream, &p.event).ok()) {
      deferred_.push(p);
      continue;
    }
    release_deferred(p);
  }
}

void Engine::begin_context_end(std::uint64_t handle) { sub_.begin_context_end(handle); }

void Engine::finish_context_end(std::uint64_t handle, bool ended) {
  const std::uint16_t number = sub_.context_end_answered(handle, ended);
  if (number == 0) return;
  // (It stays ending until its ranges are gone: a fence closed meanwhile by another thread
  // must not discard them, as the driver has freed them and may have handed them out again.)
  release_context_blocks(number);
  drop_context_frees(number);
  sub_.drop_context(number);
}

void Engine::release_context_blocks(std::uint16_t context) {
  const std::vector<Block> blocks = table_.blocks_of_context(context);
  if (blocks.empty()) return;
  const ReleaseGate::FreeInProgress free_in_progress(gate_);  // (as in release(): plans made meanwhile are clipped)
  std::vector<Block> gone;
  for (const Block& b : blocks) {
    if (std::optional<Block> erased = table_.erase(b.base)) gone.push_back(*erased);
    if (framework_.segments() != 0) framework_.drop_segments(b.base, b.end());
  }
  gate_.wait_for_issuers();
  for (const Block& b : gone) {
    run_policy_free(b);
    finish_release(b.bytes, false, !b.suballocated);  // (a carved block's bytes are its range's)
  }
}

void Engine::drop_context_frees(std::uint16_t context) {
  const std::vector<PendingFree> gone = deferred_.take_if([context](const PendingFree& p) { return p.context == context; });
  // (Their blocks went with the context; their events too, if the stream was the context's.)
  for (const PendingFree& p : gone) {
    gate_.end_claim(p.addr, p.claim);
    finish_release(p.bytes, true);
  }
}

void Engine::release_deferred(PendingFree& p) {
  // A release the driver refuses is tried once more at once, then again at later reclaims:
  // the block must not be dropped while the driver still holds it.
  gate_.wait_for_issuers();
  for (int i = 0; i < 2; ++i) {
    if (backend_.free_managed(p.addr).ok()) {
      gate_.end_claim(p.addr, p.claim);
      finish_release(p.bytes, true);
      return;
    }
  }
  {
    std::lock_guard lock(mutex_);
    ++counters_.backend_errors;
  }
  if (++p.failed_attempts >= kMaxReleaseAttempts) {
    log(LogLevel::warn, "the driver refused {} times to release managed block {:#x} ({}); it stays allocated",
        2 * kMaxReleaseAttempts, p.addr, format_bytes(p.bytes));
    gate_.end_claim(p.addr, p.claim);  // the driver's own: a later free of it is the driver's to answer
    return;
  }
  p.event = 0;
  p.retry = true;
  deferred_.push(p);
}

void Engine::reclaim(bool wait) {
  if (wait && sub_.enabled()) sub_.wait_for_fences();
  std::vector<PendingFree> work = deferred_.take_all();
  if (work.empty()) return;
  std::vector<PendingFree> keep;
  for (PendingFree& p : work) {
    if (!reclaim_one(p, wait)) keep.push_back(p);
  }
  deferred_.push(keep);
}

bool Engine::reclaim_one(PendingFree& p, bool wait) {
  if (p.retry) {
    release_deferred(p);
    return true;
  }
  if (p.event == 0) {
    bool capturing = false;
    Result st = backend_.capture_status(p.stream, &capturing);
    if (st.ok() && capturing) return false;  // nothing may be issued on a capturing stream
    // (A stream the driver no longer knows has no work left to wait for: no event, plain free.)
    if (!st.ok() || !backend_.record_event(p.stream, &p.event).ok()) p.event = 0;
  }
  // Without an event (none could be recorded) it falls back to a plain (synchronous) free.
  if (p.event != 0) {
    Result r = wait ? wait_at_cap(backend_, cap_, p.event, false) : backend_.event_done(p.event);
    if (!r.ok() && r.status == Status::not_ready) return false;
    backend_.destroy_event(p.event);
  }
  release_deferred(p);
  return true;
}

}  // namespace spillway
