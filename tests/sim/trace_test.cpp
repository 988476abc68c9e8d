// Trace format v1: round trips and one test per kind of malformed input.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "spillway/trace.h"

namespace spillway::trace {
namespace {

namespace fs = std::filesystem;

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spillway-trace-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  static std::string header() { return "{\"format\":\"spillway-trace\",\"version\":1,\"source\":\"test\"}\n"; }

  // Writes `name` (compressed as its suffix says) with a header and `events` allocs, block
  // i + 1 of 100 + i * `growth` bytes; returns the file's bytes.
  std::string write_allocs(const std::string& name, int events, std::uint64_t growth) {
    std::string path = (dir_ / name).string();
    Writer w(path);
    w.write_header("t");
    for (int i = 0; i < events; ++i) {
      Event a;
      a.kind = EventKind::alloc;
      a.id = static_cast<std::uint64_t>(i + 1);
      a.bytes = 100 + growth * static_cast<std::uint64_t>(i);
      w.write(a);
    }
    w.close();
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // Reads `body` (after a valid header) and returns the error message, "" if none.
  std::string error_of(const std::string& body, bool with_header = true) {
    std::string path = write("t.jsonl", (with_header ? header() : "") + body);
    try {
      read_trace(path);
    } catch (const TraceError& e) {
      last_line_ = e.line();
      EXPECT_EQ(std::string(e.what()).rfind(path + ":", 0), 0u) << e.what();
      return e.message();
    }
    return "";
  }
  fs::path dir_;
  std::uint64_t last_line_ = 0;
};

TEST_F(TraceTest, RoundTripPlainAndGzip) {
  for (const char* name : {"rt.jsonl", "rt.jsonl.gz"}) {
    std::string path = (dir_ / name).string();
    {
      Writer w(path);
      w.write_header("unit test", {{"extra", 7}});
      Event a;
      a.kind = EventKind::alloc;
      a.id = 3;
      a.bytes = 5 << 20;
      a.alloc_kind = "weight";
      w.write(a);
      Event k;
      k.kind = EventKind::kernel;
      k.name = "gemm";
      k.dur_ns = 1234;
      k.reads = {Range{3, 0, 5 << 20, true}};
      k.writes = {Range{3, 4096, 8192, false}};
      w.write(k);
      Event f;
      f.kind = EventKind::free;
      f.id = 3;
      w.write(f);
      w.close();
    }
    Trace t = read_trace(path);
    EXPECT_EQ(t.header["extra"], 7);
    EXPECT_EQ(t.header["source"], "unit test");
    ASSERT_EQ(t.events.size(), 3u);
    EXPECT_EQ(t.events[0].kind, EventKind::alloc);
    EXPECT_EQ(t.events[0].alloc_kind, "weight");
    EXPECT_EQ(t.events[1].name, "gemm");
    EXPECT_EQ(t.events[1].dur_ns, 1234u);
    ASSERT_EQ(t.events[1].reads.size(), 1u);
    EXPECT_TRUE(t.events[1].reads[0].whole);
    EXPECT_EQ(t.events[1].reads[0].bytes, 5u << 20);
    EXPECT_EQ(t.events[1].writes[0].offset, 4096u);
    EXPECT_EQ(t.events[1].line, 3u);
    EXPECT_EQ(t.events[2].kind, EventKind::free);
  }
}

TEST_F(TraceTest, UnknownFieldsAndBlankLinesAreIgnored) {
  EXPECT_EQ(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":10,\"color\":\"red\"}\n\n"
                     "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1.5,\"reads\":[1],\"writes\":[],\"x\":[1,2]}\n"),
            "");
}

TEST_F(TraceTest, MissingFile) {
  try {
    Reader r((dir_ / "nope.jsonl").string());
    FAIL();
  } catch (const TraceError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.jsonl: cannot open"), std::string::npos) << e.what();
  }
}

TEST_F(TraceTest, EmptyFile) {
  EXPECT_NE(error_of("", false).find("empty file"), std::string::npos);
  EXPECT_EQ(last_line_, 1u);
}

TEST_F(TraceTest, MissingHeader) {
  EXPECT_NE(error_of("{\"ev\":\"iter\",\"n\":0}\n", false).find("missing header"), std::string::npos);
}

TEST_F(TraceTest, UnknownFormat) {
  EXPECT_NE(error_of("{\"format\":\"chrome\",\"version\":1}\n", false).find("unknown format"), std::string::npos);
}

TEST_F(TraceTest, MissingVersion) {
  EXPECT_NE(error_of("{\"format\":\"spillway-trace\"}\n", false).find("no \"version\""), std::string::npos);
}

TEST_F(TraceTest, UnknownVersion) {
  EXPECT_NE(error_of("{\"format\":\"spillway-trace\",\"version\":2}\n", false).find("unsupported trace version 2"),
            std::string::npos);
}

TEST_F(TraceTest, MalformedJson) {
  EXPECT_NE(error_of("{\"ev\":\"iter\",\"n\":0}\n{\"ev\":\"alloc\",\"id\":1,\n").find("malformed JSON"), std::string::npos);
  EXPECT_EQ(last_line_, 3u);
}

TEST_F(TraceTest, TruncatedPlainFileEndsMidLine) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":10}\n{\"ev\":\"ker").find("malformed JSON"), std::string::npos);
  EXPECT_EQ(last_line_, 3u);
}

