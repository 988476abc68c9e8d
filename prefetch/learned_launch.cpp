// `learned`'s launch (docs/learned-policy.md §2-§5c): where the launch stands in the
// history, the next uses of its chunks, and the plan — its own footprint's room, then the
// prefetches of the predicted launches in order of need, then the write-backs ahead of
// need. Each step below is one part of LearnedPolicy::on_launch, in order.
#include <algorithm>

#include "learned.h"

namespace spillway {

using learned::kFar;
using learned::kNone;
using Position = learned::LaunchHistory::Position;

namespace {
// The chunk touches `launch` adds to the history, at most.
std::uint64_t footprint_chunks(const Launch& launch) {
  std::uint64_t chunks = 0;
  for (const Access& a : launch.accesses) chunks += a.bytes == 0 ? 0 : chunk_of(a.addr + a.bytes - 1) - chunk_of(a.addr) + 1;
  return chunks;
}
}  // namespace

void LearnedPolicy::on_launch(const Launch& launch, Actions& actions) {
  seq_ = launch.seq;
  ranking_.new_launch();
  link_.observe_launch(launch, launch.dur_ns > 0 ? launch.dur_ns : history_.dur_of(launch.exec_id));
  stamp_ += 4;
  make_room(footprint_chunks(launch));
  read_mostly_.begin_launch(launch);
  const Position at = history_.add(launch, seq_);
  follow(at);
  // (The floor also covers the launches walked before: see take_victim.)
  const std::uint64_t floor = std::max(use_footprint(at, actions), frontier_.floor());
  refresh_stale();
  LaunchPlan plan = start_plan(launch, at, floor);
  if (!place_footprint(plan, actions) || at.found == kNone) return;
  plan_ahead(plan, actions);
}

// The launch's place in the history: in step with it (the match the previous launch
// predicted), or at a new position, where the lookahead starts over.
void LearnedPolicy::follow(const Position& at) {
  const bool in_step = at.continues && anchor_ != kNone;
  anchor_ = at.found;
  if (at.found != kNone) period_ = at.entry - at.found;
  if (!in_step) frontier_.restart(seq_);
  frontier_.pass(seq_);
  link_.set_in_step(in_step);
  streak_ = in_step ? streak_ + 1 : 0;
}

// ---- 1. the chunks this launch touches ----

// They are used now; their next use is what followed the matching entry in the history (the
// same chunks in the same order, as the execution id covers the addresses), else unknown
// (ranked as if reused one period later, i.e. LRU). Returns the largest next use of this
// launch's chunks (the floor of early evictions, see take_victim).
std::uint64_t LearnedPolicy::use_footprint(const Position& at, Actions& actions) {
  const Entry& cur = history_.entry(at.entry);
  const bool zip = at.found != kNone &&
                   history_.entry(at.found).touch_end - history_.entry(at.found).touch_begin == cur.touch_end - cur.touch_begin;
  missing_.clear();
  std::uint64_t floor = 0;
  for (std::uint32_t i = 0; i < cur.touch_end - cur.touch_begin; ++i) {
    const std::uint64_t nu = use_touch(i, at, zip, actions);
    if (nu < kFar) floor = std::max(floor, nu);
  }
  return floor;
}

// The launch's touch `i`: its predicted next use (returned), its read-mostly advice, its
// rank. `zip`: the matched entry has as many touches, touch `i` there may be this one's.
std::uint64_t LearnedPolicy::use_touch(std::uint32_t i, const Position& at, bool zip, Actions& actions) {
  Touch& touch = history_.touch(history_.entry(at.entry).touch_begin + i);
  const ChunkIndex c = touch.chunk;
  ChunkInfo& info = *history_.touched()[i];
  std::uint64_t nu = seq_ + std::max<std::uint64_t>(period_, 1);
  const bool matched = zip && history_.touch(history_.entry(at.found).touch_begin + i).chunk == c;
  bool next_reads_only = false;
  if (matched) {
    const Touch& then = history_.touch(history_.entry(at.found).touch_begin + i);
    const std::uint32_t nt = then.next;
    // No later touch, or the next one is on a new block (this one is freed first): dead.
    nu = nt == kNone || history_.touch(nt).fresh ? kFar : seq_ + (history_.touch(nt).entry - at.found);
    // (Learned: the bit passes on to this touch, which the next iteration matches: a write
    // predicted in time faults no more, so each iteration must hand its knowledge on.)
    if (read_mostly_.learns() && then.write) touch.write = true;
    next_reads_only = nu == kFar || !history_.touch(nt).write;
  } else if (const std::uint64_t g = signatures_.guess_next_use(info); g != 0) {
    nu = g;
  }
  const bool read_mostly = read_mostly_.wanted(info, signatures_, touch.write, matched, next_reads_only);
  learned::ReadMostlyAdvisor::apply(c, info, read_mostly, actions);
  info.mark = stamp_ + learned::kCurrent;
  trust_.outcome(info, info.nu >= seq_);  // used by the launch it was fetched for
  ranking_.set_next_use(info, nu);
  if (!info.resident) missing_.push_back(Missing{c, &info, zip});
  return nu;
}

// Resident chunks whose predicted use has passed without a touch: the history's prediction
// was wrong. What usually follows their last touch (its signature) decides whether they are
// still wanted, else the loop's period; the others keep next use 0 (evicted first, and not
// looked at again).
void LearnedPolicy::refresh_stale() {
  ranking_.for_each_stale(seq_, [&](ChunkInfo& info) {
    std::uint64_t g = signatures_.guess_next_use(info);
    // No signature's word either: in a loop, data comes back one period (the last match's
    // distance) after its last touch, as long as that lies ahead. (Measured on the tuning
    // half of the corpus, docs/learned-policy.md §3: evicting such chunks first instead cost
    // vit-l16 training 4-5% and made it fetch 6% more than LRU does.)
    if (g <= seq_ && period_ > 0 && info.last_seq + period_ > seq_) g = info.last_seq + period_;
    trust_.outcome(info, false);  // fetched for a launch that did not come
    ranking_.set_next_use(info, g > seq_ ? g : 0);
  });
}

// ---- 2. the plan: room, and the victims it comes from ----

LearnedPolicy::LaunchPlan LearnedPolicy::start_plan(const Launch& launch, const Position& at, std::uint64_t floor) {
  const std::uint64_t budget = ranking_.budget_chunks();
  const std::int64_t free = budget == 0 ? INT64_MAX / 2 : static_cast<std::int64_t>(budget) - static_cast<std::int64_t>(ranking_.size());
  const double now = static_cast<double>(launch.now_ns);
  deferred_.clear();
  link_.start_fetches(now);
  // The link is the bottleneck when what was issued before cannot arrive while this launch
  // runs: then a chunk that displaces nothing needed later is better read remotely.
  // Measured, not assumed: the launches have recently been waiting for data (the gap since
  // the previous launch exceeds its duration by more than the slack, in most recent launches).
  return LaunchPlan{at, free, floor, now, link_.bound(), learned::VictimCursor(ranking_.ranked(), seq_, stamp_)};
}

bool LearnedPolicy::take_room(LaunchPlan& plan, std::uint64_t need, std::uint64_t floor) {
  if (plan.free > 0) {
    --plan.free;
    return true;
  }
  return take_victim(plan, need, floor);
}

// A victim for a chunk needed at launch `need`: the next in the order choose_victim() will
// give them (stale first, then furthest), if its next use comes after `need`.
// MIN's victim, taken early. A prefetch for launch s evicts now the resident chunk with the
// furthest predicted use; waiting until s, MIN would evict the chunk then furthest — which
// may be one touched before s (this launch's included) and needed again later than this
// victim. Evicting early is what MIN would do only if the victim's next use is no sooner
// than that of every chunk touched from now until s (conservative prefetching: Cao,
// Felten, Karlin, Li, SIGMETRICS 1995). Chunks predicted dead after their touch leave and
// do not count. `floor` is the largest of those next uses, over this launch and every
// launch the walks have passed since (the frontier keeps their maximum as the window
// slides). Below the floor the victim is still taken if it would not stay resident until
// its use anyway (survives), unless the program spends much of its time waiting for data:
// an extra fetch then costs time directly, and on a loop just over the GPU each such
// eviction causes the next.
bool LearnedPolicy::take_victim(LaunchPlan& plan, std::uint64_t need, std::uint64_t floor) {
  if (plan.victims.take_stale()) return true;
  const learned::RankedSet::value_type* furthest = plan.victims.furthest();
  const std::uint64_t nu = furthest == nullptr ? 0 : furthest->first.first;
  if (furthest == nullptr || nu <= need || nu < seq_) return false;
  if (nu < floor && (link_.waits_for_data(p_.max_waiting) || survives(plan, nu))) return false;
  plan.victims.take_furthest();
  return true;
}

// Would a chunk next used at `nu` stay resident until then if nothing were prefetched early?
// Yes when the launches before it touch fewer chunks than the GPU holds (by the history
// from the anchor); then evicting it early adds a miss that MIN would not have.
bool LearnedPolicy::survives(const LaunchPlan& plan, std::uint64_t nu) const {
  const std::uint32_t found = plan.at.found;
  if (found == kNone || ranking_.budget_chunks() == 0 || nu <= seq_) return false;
  const std::uint64_t q2 = found + (nu - seq_);
  if (q2 >= history_.size()) return false;
  return history_.entry(q2).touch_begin - history_.entry(found).touch_end < ranking_.budget_chunks();
}

// The latest next use after s of the chunks of launch s (history entry q). A touch with no
// later one in the history is next used, if ever, after the history's end: one period
// later, as the loop repeats (as step 1 ranks a chunk it cannot predict).
std::uint64_t LearnedPolicy::latest_next_use(const LaunchPlan& plan, const Entry& e, std::uint64_t s, std::uint64_t q) const {
  std::uint64_t post_max = 0;
  for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
    const std::uint32_t nt = history_.touch(t).next;
    if (nt == kNone) post_max = std::max<std::uint64_t>(post_max, s + std::max<std::uint64_t>(period_, plan.at.entry - q + 1));
    else if (!history_.touch(nt).fresh) post_max = std::max(post_max, s + (history_.touch(nt).entry - q));
  }
  return post_max;
}

