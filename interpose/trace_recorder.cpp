// SPILLWAY_TRACE (docs/trace-format.md): records what the Engine sees — allocations (with
// their addresses), frees, launches with their footprints and sampled durations — as a
// trace in format v1 (uvm/src/trace.cpp's Writer), replayable by `spillway replay`/`sweep`.
//
// - A launch's footprint is written as `[id, offset, bytes]` ranges of the blocks it touches
//   (one per Access, clipped to the block), all as `reads`: the shim cannot tell reads from
//   writes (no const-ness in cuFuncGetParamInfo).
// - `dur_ns` is the duration the Engine was given (the last sample for that execution id;
//   0 before the first sample completes).
// - The file is created at the process's first event (its first managed allocation or
//   observed launch), so a process that never uses CUDA — a shell, `timeout`, a launcher
//   that SPILLWAY_TRACE reaches through the environment — writes nothing. It is created for
//   this process alone (output_file.h): if the file exists, written by another process of
//   the run, this one records to `<name>.<pid>.<ext>` and says so in one line. If it cannot
//   be created, one error line is written and the program runs untraced. A write error
//   closes the trace with one error line. It is closed at exit (library destructor) by zlib
//   alone: no driver call.
// - A child forked without exec inherits an open trace: it writes nothing to it and drops it
//   unflushed at exit, so the parent's trace stays whole. (A child forked before the parent
//   used CUDA creates its own at its first event.)
// - SPILLWAY_TRACE_WINDOW bounds it. `W+N`: nothing is written during the
//   first W launches (the recorder keeps the live blocks' alloc events only); at launch W
//   the header, then an alloc for each block live then, then the events of N launches (and
//   the allocations and frees among them); then the file is closed, whole, while the
//   program runs on. `last:N`: the events of the last N launches are kept in memory (with
//   the allocations and frees among them, and the alloc of every block live at the oldest
//   kept launch) and written at exit. The header's "window" object says which launches the
//   file holds and how many it leaves out, so a replay knows it is a part.
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "shim.h"
#include "spillway/log.h"
#include "spillway/output_file.h"
#include "spillway/trace.h"

#include <fmt/format.h>

namespace spillway::interpose {
namespace {

class TraceRecorder final : public EngineObserver {
 public:
  TraceRecorder(Engine& engine, std::string path) : engine_(engine), path_(std::move(path)), window_(engine.config().trace_window) {}

  void on_alloc(const Block& block) override {
    trace::Event ev;
    ev.kind = trace::EventKind::alloc;
    ev.id = block.id;
    ev.bytes = block.bytes;
    ev.addr = block.base;
    ev.has_addr = true;
    ev.alloc_kind = to_string(block.kind);
    record(ev);
  }

  void on_free(const Block& block) override {
    trace::Event ev;
    ev.kind = trace::EventKind::free;
    ev.id = block.id;
    record(ev);
  }

  void on_launch(const Launch& launch) override {
    {
      // (Before the look-ups: a launch in a warm-up, or after the window, is not written.)
      std::lock_guard lock(mutex_);
      if (done_ || (!window_.last && window_.launches != 0 && launches_seen_ < window_.warmup)) {
        ++launches_seen_;
        return;
      }
    }
    trace::Event ev;
    ev.kind = trace::EventKind::kernel;
    ev.name = std::string(launch.name);
    ev.dur_ns = launch.dur_ns;
    for (const Access& a : launch.accesses) {
      std::optional<Block> b = engine_.find(a.addr);
      if (!b || a.bytes == 0) continue;
      trace::Range r;
      r.id = b->id;
      r.offset = a.addr - b->base;
      r.bytes = std::min(a.bytes, b->end() - a.addr);
      r.whole = r.offset == 0 && r.bytes == b->bytes;
      ev.reads.push_back(r);
    }
    record(ev);
  }

