#include "spillway/trace.h"

#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string_view>

#include <fmt/format.h>

namespace spillway::trace {

namespace {

using json = nlohmann::json;

constexpr std::size_t kReadChunk = 1 << 16;

std::string type_name(const json& v) {
  if (v.is_number_float()) return "a fractional number";
  if (v.is_number_integer() && !v.is_number_unsigned()) return "a negative number";
  if (v.is_string()) return "a string";
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "a number";
}

// What the JSON parser must not be given, in a line's bytes: a control byte other than tab
// and carriage return (JSON allows none outside strings, none unescaped inside them; the
// parser would stop at a NUL and accept what comes before it), arrays and objects nested
// deeper than kMaxNesting (copying and printing a parsed value recurse once a level), or
// more than kMaxLineValues values (the parsed line takes 16 bytes a value, and freeing it
// as much again). One pass; what is inside strings does not count. Empty when none.
std::string line_problem(std::string_view text) {
  int depth = 0;
  std::size_t values = 1;  // a bound on the values: the top one, each container's first, one after each comma
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 && c != '\t' && c != '\r') {
      return fmt::format("{} at byte {} of the line (a trace is text: binary or damaged data?)",
                         c == 0 ? std::string("NUL byte") : fmt::format("control byte 0x{:02x}", c), i + 1);
    }
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) return fmt::format("nesting deeper than {}", kMaxNesting);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    if ((c == '[' || c == '{' || c == ',') && ++values > kMaxLineValues) {
      return fmt::format("more than {} values in one line (the format's limit)", kMaxLineValues);
    }
  }
  return {};
}

// `text` cut to `limit` bytes, for an error message: it stays one short line whatever a
// value or the parser's "last read" token holds.
std::string cut(std::string text, std::size_t limit) {
  if (text.size() <= limit) return text;
  std::size_t end = limit - 3;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;  // (not inside a UTF-8 character)
  return text.substr(0, end) + "...";
}

// A value quoted in an error message: its JSON text, cut to 80 bytes.
std::string shown(const json& v) { return cut(v.dump(-1, ' ', false, json::error_handler_t::replace), 80); }

// Frees what `v` holds, children first, so that no destructor allocates: ~basic_json moves
// a container's children into a heap vector (to free deep values without recursion), and a
// bad_alloc there, in a noexcept destructor, is std::terminate. The recursion is bounded:
// only lines nested at most kMaxNesting deep are parsed.
void release(json& v) noexcept {
  if (v.is_array()) {
    for (json& e : v) release(e);
    v.get_ref<json::array_t&>().clear();  // (scalars and empty containers: nothing allocates)
  } else if (v.is_object()) {
    for (auto& [key, e] : v.get_ref<json::object_t&>()) release(e);
    v.get_ref<json::object_t&>().clear();
  }
}

// Releases a parsed line on every way out of its scope.
struct Released {
  json& value;
  ~Released() { release(value); }
};

// Checks `text` (line_problem) and parses it into `out`, in place: a value cut short by a
// syntax error or by memory running out stays in `out`, for its Released to free. Returns
// the problem ("`what`: the parser's message" for malformed JSON), empty when none.
std::string parse_line(const std::string& text, json& out, std::string_view what) {
  if (std::string problem = line_problem(text); !problem.empty()) return problem;
  try {
    nlohmann::detail::json_sax_dom_parser<json> dom(out);  // (what json::parse does, into `out`)
    json::sax_parse(text, &dom);
  } catch (const json::exception& e) {  // parse_error; out_of_range for numbers such as 1e1500
    return fmt::format("{}: {}", what, cut(e.what(), 240));
  }
  return {};
}

}  // namespace

TraceError::TraceError(const std::string& file, std::uint64_t line, const std::string& message)
    : std::runtime_error(line == 0 ? fmt::format("{}: {}", file, message) : fmt::format("{}:{}: {}", file, line, message)),
      file_(file),
      line_(line),
      message_(message) {}

const char* to_string(EventKind kind) {
  switch (kind) {
    case EventKind::alloc: return "alloc";
    case EventKind::free: return "free";
    case EventKind::kernel: return "kernel";
    case EventKind::host: return "host";
    case EventKind::iter: return "iter";
  }
  return "?";
}