// The launch's own missing footprint comes first (the Engine fetches it before the
// launch), in footprint order. A chunk whose predicted next use is no sooner than that of
// every chunk it could displace is, on a busy link, left on the CPU and read remotely
// (MIN with bypass: preferred location CPU + accessed by the GPU). False: no room to plan
// with (the Engine evicts whatever it can).
bool LearnedPolicy::place_footprint(LaunchPlan& plan, Actions& actions) {
  for (const Missing& m : missing_) {
    const ChunkInfo& info = *m.info;
    if (take_room(plan, info.nu, 0)) continue;
    if (m.predicted && plan.link_bound && info.blocks > 0 && info.end_offset != 0) {
      read_remotely(m, actions);
      continue;
    }
    if (!take_victim(plan, 0, 0)) return false;
  }
  return true;
}

void LearnedPolicy::read_remotely(const Missing& m, Actions& actions) {
  ChunkInfo& info = *m.info;
  info.remote = stamp_;
  link_.set_left_remote();
  if (info.advised) return;
  const std::uint64_t addr = m.chunk * kChunkBytes + info.addr_offset, bytes = info.end_offset - info.addr_offset;
  actions.advise(addr, bytes, Advice::preferred_location, Location::cpu);
  actions.advise(addr, bytes, Advice::accessed_by, Location::gpu);
  info.advised = true;
}