TEST_F(TraceTest, TruncatedGzip) {
  std::string full = (dir_ / "full.jsonl.gz").string();
  {
    Writer w(full);
    w.write_header("t");
    for (int i = 0; i < 2000; ++i) {
      Event a;
      a.kind = EventKind::alloc;
      a.id = static_cast<std::uint64_t>(i);
      a.bytes = 100 + static_cast<std::uint64_t>(i);
      w.write(a);
    }
    w.close();
  }
  std::ifstream in(full, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string cut = (dir_ / "cut.jsonl.gz").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  try {
    read_trace(cut);
    FAIL() << "a truncated gzip file was accepted";
  } catch (const TraceError& e) {
    EXPECT_GT(e.line(), 1u);
    EXPECT_TRUE(e.message().find("truncated") != std::string::npos || e.message().find("malformed JSON") != std::string::npos)
        << e.what();
  }
}

// What two processes writing one trace leave — a whole gzip member and,
// after it, bytes that are not another member — is rejected, naming the byte offset where the
// compressed data end; a member cut short is rejected as truncated. Members concatenated
// whole (as `cat a.gz b.gz` makes) are one stream.
TEST_F(TraceTest, GzipWithTrailingGarbageIsRejectedNamingTheOffset) {
  auto gz_trace = [&](const std::string& name, int events) { return write_allocs(name, events, 0); };
  const std::string whole = gz_trace("a.jsonl.gz", 3);
  const std::string garbage = "\x78\x9c\x01\x02 not a gzip member at all";
  std::string damaged = (dir_ / "damaged.jsonl.gz").string();
  std::ofstream(damaged, std::ios::binary) << whole << garbage;
  try {
    read_trace(damaged);
    FAIL() << "trailing garbage after a gzip member was accepted";
  } catch (const TraceError& e) {
    EXPECT_NE(e.message().find("damaged gzip stream"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("byte " + std::to_string(whole.size())), std::string::npos) << e.what();
  }
  // The header-only member a second process left at the start, then the first's bytes.
  std::string overwritten = (dir_ / "overwritten.jsonl.gz").string();
  const std::string header_only = gz_trace("h.jsonl.gz", 0);
  std::string other = gz_trace("b.jsonl.gz", 200);
  std::ofstream(overwritten, std::ios::binary) << header_only << other.substr(header_only.size());
  EXPECT_THROW(read_trace(overwritten), TraceError);

  std::string concatenated = (dir_ / "cat.jsonl.gz").string();
  {
    Writer w(concatenated);
    w.write_header("t");
    w.close();
  }
  std::string rest = (dir_ / "rest.jsonl.gz").string();
  {
    Writer w(rest);
    w.write_raw("{\"ev\":\"alloc\",\"id\":9,\"bytes\":10}");
    w.close();
  }
  std::ifstream r1(concatenated, std::ios::binary), r2(rest, std::ios::binary);
  std::string both = std::string((std::istreambuf_iterator<char>(r1)), std::istreambuf_iterator<char>()) +
                     std::string((std::istreambuf_iterator<char>(r2)), std::istreambuf_iterator<char>());
  std::ofstream(concatenated, std::ios::binary | std::ios::trunc) << both;
  Trace t = read_trace(concatenated);
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.events[0].id, 9u);
}

TEST_F(TraceTest, GzipCutInsideAMemberIsTruncated) {
  std::string path = (dir_ / "c.jsonl.gz").string();
  {
    Writer w(path);
    w.write_header("t");
    w.close();
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string cut = (dir_ / "cut2.jsonl.gz").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 4);  // no length trailer
  try {
    read_trace(cut);
    FAIL() << "a gzip member without its trailer was accepted";
  } catch (const TraceError& e) {
    EXPECT_NE(e.message().find("truncated gzip stream"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("byte " + std::to_string(bytes.size() - 4)), std::string::npos) << e.what();
  }
}

// ".zst" writes zstd, read back by content (RFC 8878 frames), with the
// same checks as gzip: a frame cut short is truncated, bytes after the last frame that are
// not another frame name the offset, frames concatenated whole are one stream.
TEST_F(TraceTest, ZstdRoundTripsAndIsCheckedAsGzipIs) {
  auto zst_trace = [&](const std::string& name, int events) { return write_allocs(name, events, 1); };
  const std::string whole = zst_trace("z.jsonl.zst", 5000);
  ASSERT_GE(whole.size(), 4u);
  EXPECT_EQ(whole.substr(0, 4), std::string("\x28\xb5\x2f\xfd", 4));  // a zstd frame, not plain text
  Trace t = read_trace((dir_ / "z.jsonl.zst").string());
  ASSERT_EQ(t.events.size(), 5000u);
  EXPECT_EQ(t.events[4999].bytes, 5099u);
  EXPECT_EQ(t.header["source"], "t");

  std::string cut = (dir_ / "cut.jsonl.zst").string();
  std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() - 3);
  try {
    read_trace(cut);
    FAIL() << "a zstd frame cut short was accepted";
  } catch (const TraceError& e) {
    EXPECT_TRUE(e.message().find("truncated zstd stream") != std::string::npos || e.message().find("malformed JSON") != std::string::npos)
        << e.what();
  }
  std::string damaged = (dir_ / "damaged.jsonl.zst").string();
  std::ofstream(damaged, std::ios::binary) << whole << "not a zstd frame at all";
  try {
    read_trace(damaged);
    FAIL() << "trailing garbage after a zstd frame was accepted";
  } catch (const TraceError& e) {
    EXPECT_NE(e.message().find("damaged zstd stream"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("byte " + std::to_string(whole.size())), std::string::npos) << e.what();
  }
  std::string header_only = zst_trace("h.jsonl.zst", 0);
  std::string rest = (dir_ / "rest.jsonl.zst").string();
  {
    Writer w(rest);
    w.write_raw("{\"ev\":\"alloc\",\"id\":9,\"bytes\":10}");
    w.close();
  }
  std::ifstream r2(rest, std::ios::binary);
  std::string cat = (dir_ / "cat.jsonl.zst").string();
  std::ofstream(cat, std::ios::binary) << header_only << std::string((std::istreambuf_iterator<char>(r2)), std::istreambuf_iterator<char>());
  Trace both = read_trace(cat);
  ASSERT_EQ(both.events.size(), 1u);
  EXPECT_EQ(both.events[0].id, 9u);
}

TEST_F(TraceTest, NotAnObject) { EXPECT_NE(error_of("[1,2]\n").find("JSON object"), std::string::npos); }

TEST_F(TraceTest, MissingEventType) { EXPECT_NE(error_of("{\"id\":1}\n").find("\"ev\""), std::string::npos); }

TEST_F(TraceTest, UnknownEventType) {
  EXPECT_NE(error_of("{\"ev\":\"memcpy\"}\n").find("unknown event type \"memcpy\""), std::string::npos);
}

TEST_F(TraceTest, IdUsedBeforeAlloc) {
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1,\"reads\":[4],\"writes\":[]}\n").find("block 4"),
            std::string::npos);
  EXPECT_EQ(last_line_, 2u);
}

