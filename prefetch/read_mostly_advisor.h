// `learned`'s read-mostly advice (docs/learned-policy.md §5b): a chunk a launch only reads,
// and whose next touch in the history only reads it too (or frees it), is advised
// read-mostly (cudaMemAdviseSetReadMostly, CUDA Programming Guide, "Unified Memory
// Programming": evicting a read-mostly copy needs no write-back); a chunk a launch writes is
// un-advised before it (a write to a read-mostly copy faults to collapse the copies). Which
// touches write comes from the launches where they say so (Launch::writes_known), else from
// the driver's write faults while the Backend reports them. Not thread-safe (the Engine
// serialises the policy's calls).
#pragma once

#include "learned_records.h"
#include "signature_table.h"

namespace spillway::learned {

class ReadMostlyAdvisor {
 public:
  // The Backend reports faults (Policy::refine_footprint comes before each launch then):
  // the next launch's write bits are learned from them.
  void expect_write_faults() { faults_reported_ = true; }
  // A launch begins: whether it says which accesses write, else whether its write bits are
  // learned (if the feedback stops, learned read-mostly advice goes).
  void begin_launch(const Launch& launch);
  bool learns() const { return learns_; }
  // The advice this launch's touch should leave on `info`'s chunk. `writes_now`: the touch
  // writes; `matched`: the history predicted it, with `next_reads_only`: its next touch only
  // reads, or there is none (the data is freed first).
  bool wanted(const ChunkInfo& info, const SignatureTable& signatures, bool writes_now, bool matched, bool next_reads_only) const;
  // Sets or unsets the advice on chunk `c` if `want` differs from it and its live block's
  // range is known.
  static void apply(ChunkIndex c, ChunkInfo& info, bool want, Actions& actions);
  // The first live block on chunk `c`: a range the sub-allocator parked and hands out again
  // keeps the driver's advice (nothing was freed to the driver), the new block starts
  // without it.
  static void first_block(ChunkIndex c, const Block& block, ChunkInfo& info, Actions& actions);
  // A write fault on `info`'s chunk: a write met its read-mostly copy.
  static void write_fault(ChunkInfo& info);

 private:
  bool faults_reported_ = false;  // refine_footprint came before this launch
  bool writes_known_ = false;     // this launch's Launch::writes_known
  bool learns_ = false;           // this launch's write bits are learned from faults
};

}  // namespace spillway::learned