// ---- 3. prefetch the predicted launches' chunks in order of need ----

void LearnedPolicy::plan_ahead(LaunchPlan& plan, Actions& actions) {
  const std::uint64_t first = std::max(frontier_.ahead(), seq_) + 1;
  // Prefetch along the anchor only while the prefetches made from anchors of its age (launches
  // in step since it was found) have mostly been used by the launch they were fetched for: a
  // false match — an execution id that recurs in another context — prefetches data that is
  // not needed then and evicts data that is. While refused, the estimate drifts back up, so
  // prefetching is retried now and then.
  const std::uint8_t age = static_cast<std::uint8_t>(std::min<std::uint64_t>(streak_, p_.anchor_ages));
  if (trust_.refuses(age, p_.min_precision, p_.retry)) return;
  bool horizon_reached = false;  // the walk stopped at the link's horizon (not for want of room or history)
  const std::uint64_t s = walk_lookahead(plan, first, age, &horizon_reached, actions);
  frontier_.set_ahead(s - 1);
  // Only from an anchor as sure as a context match (in step for `anchor_ages` launches):
  // from a younger one, which may be a false match, evicting for launches that may not come
  // cost 8% more fetches on a decode loop whose cache moves every step
  // (LearnedTest.DecodingWithAMovingKvCache...).
  if (horizon_reached && ranking_.budget_chunks() != 0 && p_.early_write_back && streak_ >= p_.anchor_ages) {
    write_back_ahead(plan, s, actions);
  }
  for (const auto& [info, nu] : deferred_) ranking_.set_next_use(*info, nu);
}

