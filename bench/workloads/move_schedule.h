// A schedule of move calls written by `spillway replay --calls FILE` (one JSON object a line,
// keys in the order cli/sim_commands.cpp's write_calls gives them), read back by
// `spillway-linkbench --schedule` to replay on a real GPU what the simulator charged
// (docs/simulator.md, "Move calls"). Host-only code: the CUDA part is in linkbench.cu.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace move_schedule {

inline constexpr std::uint64_t kChunk = 2ull << 20;

struct Call {
  bool to_gpu = true;
  std::uint64_t offset = 0, bytes = 0;  // the call's range from the arena's start
  std::uint64_t copied_chunks = 0;
  std::uint64_t charged_ns = 0;         // what the simulator charged the call
  std::uint64_t flat_ns = 0;            // the same chunks as 2 MiB calls
  std::uint64_t batch = 0;              // the batched prefetch it is a range of (0: a call of its own)
};

struct Schedule {
  std::vector<Call> calls;              // those replayed, in order
  std::uint64_t skipped = 0;            // calls past the replayed memory or the byte limit
  std::uint64_t charged_ns = 0, flat_ns = 0, copied_bytes = 0;
  std::uint64_t h2d_calls = 0, d2h_calls = 0;
  std::uint64_t batches = 0;            // batched prefetches among the calls (their ranges count as calls)
  std::string error;                    // "line N: why" when the file is not a schedule
};

// One line of the file, or false. `batch` may be missing (files written before batches: 0).
// (Whole lines only: no sign, the closing brace, nothing after it but the newline; a range
// whose end would pass 2^64 is refused.)
inline bool parse_call(const char* line, Call& c) {
  if (std::strchr(line, '-') != nullptr) return false;
  char to[8] = {};
  unsigned long long off, bytes, copied, issue, charged, flat, batch = 0;
  int end = -1, n = 0;
  const char* head = "{\"to\": \"%7[a-z]\", \"offset\": %llu, \"bytes\": %llu, \"copied_chunks\": %llu, "
                     "\"issue_ns\": %llu, \"charged_ns\": %llu, \"flat_ns\": %llu";
  n = std::sscanf(line, (std::string(head) + ", \"batch\": %llu}%n").c_str(), to, &off, &bytes, &copied, &issue, &charged, &flat,
                  &batch, &end);
  if (n != 8) {
    end = -1;
    n = std::sscanf(line, (std::string(head) + "}%n").c_str(), to, &off, &bytes, &copied, &issue, &charged, &flat, &end) + 1;
  }
  if (n != 8 || end < 0 || (line[end] != '\0' && line[end] != '\n')) return false;
  if (bytes == 0 || off > ~0ull - bytes || copied > (~0ull >> 22)) return false;
  if (std::string(to) != "gpu" && std::string(to) != "cpu") return false;
  if (batch != 0 && std::string(to) != "gpu") return false;  // (only prefetches toward the GPU are batched)
  c = Call{std::string(to) == "gpu", off, bytes, copied, charged, flat, batch};
  return true;
}

// Reads `path`: the calls whose range lies within the first `memory_bytes` (the managed
// memory the replay holds), in order, until `max_copied_bytes` of copied chunks have been
// taken; the others are counted as skipped.
inline Schedule read(const char* path, std::uint64_t memory_bytes, std::uint64_t max_copied_bytes) {
  Schedule s;
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) {
    s.error = std::string("cannot open ") + path;
    return s;
  }
  char line[512];
  for (unsigned long n = 1; std::fgets(line, sizeof line, f) != nullptr; ++n) {
    Call c;
    if (!parse_call(line, c)) {
      s.error = std::string(path) + ":" + std::to_string(n) + ": not a move call of spillway replay --calls";
      break;
    }
    if (c.offset > memory_bytes || c.bytes > memory_bytes - c.offset || s.copied_bytes >= max_copied_bytes) {
      ++s.skipped;
      continue;
    }
    if (c.batch != 0 && (s.calls.empty() || s.calls.back().batch != c.batch)) ++s.batches;
    s.calls.push_back(c);
    s.charged_ns += c.charged_ns;
    s.flat_ns += c.flat_ns;
    s.copied_bytes += c.copied_chunks * kChunk;
    ++(c.to_gpu ? s.h2d_calls : s.d2h_calls);
  }
  std::fclose(f);
  return s;
}

// The calls [i, end) of one batched prefetch: `end` is past the last consecutive call of
// calls[i]'s batch (i + 1 for a call of its own).
inline std::size_t batch_end(const std::vector<Call>& calls, std::size_t i) {
  std::size_t j = i + 1;
  while (calls[i].batch != 0 && j < calls.size() && calls[j].batch == calls[i].batch) ++j;
  return j;
}

// The call's range as 2 MiB pieces (each within one 2 MiB chunk), as the Engine issued moves
// before it grouped them into runs: (offset, bytes) pairs.
inline std::vector<std::pair<std::uint64_t, std::uint64_t>> chunk_pieces(const Call& c) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (std::uint64_t a = c.offset, end = c.offset + c.bytes; a < end;) {
    const std::uint64_t next = std::min(end, (a / kChunk + 1) * kChunk);
    out.emplace_back(a, next - a);
    a = next;
  }
  return out;
}

}  // namespace move_schedule