TEST_F(TraceTest, IdUsedAfterFree) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":4,\"bytes\":8}\n{\"ev\":\"free\",\"id\":4}\n"
                     "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1,\"reads\":[],\"writes\":[4]}\n")
                .find("not live"),
            std::string::npos);
  EXPECT_EQ(last_line_, 4u);
}

TEST_F(TraceTest, FreeOfUnknownOrFreedId) {
  EXPECT_NE(error_of("{\"ev\":\"free\",\"id\":9}\n").find("free of block 9"), std::string::npos);
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":9,\"bytes\":8}\n{\"ev\":\"free\",\"id\":9}\n{\"ev\":\"free\",\"id\":9}\n")
                .find("free of block 9"),
            std::string::npos);
  EXPECT_EQ(last_line_, 4u);
}

TEST_F(TraceTest, DuplicateLiveId) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":2,\"bytes\":8}\n{\"ev\":\"alloc\",\"id\":2,\"bytes\":8}\n").find("allocated again"),
            std::string::npos);
  EXPECT_EQ(last_line_, 3u);
}

TEST_F(TraceTest, IdReusedAfterFreeIsFine) {
  EXPECT_EQ(error_of("{\"ev\":\"alloc\",\"id\":2,\"bytes\":8}\n{\"ev\":\"free\",\"id\":2}\n{\"ev\":\"alloc\",\"id\":2,\"bytes\":8}\n"), "");
}