// Walks the predicted launches from `s` until the link's horizon, the end of the history,
// the scan's bound or the room runs out; returns the first launch not planned for.
std::uint64_t LearnedPolicy::walk_lookahead(LaunchPlan& plan, std::uint64_t s, std::uint8_t age, bool* horizon_reached,
                                            Actions& actions) {
  const std::uint32_t found = plan.at.found;
  const std::uint64_t base = history_.prefix(found + 1);  // predicted time from now = prefix(q) - base
  const std::uint64_t last = std::min<std::uint64_t>(seq_ + p_.max_ahead, s + p_.max_scan - 1);
  for (; s <= last; ++s) {
    const std::uint64_t q = found + (s - seq_);
    if (q >= history_.size()) break;
    // Launch s starts about prefix(q) - base from now: far enough when the link would be
    // idle by then (what is needed sooner has been issued already).
    if (s > seq_ + p_.min_ahead && link_.drained_before(plan.now_ns + static_cast<double>(history_.prefix(q) - base))) {
      *horizon_reached = true;
      break;
    }
    if (!prefetch_for(plan, s, q, age, actions)) break;
    const std::uint64_t post_max = latest_next_use(plan, history_.entry(q), s, q);
    plan.raise_floor(post_max);
    frontier_.walked(s, post_max);
  }
  return s;
}

// The chunks of predicted launch s (history entry q) that are not resident are prefetched,
// with room made for them; false when no room is left.
bool LearnedPolicy::prefetch_for(LaunchPlan& plan, std::uint64_t s, std::uint64_t q, std::uint8_t age, Actions& actions) {
  const Entry& e = history_.entry(q);
  for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
    const Touch& touch = history_.touch(t);
    ChunkInfo& info = *touch.info;
    if (info.mark > stamp_) continue;  // already in this plan
    if (touch.fresh) {
      // Its block will be new then: nothing to bring, but the new block will need room
      // (the Engine makes it when it comes), so count it against the lookahead's room.
      if (!take_room(plan, s, 0)) return false;
      info.mark = stamp_ + learned::kKept;
      continue;
    }
    if (info.blocks == 0) continue;  // no live block there now
    if (info.resident) {
      // Needed at s: not a victim for anything later; its rank is updated after the scan
      // (the victim cursor walks the ranking).
      info.mark = stamp_ + learned::kKept;
      if (info.nu > s || info.nu < seq_) deferred_.emplace_back(&info, s);
      continue;
    }
    if (info.end_offset == 0) continue;  // no address of a live block known here to prefetch by
    if (plan.free <= 0 && plan.link_bound && bypass(plan, touch, s, q)) continue;
    if (!take_room(plan, s, plan.floor)) return false;
    ranking_.set_next_use(info, s);
    info.mark = stamp_ + learned::kPlanned;
    actions.prefetch(touch.chunk * kChunkBytes + info.addr_offset, 1, Location::gpu);
    info.pf_age = age;
    link_.fetch_issued();
  }
  return true;
}