  // Whether process `pid` opened the trace (a vfork()ed or forked child did not).
  bool owned_by(pid_t pid) const { return owner_.load(std::memory_order_acquire) == pid; }

  void close(std::chrono::milliseconds wait) noexcept {
    std::unique_lock lock(mutex_, std::defer_lock);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (!lock.try_lock()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        log(LogLevel::error, "SPILLWAY_TRACE: still being written at exit; the trace is left unfinished");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    opened_ = true;  // an event after the close opens nothing that would never be closed
    if (!writer_) return;
    if (getpid() != owner_) {
      (void)writer_.release();  // a forked child: the parent owns the file and its buffer
      return;
    }
    try {
      if (window_.launches != 0 && !done_) write_window_at_exit();
      done_ = true;
      if (!writer_) return;  // (a write of the window failed: said, and dropped)
      writer_->close();
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}", e.what());
    }
    writer_.reset();
  }

 private:
  // One event, as the window says: written, kept, or (in a warm-up) only its block noted.
  void record(const trace::Event& ev) {
    std::lock_guard lock(mutex_);
    if (done_) return;
    if (!opened_) open();
    if (!writer_ || getpid() != owner_) return;
    if (window_.launches == 0) return write_locked(ev);
    const bool kernel = ev.kind == trace::EventKind::kernel;
    if (window_.last) {
      kept_.push_back(Kept{ev.kind, ev.id, trace::to_json(ev).dump()});
      if (kernel && ++kept_launches_ > window_.launches) drop_oldest_launch();
      if (kernel) ++launches_seen_;
      return;
    }
    if (launches_seen_ < window_.warmup) {  // (kernels of the warm-up stop in on_launch)
      note_live(ev.kind, ev.id, ev);
      return;
    }
    if (!header_written_) {
      write_header_locked();
      for (const auto& [id, line] : live_) write_line_locked(line);
      live_.clear();
    }
    write_locked(ev);
    if (kernel && ++launches_seen_ >= window_.warmup + window_.launches) finish_window_locked();
  }

  void note_live(trace::EventKind kind, std::uint64_t id, const trace::Event& ev) {
    if (kind == trace::EventKind::alloc) live_[id] = trace::to_json(ev).dump();
    else if (kind == trace::EventKind::free) live_.erase(id);
  }

  // last:N: the oldest kept launch leaves, with the events before it; their allocations of
  // blocks still live go to live_ (written before the window).
  void drop_oldest_launch() {
    while (!kept_.empty()) {
      Kept k = std::move(kept_.front());
      kept_.pop_front();
      if (k.kind == trace::EventKind::alloc) live_[k.id] = std::move(k.line);
      else if (k.kind == trace::EventKind::free) live_.erase(k.id);
      else if (k.kind == trace::EventKind::kernel) {
        --kept_launches_;
        ++left_out_;
        return;
      }
    }
  }

  void write_window_at_exit() {
    if (window_.last) {
      write_header_locked();
      for (const auto& [id, line] : live_) write_line_locked(line);
      for (const Kept& k : kept_) write_line_locked(k.line);
      kept_.clear();
      live_.clear();
      return;
    }
    if (!header_written_) write_header_locked();  // the program ended within the warm-up
  }

  void finish_window_locked() {
    done_ = true;
    try {
      writer_->close();
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}", e.what());
    }
    writer_.reset();
    log(LogLevel::info, "SPILLWAY_TRACE: the window of {} launches after {} is written; the trace is closed",
        window_.launches, window_.warmup);
  }

