#include "read_mostly_advisor.h"

#include <algorithm>

namespace spillway::learned {

void ReadMostlyAdvisor::begin_launch(const Launch& launch) {
  writes_known_ = launch.writes_known;
  learns_ = !launch.writes_known && faults_reported_;
  faults_reported_ = false;
}

bool ReadMostlyAdvisor::wanted(const ChunkInfo& info, const SignatureTable& signatures, bool writes_now, bool matched,
                               bool next_reads_only) const {
  bool want = info.read_mostly;
  // Unpredicted: what usually follows a touch by this signature (its next touch writes less
  // often than not), else as it is. (Only where writes are known: not in the shim.)
  if (writes_known_) {
    if (info.sig != kNone && signatures[info.sig].writes >= 0) want = signatures[info.sig].writes < 0.5;
    if (writes_now) want = false;
  }
  // Predicted: read-mostly if neither this touch nor the next writes. Where the launch does
  // not say (the shim), the matched entry's touch tells whether this one writes (its learned
  // bit passed on to this touch); an unmatched launch changes no advice.
  if (matched && (writes_known_ || learns_)) want = !writes_now && next_reads_only;
  // Learned writes: a chunk whose read-mostly copy a write has met since its blocks were
  // allocated is not (or no longer) read-mostly, matched or not; without writes known or
  // learned, no advice stays.
  if (learns_ && info.collapsed) want = false;
  if (!writes_known_ && !learns_) want = false;
  return want;
}

void ReadMostlyAdvisor::apply(ChunkIndex c, ChunkInfo& info, bool want, Actions& actions) {
  if (want == info.read_mostly || info.blocks == 0 || info.end_offset == 0) return;
  const std::uint64_t addr = c * kChunkBytes + info.addr_offset, bytes = info.end_offset - info.addr_offset;
  actions.advise(addr, bytes, want ? Advice::read_mostly : Advice::unset_read_mostly, Location::gpu);
  info.read_mostly = want;
}

void ReadMostlyAdvisor::first_block(ChunkIndex c, const Block& block, ChunkInfo& info, Actions& actions) {
  if (info.read_mostly) {
    const std::uint64_t lo = c * kChunkBytes, from = std::max<std::uint64_t>(block.base, lo),
                        to = std::min<std::uint64_t>(block.end(), lo + kChunkBytes);
    actions.advise(from, to - from, Advice::unset_read_mostly, Location::gpu);
  }
  info.read_mostly = info.collapsed = false;
}

void ReadMostlyAdvisor::write_fault(ChunkInfo& info) {
  if (info.blocks > 0 && info.read_mostly) info.collapsed = true;
}

}  // namespace spillway::learned