// Bypass: if after its use at s the chunk would be the furthest-needed one, moving it in
// (and out again) costs the busy link more than reading it remotely at s.
bool LearnedPolicy::bypass(LaunchPlan& plan, const Touch& touch, std::uint64_t s, std::uint64_t q) {
  const std::uint32_t nt = touch.next;
  const std::uint64_t post = nt == kNone || history_.touch(nt).fresh ? kFar : s + (history_.touch(nt).entry - q);
  const learned::RankedSet::value_type* furthest = plan.victims.furthest();
  return furthest != nullptr && post >= furthest->first.first;
}

// ---- 4. write-back ahead of need ----

// The launches just past the horizon (from `s`) will need room once the link is free to
// fetch for them. The victims that room will come from are evicted now, chosen as the
// lookahead will choose them then (take_victim: Belady on the predicted future, early only
// where MIN would evict too), so that their write-backs run while the H2D queue drains and
// the kernels compute, and the room is free when the fetches are issued — rather than
// evicted then, with each fetch waiting for the write-back that makes its room. Budgeted
// like the H2D lookahead, by a virtual clock of the D2H engine: write-backs are queued no
// later than the H2D queue's end plus the slack (the room is not needed sooner); a
// read-mostly victim costs no write-back.
void LearnedPolicy::write_back_ahead(LaunchPlan& plan, std::uint64_t s, Actions& actions) {
  link_.start_write_backs(plan.now_ns);
  const std::uint64_t end = std::min<std::uint64_t>(seq_ + p_.max_ahead, s + p_.write_back_scan - 1);
  bool stop = false;
  for (std::uint64_t s2 = s; s2 <= end && !stop; ++s2) {
    const std::uint64_t q = plan.at.found + (s2 - seq_);
    if (q >= history_.size()) break;
    const Entry& e = history_.entry(q);
    stop = !write_back_for(plan, s2, e, actions);
    plan.raise_floor(latest_next_use(plan, e, s2, q));
  }
}

// Room for the chunks predicted launch s (entry `e`) will bring; false when the D2H budget
// or the victims run out.
bool LearnedPolicy::write_back_for(LaunchPlan& plan, std::uint64_t s, const Entry& e, Actions& actions) {
  for (std::uint32_t t = e.touch_begin; t < e.touch_end; ++t) {
    const Touch& touch = history_.touch(t);
    ChunkInfo& info = *touch.info;
    if (info.mark > stamp_) continue;  // already in this plan
    const bool needs_room = !info.resident && (touch.fresh || (info.blocks != 0 && info.end_offset != 0));
    info.mark = stamp_ + learned::kKept;  // needed at s: not a victim for it or later launches
    if (!needs_room) continue;
    if (plan.free > 0) {
      --plan.free;
      continue;
    }
    if (link_.write_back_past_queue() || !take_victim(plan, s, plan.floor)) return false;
    const auto& [key, victim] = plan.victims.taken();
    actions.prefetch(key.second * kChunkBytes + victim->addr_offset, 1, Location::cpu);
    if (!victim->read_mostly) link_.write_back_issued();
  }
  return true;
}

}  // namespace spillway
