// The records `learned` (learned.h) keeps and its parts share: one per 2 MiB chunk
// (ChunkInfo), one per launch in the history (Entry) and one per chunk an entry touches
// (Touch). Plain data: indices are into the history (launch_history.h), launch seqs are
// Launch::seq. Not thread-safe (the Engine serialises the policy's calls).
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "spillway/chunk_pages.h"
#include "spillway/policy.h"

namespace spillway::learned {

inline constexpr std::uint32_t kNone = UINT32_MAX;     // "no index"
inline constexpr std::uint64_t kFar = UINT64_MAX / 4;  // "no predicted use" (a launch seq)
inline constexpr std::uint8_t kNoAge = 255;            // "no prefetch awaiting its use"

struct ChunkInfo;
// Resident chunks by (predicted next use, chunk), each with its record.
using RankedSet = std::map<std::pair<std::uint64_t, ChunkIndex>, ChunkInfo*>;

struct Touch {
  ChunkIndex chunk;
  ChunkInfo* info;     // its record (records are never erased: the address is stable)
  std::uint32_t next;  // index of the next touch of this chunk, or kNone
  std::uint32_t entry; // history entry holding this touch
  bool fresh;          // the chunk's block was allocated since its previous touch
  bool write;          // the launch writes the chunk (Launch::writes_known, or a write fault)
};

struct Entry {
  std::uint64_t exec_id;
  std::uint32_t touch_begin, touch_end;  // its touches: [touch_begin, touch_end)
};

// Everything known about one 2 MiB chunk, in one cache line (one miss per touch).
struct alignas(64) ChunkInfo {
  std::uint32_t last_touch = kNone;  // index of its last touch
  std::uint32_t blocks = 0;          // live blocks on it
  std::uint32_t addr_offset = 0;     // an address inside one of them, from the chunk's start (for Actions::prefetch)
  std::uint32_t end_offset = 0;      // end of that block's part of the chunk, same origin (for Actions::advise); 0: none known
  std::uint32_t sig = kNone;         // signature of its last touch (signature_table.h), kNone: none since allocated
  // (Bit-fields: the record stays one cache line.)
  bool allocated : 1 = false;        // a block was allocated on it since its last touch
  bool advised : 1 = false;          // remote-access advice set on the live block here
  bool resident : 1 = false;         // in the Engine's plan (Policy::on_residency)
  bool read_mostly : 1 = false;      // read-mostly advice set on the live block here
  bool collapsed : 1 = false;        // a write met its read-mostly copy while its blocks live (learned writes: never advised again)
  std::uint8_t pf_age = kNoAge;      // anchor age (streak) of the prefetch awaiting its use
  std::uint64_t remote = 0;          // plan stamp of the launch that leaves it remote
  std::uint64_t nu = kFar;           // predicted next use (launch seq)
  std::uint64_t mark = 0;            // plan stamp + Mark while this launch's plan holds it
  std::uint64_t last_seq = 0;        // launch seq of its last touch
  RankedSet::iterator rank{};        // its node in the ranking (resident_ranking.h), while resident
};
static_assert(sizeof(ChunkInfo) == 64, "a chunk's record is one cache line");

// Records by chunk, 512 (1 GiB of address space) to a page; never freed, so a record's
// address is stable (Touch::info, RankedSet).
using ChunkRecords = ChunkPages<ChunkInfo, 9>;

// What a launch's plan holds a chunk for: ChunkInfo::mark = the plan's stamp + this. The
// stamp advances by 4 per launch, so any mark above it is this launch's.
enum Mark : std::uint64_t { kCurrent = 1, kPlanned = 2, kKept = 3 };

}  // namespace spillway::learned