// The bytes of a trace file. Plain files are read as they are; gzip files (magic 1f 8b)
// through zlib's inflate, member after member, so that what gzread passes over in silence —
// bytes after the last member that do not start another one (two processes writing one
// file), a member without its trailer (a writer that never closed) — is an error naming the
// byte offset where it is; zstd files (magic 28 b5 2f fd, RFC 8878 §3.1.1) through
// ZSTD_decompressStream, frame after frame, with the same two errors. Errors are
// std::runtime_error with the message alone.
class ByteSource {
 public:
  explicit ByteSource(std::FILE* f) : f_(f), in_(kReadChunk) {
    try {
      gzip_ = byte_at(0) == 0x1f && byte_at(1) == 0x8b;
      zstd_ = byte_at(0) == 0x28 && byte_at(1) == 0xb5 && byte_at(2) == 0x2f && byte_at(3) == 0xfd;
    } catch (...) {
      std::fclose(f_);  // (the destructor does not run when the constructor throws)
      throw;
    }
    if (gzip_ && inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      std::fclose(f_);
      throw std::runtime_error("cannot start zlib's inflate");
    }
    if (zstd_ && (zd_ = ZSTD_createDCtx()) == nullptr) {
      std::fclose(f_);
      throw std::runtime_error("cannot start zstd's decompression");
    }
  }
  ~ByteSource() {
    if (gzip_) inflateEnd(&zs_);
    if (zd_ != nullptr) ZSTD_freeDCtx(zd_);
    std::fclose(f_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Up to `n` bytes into `out`; 0 at the end of the file.
  std::size_t read(char* out, std::size_t n) {
    if (zstd_) return read_zstd(out, n);
    if (!gzip_) {
      if (pos_ == end_ && !refill()) return 0;
      const std::size_t k = std::min(n, end_ - pos_);
      std::memcpy(out, in_.data() + pos_, k);
      pos_ += k;
      return k;
    }
    for (;;) {
      if (member_ended_) {
        if (byte_at(0) < 0) return 0;  // the end, after a whole member
        if (byte_at(0) != 0x1f || byte_at(1) != 0x8b) {
          throw std::runtime_error(fmt::format(
              "damaged gzip stream: the compressed data end at byte {}, and the bytes after them are not another gzip "
              "member (two writers in one file?)",
              offset()));
        }
        inflateReset(&zs_);
        member_ended_ = false;
      }
      if (pos_ == end_ && !refill()) {
        throw std::runtime_error(
            fmt::format("truncated gzip stream: the file ends at byte {} inside compressed data (a writer that never "
                        "closed it?)",
                        offset()));
      }
      zs_.next_in = reinterpret_cast<Bytef*>(in_.data() + pos_);
      zs_.avail_in = static_cast<uInt>(end_ - pos_);
      zs_.next_out = reinterpret_cast<Bytef*>(out);
      zs_.avail_out = static_cast<uInt>(n);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      pos_ = end_ - zs_.avail_in;
      const std::size_t produced = n - zs_.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw std::runtime_error(fmt::format("corrupt gzip data near byte {}: {}", offset(),
                                             zs_.msg != nullptr ? zs_.msg : "inflate failed"));
      }
      if (produced > 0) return produced;
    }
  }

 private:
  // Keeps the unread bytes and reads more after them; false at the end of the file.
  bool refill() {
    if (pos_ > 0) {
      std::memmove(in_.data(), in_.data() + pos_, end_ - pos_);
      consumed_ += pos_;
      end_ -= pos_;
      pos_ = 0;
    }
    if (end_ == in_.size() || eof_) return false;
    const std::size_t got = std::fread(in_.data() + end_, 1, in_.size() - end_, f_);
    if (got == 0) {
      if (std::ferror(f_)) throw std::runtime_error(fmt::format("cannot read at byte {}: {}", offset(), std::strerror(errno)));
      eof_ = true;
      return false;
    }
    end_ += got;
    return true;
  }
  // The unread byte `k` ahead, or -1 past the end of the file.
  int byte_at(std::size_t k) {
    while (pos_ + k >= end_) {
      if (!refill()) return -1;
    }
    return static_cast<unsigned char>(in_[pos_ + k]);
  }
  std::uint64_t offset() const { return consumed_ + pos_; }

  std::FILE* f_;
  std::vector<char> in_;
  std::size_t pos_ = 0, end_ = 0;  // unread input: in_[pos_, end_)
  std::uint64_t consumed_ = 0;     // file bytes before in_[0]
  bool eof_ = false;
  bool gzip_ = false;
  bool member_ended_ = false;
  z_stream zs_{};
  bool zstd_ = false;
  ZSTD_DCtx* zd_ = nullptr;
  std::size_t zstd_pending_ = 0;  // ZSTD_decompressStream's last hint: 0 when a frame has just ended

  std::size_t read_zstd(char* out, std::size_t n) {
    for (;;) {
      // (Called with no input too: the decoder may hold output of input it has taken.)
      ZSTD_inBuffer in{in_.data() + pos_, end_ - pos_, 0};
      ZSTD_outBuffer o{out, n, 0};
      const bool fresh_frame = zstd_pending_ == 0;
      if (in.size > 0 || !fresh_frame) {
        const std::size_t rc = ZSTD_decompressStream(zd_, &o, &in);
        pos_ += in.pos;
        if (ZSTD_isError(rc)) {
          throw std::runtime_error(fresh_frame && offset() > 0
                                       ? fmt::format("damaged zstd stream: the compressed data end at byte {}, and the bytes after "
                                                     "them are not another zstd frame ({})",
                                                     offset() - in.pos, ZSTD_getErrorName(rc))
                                       : fmt::format("corrupt zstd data near byte {}: {}", offset(), ZSTD_getErrorName(rc)));
        }
        zstd_pending_ = rc;
        if (o.pos > 0) return o.pos;
        if (in.pos > 0) continue;
      }
      if (pos_ == end_ && !refill()) {
        if (zstd_pending_ != 0) {
          throw std::runtime_error(fmt::format(
              "truncated zstd stream: the file ends at byte {} inside compressed data (a writer that never closed it?)", offset()));
        }
        return 0;
      }
    }
  }
};

Reader::Reader(const std::string& path) : path_(path), buffer_(kReadChunk) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw TraceError(path, 0, fmt::format("cannot open: {}", std::strerror(errno != 0 ? errno : ENOENT)));
  try {
    source_ = std::make_unique<ByteSource>(f);
  } catch (const std::exception& e) {
    throw TraceError(path, 0, e.what());
  }
  read_header();
}

