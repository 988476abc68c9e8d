// Trace format v1 (docs/trace-format.md): one JSON object per line, plain or
// gzip-compressed. Line 1 is the header {"format":"spillway-trace","version":1,...}; every
// other line is one event: alloc, free, kernel, host or iter. Unknown fields are ignored.
//
// The Reader streams a trace and checks it as it goes: every problem is a TraceError whose
// message names the file and the line ("FILE:LINE: what is wrong"). The Writer produces the
// same format (gzip when the path ends in ".gz").
//
// Neither class is thread-safe; separate instances may be used from separate threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace spillway::trace {

inline constexpr int kVersion = 1;
// Limits a line must keep (larger values are errors that name the line): a block of at most
// 16 TiB, a kernel of at most 2^50 ns (about 13 days). They keep every size and time the
// simulator derives within 64 bits.
inline constexpr std::uint64_t kMaxBlockBytes = 1ull << 44;
inline constexpr std::uint64_t kMaxKernelNs = 1ull << 50;
// Limits on a line's text, checked before it is parsed (docs/trace-format.md): at most
// kMaxLineBytes bytes (16 MiB, the `\n` not counted; the largest lines the shim and the
// converters write are a few KiB), at most kMaxLineValues JSON values (array elements,
// object members and the containers themselves: 2^20, a kernel reading 250 000 ranges),
// arrays and objects nested at most kMaxNesting deep (an event needs 3), and no control
// byte other than tab and carriage return (a NUL is binary or damaged data, never text).
// They keep the reader's memory (under 100 MB for the worst line) and stack bounded
// whatever the file holds.
inline constexpr std::size_t kMaxLineBytes = std::size_t{16} << 20;
inline constexpr std::size_t kMaxLineValues = std::size_t{1} << 20;
inline constexpr int kMaxNesting = 64;
inline constexpr const char* kFormatName = "spillway-trace";

// A malformed or unreadable trace. what() is "FILE:LINE: message" (LINE counts from 1; 0
// when the file could not be opened at all, then "FILE: message").
class TraceError : public std::runtime_error {
 public:
  TraceError(const std::string& file, std::uint64_t line, const std::string& message);
  const std::string& file() const { return file_; }
  std::uint64_t line() const { return line_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_;
  std::uint64_t line_;
  std::string message_;
};

enum class EventKind { alloc, free, kernel, host, iter };
const char* to_string(EventKind kind);

// Part of a block a kernel or the host touches: [offset, offset + bytes) of block `id`.
// A bare id in the trace means the whole block (offset 0, bytes = the block's size).
struct Range {
  std::uint64_t id = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool whole = true;  // written as a bare id
};

// One trace line. Only the fields of `kind` are meaningful:
//   alloc:  id, bytes, addr (has_addr), alloc_kind, site
//   free:   id
//   kernel: name, dur_ns, reads, writes, stream
//   host:   reads, writes
//   iter:   n
struct Event {
  EventKind kind = EventKind::iter;
  std::uint64_t line = 0;   // line number in the file (1 = header)
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  std::uint64_t addr = 0;
  bool has_addr = false;
  std::string alloc_kind;   // free text, e.g. "activation", "weight"
  std::string site;
  std::string name;         // kernel name
  std::uint64_t dur_ns = 0; // kernel duration in ns
  std::uint64_t stream = 0;
  std::uint64_t n = 0;      // iteration number
  std::vector<Range> reads;
  std::vector<Range> writes;
};

class ByteSource;  // trace.cpp: the file's bytes, inflated when it is gzip

// Streaming reader. The constructor opens the file (plain, gzip or zstd, detected from the
// content; a gzip file may hold several members, as concatenated gzip files do, but nothing
// else: bytes after the last member that are not one, or a member cut short, are an error
// that names the byte offset) and reads and checks the header; next() returns events one at a time. Checks:
// malformed JSON, a truncated or corrupt file, a missing/unknown header or version, unknown
// event types, missing fields, negative, fractional or non-numeric sizes, ids and durations,
// ids used before their alloc or after their free, duplicate live ids, ranges outside their
// block, a line over kMaxLineBytes or kMaxLineValues, nesting over kMaxNesting, control
// bytes. Throws TraceError on the first problem (std::bad_alloc only when memory runs out).
// Memory: one line of at most kMaxLineBytes, its parsed JSON and the table of live blocks.
class Reader {
 public:
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The header object as written (line 1), including producer-specific fields.
  const nlohmann::json& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Reads the next event into `event`; false at the end of the trace. Throws TraceError.
  bool next(Event& event);
  // Bytes of the block `id` if it is live at this point of the trace, else 0.
  std::uint64_t live_bytes(std::uint64_t id) const;

 private:
  bool read_line(std::string& line);
  void read_header();
  [[noreturn]] void fail(const std::string& message) const;
  // parse_event's steps: an event of each kind with fields, a required non-negative
  // integer field, a kernel's duration.
  void parse_event(const std::string& text, Event& event);
  void parse_alloc(const nlohmann::json& object, Event& event);
  void parse_free(const nlohmann::json& object, Event& event);
  void parse_kernel(const nlohmann::json& object, Event& event);
  std::uint64_t uint_field(const nlohmann::json& object, const char* field);
  std::uint64_t parse_duration(const nlohmann::json& object);
  void parse_ranges(const nlohmann::json& object, const char* field, std::vector<Range>& out);

  std::string path_;
  std::unique_ptr<ByteSource> source_;
  std::vector<char> buffer_;
  std::size_t buffer_pos_ = 0;
  std::size_t buffer_end_ = 0;
  bool eof_ = false;
  std::uint64_t line_ = 0;
  nlohmann::json header_;
  std::unordered_map<std::uint64_t, std::uint64_t> live_;  // id -> bytes
};

// Reads the whole trace into memory. Throws TraceError.
struct Trace {
  std::string path;
  nlohmann::json header;
  std::vector<Event> events;
};
Trace read_trace(const std::string& path);

// Streaming writer. The path's suffix selects the compression: ".gz" gzip (zlib), ".zst" or
// ".zstd" zstd (libzstd, level 3), anything else none. write_header() must come first.
// Throws std::runtime_error when the file cannot be written.
class Writer {
 public:
  explicit Writer(const std::string& path);
  ~Writer();  // closes (errors on close are lost: call close() to see them)
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Writes line 1: `extra` (an object, may be empty) plus format, version and source.
  void write_header(const std::string& source, const nlohmann::json& extra = nlohmann::json::object());
  void write(const Event& event);
  // Writes one raw line (no newline in `line`); for tests that need malformed traces.
  void write_raw(const std::string& line);
  void close();
  class Sink;  // trace.cpp

 private:
  std::string path_;
  std::unique_ptr<Sink> sink_;
};

// The JSON object of one event, as the Writer writes it.
nlohmann::json to_json(const Event& event);

}  // namespace spillway::trace