TEST_F(TraceTest, NegativeSize) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":-8}\n").find("negative"), std::string::npos);
}

TEST_F(TraceTest, NonNumericSize) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":\"8GiB\"}\n").find("a string"), std::string::npos);
}

TEST_F(TraceTest, FractionalSize) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":1.5}\n").find("fractional"), std::string::npos);
}

TEST_F(TraceTest, ZeroSize) { EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":0}\n").find("positive"), std::string::npos); }

TEST_F(TraceTest, MissingSize) { EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1}\n").find("missing field \"bytes\""), std::string::npos); }

TEST_F(TraceTest, NegativeId) { EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":-1,\"bytes\":4}\n").find("\"id\""), std::string::npos); }

TEST_F(TraceTest, NegativeDuration) {
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":-3}\n").find("\"dur_ns\""), std::string::npos);
}

// Sizes and times beyond what the simulator can hold in 64 bits are errors of their line
// (a block of 2^53 bytes crashed compile(); dur_ns of 2^64-1 wrapped the total time).
TEST_F(TraceTest, BlockLargerThan16TiB) {
  EXPECT_EQ(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":17592186044416}\n"), "");
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":17592186044417}\n").find("exceeds the 16 TiB"), std::string::npos);
  EXPECT_EQ(last_line_, 2u);
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":18446744073709551615}\n").find("exceeds the 16 TiB"),
            std::string::npos);
}

TEST_F(TraceTest, KernelLongerThan2To50Ns) {
  EXPECT_EQ(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1125899906842624}\n"), "");
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":18446744073709551615}\n").find("exceeds the 2^50 ns"),
            std::string::npos);
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1.2e18}\n").find("exceeds the 2^50 ns"), std::string::npos);
}

TEST_F(TraceTest, NonNumericDuration) {
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":\"fast\"}\n").find("a string"), std::string::npos);
}

TEST_F(TraceTest, MissingKernelName) {
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"dur_ns\":3}\n").find("missing field \"name\""), std::string::npos);
}

TEST_F(TraceTest, RangeOutsideBlock) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":100}\n"
                     "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1,\"reads\":[[1,90,20]],\"writes\":[]}\n")
                .find("outside block 1"),
            std::string::npos);
  EXPECT_EQ(last_line_, 3u);
}

