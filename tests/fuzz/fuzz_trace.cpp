// libFuzzer target: the trace reader (uvm/include/spillway/trace.h). The input is written to
// a file (plain, or gzip when it starts with the gzip magic) and read to the end. The reader
// may only ever throw TraceError; any other exception, a crash or a hang is a bug. Events it
// accepts must be self-consistent: ranges lie inside live blocks, line numbers increase; a
// plain input it reads to the end keeps the format's limits on text (trace.h: no control
// byte but tab, CR and LF; no line over kMaxLineBytes).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "spillway/trace.h"

namespace {
// Whether `data` (not gzip, not zstd) keeps trace.h's limits on a line's bytes.
bool plain_text_within_limits(const std::uint8_t* data, std::size_t size) {
  std::size_t line = 0;
  for (std::size_t i = 0; i < size; ++i) {
    const std::uint8_t c = data[i];
    if (c == '\n') {
      line = 0;
      continue;
    }
    if ((c < 0x20 && c != '\t' && c != '\r') || ++line > spillway::trace::kMaxLineBytes) return false;
  }
  return true;
}

bool compressed(const std::uint8_t* data, std::size_t size) {
  return (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) ||
         (size >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd);
}

// The most lines `data` can hold once read: a line number counts the decompressed text. A
// plain input has at most 1 + size lines; deflate expands at most 1032:1 (zlib's "technical
// details", maximum compression factor), so a gzip input at most 1 + 1032 * size; zstd has
// no such small bound (a run-length block), so it is not bounded here.
std::uint64_t max_lines(const std::uint8_t* data, std::size_t size) {
  if (!compressed(data, size)) return 1 + size;
  if (data[0] == 0x1f) return 1 + 1032 * static_cast<std::uint64_t>(size);
  return UINT64_MAX;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_trace: invariant failed: %s\n", what);
    std::abort();
  }
}

const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string p = std::string(dir && *dir ? dir : "/tmp") + "/spillway-fuzz-trace-" + std::to_string(getpid());
    return p;
  }();
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string& path = scratch_path();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  try {
    spillway::trace::Reader reader(path);
    spillway::trace::Event ev;
    std::uint64_t last_line = 1;
    while (reader.next(ev)) {
      check(ev.line > last_line, "event line numbers do not increase");
      last_line = ev.line;
      // Only the fields of the event's kind are meaningful (trace.h): a free or iter event
      // may still carry the ranges of an earlier event.
      bool has_ranges = ev.kind == spillway::trace::EventKind::kernel || ev.kind == spillway::trace::EventKind::host;
      for (const auto* ranges : {&ev.reads, &ev.writes}) {
        if (!has_ranges) break;
        for (const auto& r : *ranges) {
          std::uint64_t live = reader.live_bytes(r.id);
          // live_bytes is 0 both for a block that is not live and for a live 0-byte block.
          check(r.offset <= live && r.bytes <= live - r.offset, "an accepted range lies outside its block");
        }
      }
      nlohmann::json j = spillway::trace::to_json(ev);  // must not throw either
      (void)j.dump();
    }
    check(compressed(data, size) || plain_text_within_limits(data, size),
          "a plain input with a control byte or an overlong line was read to its end");
  } catch (const spillway::trace::TraceError& e) {
    check(e.line() <= max_lines(data, size), "a TraceError names a line past the end of the input");
  }
  std::remove(path.c_str());
  return 0;
}