void Reader::read_header() {
  std::string text;
  if (!read_line(text)) {
    line_ = 1;
    fail("empty file: expected the header {\"format\":\"spillway-trace\",\"version\":1,...} on line 1");
  }
  json h;
  Released free_h{h};
  if (std::string problem = parse_line(text, h, "not a spillway trace: line 1 must be the JSON header "
                                                 "{\"format\":\"spillway-trace\",\"version\":1,...} (malformed JSON in the header)");
      !problem.empty()) {
    fail(problem);
  }
  if (!h.is_object() || !h.contains("format")) {
    fail("missing header: line 1 must be {\"format\":\"spillway-trace\",\"version\":1,...}");
  }
  if (!h["format"].is_string() || h["format"].get<std::string>() != kFormatName) {
    fail(fmt::format("unknown format {}: expected \"spillway-trace\"", shown(h["format"])));
  }
  if (!h.contains("version")) fail("header has no \"version\" (this build reads version 1)");
  const json& v = h["version"];
  if (!v.is_number_unsigned() || v.get<std::uint64_t>() != static_cast<std::uint64_t>(kVersion)) {
    fail(fmt::format("unsupported trace version {} (this build reads version 1)", shown(v)));
  }
  header_ = std::move(h);
}

Reader::~Reader() { release(header_); }

void Reader::fail(const std::string& message) const { throw TraceError(path_, line_, message); }

bool Reader::read_line(std::string& line) {
  line.clear();
  // (Checked before each append: a line of gigabytes inside a small gzip file stops here,
  // holding at most kMaxLineBytes.)
  auto append = [&](const char* start, std::size_t n) {
    if (n > kMaxLineBytes - line.size()) {
      ++line_;
      fail(fmt::format("line longer than {} bytes (16 MiB, the format's limit; binary or damaged data?)", kMaxLineBytes));
    }
    line.append(start, n);
  };
  for (;;) {
    if (buffer_pos_ < buffer_end_) {
      const char* start = buffer_.data() + buffer_pos_;
      const void* nl = std::memchr(start, '\n', buffer_end_ - buffer_pos_);
      if (nl != nullptr) {
        std::size_t n = static_cast<const char*>(nl) - start;
        append(start, n);
        buffer_pos_ += n + 1;
        ++line_;
        return true;
      }
      append(start, buffer_end_ - buffer_pos_);
      buffer_pos_ = buffer_end_;
    }
    if (eof_) {
      if (line.empty()) return false;
      ++line_;
      return true;  // last line without a newline
    }
    std::size_t n = 0;
    try {
      n = source_->read(buffer_.data(), buffer_.size());
    } catch (const std::exception& e) {
      ++line_;
      fail(e.what());
    }
    if (n == 0) eof_ = true;
    buffer_pos_ = 0;
    buffer_end_ = n;
  }
}