TEST_F(TraceTest, EmptyRange) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":100}\n"
                     "{\"ev\":\"host\",\"reads\":[[1,0,0]],\"writes\":[]}\n")
                .find("outside block 1"),
            std::string::npos);
}

TEST_F(TraceTest, MalformedRange) {
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":100}\n"
                     "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1,\"reads\":[[1,-2]],\"writes\":[]}\n")
                .find("bad range"),
            std::string::npos);
  EXPECT_NE(error_of("{\"ev\":\"alloc\",\"id\":1,\"bytes\":100}\n"
                     "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":1,\"reads\":\"1\",\"writes\":[]}\n")
                .find("must be an array"),
            std::string::npos);
}

// Lines the JSON parser must never see (issue: hostile traces, kind 5), each rejected with
// FILE:LINE before it is parsed: nesting past kMaxNesting (a line of 100 000 '[' recursed
// until SIGSEGV when printed in an error message), control bytes (a NUL hid the garbage
// after it), and lines past kMaxLineBytes (a 1.2 GB line in a small .gz ran out of memory).
TEST_F(TraceTest, NestingDeeperThanTheLimitIsRejectedWhereverItIs) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string alloc = "{\"ev\":\"alloc\",\"id\":1,\"bytes\":4194304}\n";
  const std::vector<std::pair<std::string, std::uint64_t>> cases{
      {std::string(100000, '[') + "\n", 2},                                            // unclosed
      {deep + "\n", 2},                                                                // closed
      {alloc + "{\"ev\":\"host\",\"reads\":[" + deep + "]}\n", 3},                     // a range (printed in the error)
      {"{\"ev\":\"iter\",\"n\":0,\"x\":" + deep + "}\n", 2},                           // an ignored field
      {alloc + "{\"ev\":\"kernel\",\"name\":\"k\",\"dur_ns\":" + deep + "}\n", 3},  // a number's place
  };
  for (const auto& [body, line] : cases) {
    EXPECT_EQ(error_of(body), "nesting deeper than 64");
    EXPECT_EQ(last_line_, line);
  }
  EXPECT_EQ(error_of("{\"format\":\"spillway-trace\",\"version\":1,\"p\":" + deep + "}\n", false), "nesting deeper than 64");
  EXPECT_EQ(last_line_, 1u);
}

TEST_F(TraceTest, NestingUpToTheLimitIsAcceptedAndBracketsInStringsDoNotCount) {
  const int inner = kMaxNesting - 1;  // inside the event's own object
  const std::string ok = std::string(inner, '[') + std::string(inner, ']');
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0,\"x\":" + ok + "}\n"), "");
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0,\"x\":[" + ok + "]}\n"), "nesting deeper than 64");
  const std::string name = std::string(1000, '[') + "\\\"[{\\\\";  // brackets, an escaped quote, a backslash
  EXPECT_EQ(error_of("{\"ev\":\"kernel\",\"name\":\"" + name + "\",\"dur_ns\":1,\"reads\":[],\"writes\":[]}\n"), "");
}

TEST_F(TraceTest, NulAndControlBytesAreRejectedNamingTheLine) {
  using namespace std::string_literals;
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0}\n{\"ev\":\"iter\",\"n\":1}\0garbage\n"s),
            "NUL byte at byte 20 of the line (a trace is text: binary or damaged data?)");
  EXPECT_EQ(last_line_, 3u);
  EXPECT_EQ(error_of("\0\n"s), "NUL byte at byte 1 of the line (a trace is text: binary or damaged data?)");
  EXPECT_EQ(error_of("{\"ev\":\"kernel\",\"name\":\"a\x01\",\"dur_ns\":1}\n"),
            "control byte 0x01 at byte 25 of the line (a trace is text: binary or damaged data?)");
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0}\x1b[0m\n"), "control byte 0x1b at byte 20 of the line (a trace is text: binary or damaged data?)");
  EXPECT_NE(error_of("{\"format\":\"spillway-trace\",\"version\":1}\0x\n"s, false).find("NUL byte at byte 40"), std::string::npos);
  EXPECT_EQ(last_line_, 1u);
  // Other stray bytes are the parser's to refuse, on their line; tabs and CRLF line ends are text.
  EXPECT_NE(error_of("{\"ev\":\"iter\",\"n\":0}\x7f\n").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"ev\":\"iter\",\"n\":0} \xff\n").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"ev\":\"kernel\",\"name\":\"\xc3\",\"dur_ns\":1}\n").find("malformed JSON"), std::string::npos);
  EXPECT_EQ(last_line_, 2u);
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\t\"n\":0}\r\n{\"ev\":\"iter\",\"n\":1}\r\n"), "");
}