  void write_header_locked() {
    header_written_ = true;
    nlohmann::json extra = nlohmann::json::object();
    extra["producer"] = "libspillway.so";
    extra["policy"] = engine_.config().policy;
    if (window_.launches != 0) {
      // The launches before the window: dropped from the front (last:N) or the warm-up.
      const std::uint64_t skipped = window_.last ? left_out_ : std::min(window_.warmup, launches_seen_);
      nlohmann::json w = nlohmann::json::object();
      w["mode"] = window_.last ? "last" : "after-warmup";
      w["launches"] = window_.launches;
      w["first_launch"] = skipped;
      w["left_out_launches"] = skipped;
      w["note"] = window_.last
                      ? fmt::format("the last {} launches of {}; the {} before them are left out, and the {} blocks live at the "
                                    "first kept launch are written as allocations first",
                                    std::min(window_.launches, launches_seen_), launches_seen_, skipped, live_.size())
                      : fmt::format("{} launches after a warm-up of {}, which is left out (the {} blocks live at its end are "
                                    "written as allocations first), as is everything after them",
                                    window_.launches, skipped, live_.size());
      extra["window"] = w;
    }
    try {
      writer_->write_header("spillway shim (SPILLWAY_TRACE)", extra);
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}; the trace stops here", e.what());
      writer_.reset();
      done_ = true;
    }
  }

  void write_line_locked(const std::string& line) {
    if (!writer_) return;
    try {
      writer_->write_raw(line);
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}; the trace stops here", e.what());
      writer_.reset();
      done_ = true;
    }
  }

  void write_locked(const trace::Event& ev) {
    try {
      writer_->write(ev);
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}; the trace stops here", e.what());
      writer_.reset();
      done_ = true;
    }
  }

  // With mutex_ held, once.
  void open() {
    opened_ = true;
    owner_ = getpid();
    std::string err;
    const std::string wanted = expand_output_pattern(path_);  // %p, %r (output_file.h)
    const std::string path = claim_output_file(wanted, &err);
    try {
      if (path.empty()) throw std::runtime_error(err);
      writer_ = std::make_unique<trace::Writer>(path);
      if (window_.launches == 0) write_header_locked();  // (a window's header says what it left out: written later)
    } catch (const std::exception& e) {
      log(LogLevel::error, "cannot record SPILLWAY_TRACE: {}; the program runs without a trace", e.what());
      writer_.reset();
      return;
    }
    if (path != wanted) {
      log(LogLevel::warn, "SPILLWAY_TRACE: '{}' exists; process {} records its trace to '{}'", wanted,
          static_cast<long>(owner_.load()), path);
    }
  }

  Engine& engine_;
  const std::string path_;
  const Config::TraceWindow window_;
  std::mutex mutex_;
  bool opened_ = false;  // open() has run (in this process or the one it was forked from)
  bool header_written_ = false;
  bool done_ = false;    // the window is written (or the trace stopped): nothing more goes in
  std::unique_ptr<trace::Writer> writer_;
  std::atomic<pid_t> owner_{0};  // (read without mutex_ by owned_by)
  // The window (SPILLWAY_TRACE_WINDOW).
  std::uint64_t launches_seen_ = 0;
  struct Kept {
    trace::EventKind kind;
    std::uint64_t id;
    std::string line;
  };
  std::deque<Kept> kept_;              // last:N: the events of the kept launches, as lines
  std::uint64_t kept_launches_ = 0;
  std::uint64_t left_out_ = 0;         // last:N: launches dropped from the front
  std::map<std::uint64_t, std::string> live_;  // blocks live before the window: id -> alloc line (ids grow with time)
};

TraceRecorder* g_recorder = nullptr;  // never destroyed: hooks may run while the process exits

}  // namespace

void install_trace_recorder(Engine& engine, const std::string& path) {
  g_recorder = new TraceRecorder(engine, path);
  engine.set_observer(g_recorder);
}

void close_trace_recorder(std::chrono::milliseconds wait) noexcept {
  if (g_recorder != nullptr) g_recorder->close(wait);
}

void close_trace_recorder_before_exec(std::chrono::milliseconds wait) noexcept {
  if (g_recorder != nullptr && g_recorder->owned_by(getpid())) g_recorder->close(wait);
}

}  // namespace spillway::interpose