namespace {

// A required non-negative integer field.
std::uint64_t get_uint(const json& o, const char* field, const std::function<void(const std::string&)>& fail) {
  auto it = o.find(field);
  if (it == o.end()) fail(fmt::format("missing field \"{}\"", field));
  if (!it->is_number_unsigned()) {
    fail(fmt::format("\"{}\" must be a non-negative integer, not {} ({})", field, type_name(*it), shown(*it)));
  }
  return it->get<std::uint64_t>();
}

}  // namespace

void Reader::parse_ranges(const json& o, const char* field, std::vector<Range>& out) {
  out.clear();
  auto it = o.find(field);
  if (it == o.end() || it->is_null()) return;
  if (!it->is_array()) fail(fmt::format("\"{}\" must be an array of block ids or [id, offset, bytes]", field));
  out.reserve(it->size());
  for (const json& r : *it) {
    Range range;
    if (r.is_number_unsigned()) {
      range.id = r.get<std::uint64_t>();
    } else if (r.is_array()) {
      if (r.size() != 3 || !r[0].is_number_unsigned() || !r[1].is_number_unsigned() || !r[2].is_number_unsigned()) {
        fail(fmt::format("bad range {} in \"{}\": expected [id, offset, bytes], non-negative integers", shown(r), field));
      }
      range.id = r[0].get<std::uint64_t>();
      range.offset = r[1].get<std::uint64_t>();
      range.bytes = r[2].get<std::uint64_t>();
      range.whole = false;
    } else {
      fail(fmt::format("bad entry {} in \"{}\": expected a block id (non-negative integer) or [id, offset, bytes]",
                       shown(r), field));
    }
    auto live = live_.find(range.id);
    if (live == live_.end()) {
      fail(fmt::format("block {} in \"{}\" is not live (used before its alloc or after its free)", range.id, field));
    }
    if (range.whole) {
      range.bytes = live->second;
    } else if (range.bytes == 0 || range.offset > live->second || range.bytes > live->second - range.offset) {
      fail(fmt::format("range [{}, {}, {}] in \"{}\" lies outside block {} ({} bytes)", range.id, range.offset, range.bytes,
                       field, range.id, live->second));
    }
    out.push_back(range);
  }
}

void Reader::parse_event(const std::string& text, Event& ev) {
  json o;
  Released free_o{o};
  if (std::string problem = parse_line(text, o, "malformed JSON"); !problem.empty()) fail(problem);
  if (!o.is_object()) fail("each line must be a JSON object");
  auto kind = o.find("ev");
  if (kind == o.end()) fail("missing field \"ev\" (the event type)");
  if (!kind->is_string()) fail("\"ev\" must be a string");
  const std::string& k = kind->get_ref<const std::string&>();
  ev.line = line_;
  ev.has_addr = false;
  if (k == "alloc") {
    parse_alloc(o, ev);
  } else if (k == "free") {
    parse_free(o, ev);
  } else if (k == "kernel") {
    parse_kernel(o, ev);
  } else if (k == "host") {
    ev.kind = EventKind::host;
    parse_ranges(o, "reads", ev.reads);
    parse_ranges(o, "writes", ev.writes);
  } else if (k == "iter") {
    ev.kind = EventKind::iter;
    ev.n = uint_field(o, "n");
  } else {
    fail(fmt::format("unknown event type \"{}\" (expected alloc, free, kernel, host or iter)", k));
  }
}

std::uint64_t Reader::uint_field(const json& o, const char* field) {
  return get_uint(o, field, [this](const std::string& m) { fail(m); });
}