TEST_F(TraceTest, LineLongerThanTheLimitIsRejectedBeforeItIsHeld) {
  const std::string expected = "line longer than 16777216 bytes (16 MiB, the format's limit; binary or damaged data?)";
  // At the limit: accepted (a padded ignored field).
  const std::string prefix = "{\"ev\":\"iter\",\"n\":0,\"pad\":\"";
  const std::string at_limit = prefix + std::string(kMaxLineBytes - prefix.size() - 2, 'a') + "\"}";
  ASSERT_EQ(at_limit.size(), kMaxLineBytes);
  EXPECT_EQ(error_of(at_limit + "\n"), "");
  EXPECT_EQ(error_of(at_limit), "") << "the last line, without its newline";
  // One byte over, with or without a newline, plain and in a gzip file that is far smaller.
  EXPECT_EQ(error_of(at_limit + "a\n"), expected);
  EXPECT_EQ(last_line_, 2u);
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0}\n" + at_limit + "a"), expected);
  EXPECT_EQ(last_line_, 3u);
  const std::string gz = (dir_ / "long.jsonl.gz").string();
  gzFile f = gzopen(gz.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const std::string h = header(), chunk(1 << 20, 'a');
  gzwrite(f, h.data(), static_cast<unsigned>(h.size()));
  for (int i = 0; i < 40; ++i) gzwrite(f, chunk.data(), static_cast<unsigned>(chunk.size()));  // 40 MiB, no newline
  gzclose(f);
  EXPECT_LT(fs::file_size(gz), 1u << 20);
  try {
    read_trace(gz);
    FAIL() << "a 40 MiB line was accepted";
  } catch (const TraceError& e) {
    EXPECT_EQ(e.line(), 2u);
    EXPECT_EQ(e.message(), expected);
  }
}

TEST_F(TraceTest, MoreValuesThanTheLimitInOneLineAreRejected) {
  // {"ev":"iter","n":0,"x":[0,...]} with k zeros counts k + 4 (the top object, each
  // container's first value, one after each comma); commas inside strings do not count.
  auto line = [](std::size_t k) {
    std::string zeros;
    zeros.reserve(2 * k);
    for (std::size_t i = 0; i < k; ++i) zeros += i == 0 ? "0" : ",0";
    return "{\"ev\":\"iter\",\"n\":0,\"x\":[" + zeros + "]}\n";
  };
  EXPECT_EQ(error_of(line(kMaxLineValues - 4)), "");
  EXPECT_EQ(error_of(line(kMaxLineValues - 3)), "more than 1048576 values in one line (the format's limit)");
  EXPECT_EQ(last_line_, 2u);
  EXPECT_EQ(error_of("{\"ev\":\"iter\",\"n\":0,\"s\":\"" + std::string(2 * kMaxLineValues, ',') + "\"}\n"), "");
}

TEST_F(TraceTest, ErrorMessagesStayShortWhateverTheLineHolds) {
  // The parser's "last read" token and a bad value quoted back are cut, not copied whole.
  const std::string huge(1 << 20, '7');
  for (const std::string& body : {"{\"ev\":\"iter\",\"n\":\"" + huge + "\n", "{\"ev\":\"iter\",\"n\":\"" + huge + "\"}\n",
                                  "{\"ev\":\"alloc\",\"id\":1,\"bytes\":100}\n{\"ev\":\"host\",\"reads\":[[\"" + huge + "\"]]}\n"}) {
    const std::string message = error_of(body);
    EXPECT_FALSE(message.empty());
    EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace spillway::trace