void Reader::parse_alloc(const json& o, Event& ev) {
  ev.kind = EventKind::alloc;
  ev.id = uint_field(o, "id");
  ev.bytes = uint_field(o, "bytes");
  if (ev.bytes == 0) fail("\"bytes\" must be positive");
  if (ev.bytes > kMaxBlockBytes) fail(fmt::format("\"bytes\" {} exceeds the 16 TiB ({}) a block may have", ev.bytes, kMaxBlockBytes));
  if (auto a = o.find("addr"); a != o.end() && !a->is_null()) {
    ev.addr = uint_field(o, "addr");
    ev.has_addr = true;
  }
  auto s = o.find("kind");
  ev.alloc_kind = (s != o.end() && s->is_string()) ? s->get<std::string>() : std::string();
  s = o.find("site");
  ev.site = (s != o.end() && s->is_string()) ? s->get<std::string>() : std::string();
  if (!live_.emplace(ev.id, ev.bytes).second) fail(fmt::format("block {} is allocated again while still live", ev.id));
}

void Reader::parse_free(const json& o, Event& ev) {
  ev.kind = EventKind::free;
  ev.id = uint_field(o, "id");
  auto it = live_.find(ev.id);
  if (it == live_.end()) fail(fmt::format("free of block {}, which is not live (never allocated or already freed)", ev.id));
  ev.bytes = it->second;
  live_.erase(it);
}

void Reader::parse_kernel(const json& o, Event& ev) {
  ev.kind = EventKind::kernel;
  auto name = o.find("name");
  if (name == o.end()) fail("missing field \"name\"");
  if (!name->is_string()) fail("\"name\" must be a string");
  ev.name = name->get<std::string>();
  ev.dur_ns = parse_duration(o);
  if (ev.dur_ns > kMaxKernelNs) fail(fmt::format("\"dur_ns\" {} exceeds the 2^50 ns (about 13 days) a kernel may take", ev.dur_ns));
  ev.stream = 0;
  if (auto s = o.find("stream"); s != o.end() && !s->is_null()) ev.stream = uint_field(o, "stream");
  parse_ranges(o, "reads", ev.reads);
  parse_ranges(o, "writes", ev.writes);
}

// "dur_ns": a non-negative integer, or a finite non-negative number below 1.8e19, rounded.
std::uint64_t Reader::parse_duration(const json& o) {
  auto dur = o.find("dur_ns");
  if (dur == o.end()) fail("missing field \"dur_ns\"");
  if (dur->is_number_unsigned()) return dur->get<std::uint64_t>();
  if (dur->is_number_float() && std::isfinite(dur->get<double>()) && dur->get<double>() >= 0 && dur->get<double>() < 1.8e19) {
    return static_cast<std::uint64_t>(std::llround(dur->get<double>()));
  }
  fail(fmt::format("\"dur_ns\" must be a non-negative number of nanoseconds, not {} ({})", type_name(*dur), shown(*dur)));
}

bool Reader::next(Event& event) {
  std::string text;
  for (;;) {
    if (!read_line(text)) return false;
    // Blank lines (e.g. a trailing one) are allowed.
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    parse_event(text, event);
    return true;
  }
}

std::uint64_t Reader::live_bytes(std::uint64_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? 0 : it->second;
}

Trace read_trace(const std::string& path) {
  Reader reader(path);
  Trace t;
  t.path = path;
  t.header = reader.header();
  Event ev;
  while (reader.next(ev)) t.events.push_back(ev);
  return t;
}

// ---- writing ----

json to_json(const Event& e) {
  json o;
  o["ev"] = to_string(e.kind);
  auto ranges = [](const std::vector<Range>& rs) {
    json a = json::array();
    for (const Range& r : rs) {
      if (r.whole) a.push_back(r.id);
      else a.push_back(json::array({r.id, r.offset, r.bytes}));
    }
    return a;
  };
  switch (e.kind) {
    case EventKind::alloc:
      o["id"] = e.id;
      o["bytes"] = e.bytes;
      if (e.has_addr) o["addr"] = e.addr;
      if (!e.alloc_kind.empty()) o["kind"] = e.alloc_kind;
      if (!e.site.empty()) o["site"] = e.site;
      break;
    case EventKind::free: o["id"] = e.id; break;
    case EventKind::kernel:
      o["name"] = e.name;
      o["dur_ns"] = e.dur_ns;
      o["reads"] = ranges(e.reads);
      o["writes"] = ranges(e.writes);
      if (e.stream != 0) o["stream"] = e.stream;
      break;
    case EventKind::host:
      o["reads"] = ranges(e.reads);
      o["writes"] = ranges(e.writes);
      break;
    case EventKind::iter: o["n"] = e.n; break;
  }
  return o;
}

// Where the Writer's bytes go: gzip or plain through zlib's gzFile, zstd through a
// ZSTD_CCtx into a FILE.
class Writer::Sink {
 public:
  virtual ~Sink() = default;
  virtual bool write(const char* data, std::size_t n) = 0;
  virtual std::string close() = 0;  // the error, empty when the file is whole
};

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class GzSink final : public Writer::Sink {
 public:
  explicit GzSink(gzFile f) : f_(f) {}
  ~GzSink() override {
    if (f_ != nullptr) gzclose(f_);
  }
  bool write(const char* data, std::size_t n) override {
    return gzwrite(f_, data, static_cast<unsigned>(n)) == static_cast<int>(n);
  }
  std::string close() override {
    const int rc = gzclose(f_);
    f_ = nullptr;
    return rc == Z_OK ? std::string() : fmt::format("closing failed (zlib error {})", rc);
  }

 private:
  gzFile f_;
};

// zstd level 3 (zstd's default: about gzip -6's ratio on these files at several times its
// speed), one frame, its content checksum on.
class ZstdSink final : public Writer::Sink {
 public:
  ZstdSink(std::FILE* f, ZSTD_CCtx* c) : f_(f), c_(c), out_(ZSTD_CStreamOutSize()) {}
  ~ZstdSink() override {
    if (c_ != nullptr) ZSTD_freeCCtx(c_);
    if (f_ != nullptr) std::fclose(f_);
  }
  bool write(const char* data, std::size_t n) override {
    ZSTD_inBuffer in{data, n, 0};
    while (in.pos < in.size) {
      if (!step(&in, ZSTD_e_continue)) return false;
    }
    return true;
  }
  std::string close() override {
    ZSTD_inBuffer in{nullptr, 0, 0};
    bool ok = true;
    for (;;) {
      std::size_t left = 0;
      if (!step(&in, ZSTD_e_end, &left)) {
        ok = false;
        break;
      }
      if (left == 0) break;
    }
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    ZSTD_freeCCtx(c_);
    c_ = nullptr;
    return ok && closed ? std::string() : std::string("closing failed (zstd or write error)");
  }

 private:
  bool step(ZSTD_inBuffer* in, ZSTD_EndDirective mode, std::size_t* left = nullptr) {
    ZSTD_outBuffer o{out_.data(), out_.size(), 0};
    const std::size_t rc = ZSTD_compressStream2(c_, &o, in, mode);
    if (ZSTD_isError(rc)) return false;
    if (left != nullptr) *left = rc;
    return std::fwrite(out_.data(), 1, o.pos, f_) == o.pos;
  }
  std::FILE* f_;
  ZSTD_CCtx* c_;
  std::vector<char> out_;
};

}  // namespace

Writer::Writer(const std::string& path) : path_(path) {
  if (ends_with(path, ".zst") || ends_with(path, ".zstd")) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
    ZSTD_CCtx* c = ZSTD_createCCtx();
    if (c == nullptr || ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1))) {
      if (c != nullptr) ZSTD_freeCCtx(c);
      std::fclose(f);
      throw std::runtime_error(fmt::format("{}: cannot start zstd's compression", path));
    }
    sink_ = std::make_unique<ZstdSink>(f, c);
    return;
  }
  gzFile f = gzopen(path.c_str(), ends_with(path, ".gz") ? "wb6" : "wbT");
  if (f == nullptr) throw std::runtime_error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  sink_ = std::make_unique<GzSink>(f);
}

Writer::~Writer() = default;

void Writer::write_raw(const std::string& line) {
  if (!sink_) throw std::runtime_error(fmt::format("{}: write after close", path_));
  std::string s = line + "\n";
  if (!sink_->write(s.data(), s.size())) throw std::runtime_error(fmt::format("{}: write failed", path_));
}

void Writer::write_header(const std::string& source, const json& extra) {
  json h = json::object();
  h["format"] = kFormatName;
  h["version"] = kVersion;
  h["source"] = source;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (it.key() != "format" && it.key() != "version") h[it.key()] = it.value();
    }
  }
  write_raw(h.dump());
}

void Writer::write(const Event& event) { write_raw(to_json(event).dump()); }

void Writer::close() {
  if (!sink_) return;
  const std::string err = sink_->close();
  sink_.reset();
  if (!err.empty()) throw std::runtime_error(fmt::format("{}: {}", path_, err));
}

}  // namespace spillway::trace
