// SPILLWAY_TRACE (issue 4, DESIGN §3, §6): records what the Engine sees — allocations (with
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
#include <unistd.h>

#include <memory>
#include <mutex>
#include <thread>

#include "shim.h"
#include "spillway/log.h"
#include "spillway/output_file.h"
#include "spillway/trace.h"

namespace spillway::interpose {
namespace {

class TraceRecorder final : public EngineObserver {
 public:
  TraceRecorder(Engine& engine, std::string path) : engine_(engine), path_(std::move(path)) {}

  void on_alloc(const Block& block) override {
    trace::Event ev;
    ev.kind = trace::EventKind::alloc;
    ev.id = block.id;
    ev.bytes = block.bytes;
    ev.addr = block.base;
    ev.has_addr = true;
    ev.alloc_kind = to_string(block.kind);
    write(ev);
  }

  void on_free(const Block& block) override {
    trace::Event ev;
    ev.kind = trace::EventKind::free;
    ev.id = block.id;
    write(ev);
  }

  void on_launch(const Launch& launch) override {
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
    write(ev);
  }

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
      writer_->close();
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}", e.what());
    }
    writer_.reset();
  }

 private:
  void write(const trace::Event& ev) {
    std::lock_guard lock(mutex_);
    if (!opened_) open();
    if (!writer_ || getpid() != owner_) return;
    try {
      writer_->write(ev);
    } catch (const std::exception& e) {
      log(LogLevel::error, "SPILLWAY_TRACE: {}; the trace stops here", e.what());
      writer_.reset();
    }
  }

  // With mutex_ held, once.
  void open() {
    opened_ = true;
    owner_ = getpid();
    std::string err;
    const std::string path = claim_output_file(path_, &err);
    try {
      if (path.empty()) throw std::runtime_error(err);
      writer_ = std::make_unique<trace::Writer>(path);
      nlohmann::json extra = nlohmann::json::object();
      extra["producer"] = "libspillway.so";
      extra["policy"] = engine_.config().policy;
      writer_->write_header("spillway shim (SPILLWAY_TRACE)", extra);
    } catch (const std::exception& e) {
      log(LogLevel::error, "cannot record SPILLWAY_TRACE: {}; the program runs without a trace", e.what());
      writer_.reset();
      return;
    }
    if (path != path_) {
      log(LogLevel::warn, "SPILLWAY_TRACE: '{}' exists; process {} records its trace to '{}'", path_,
          static_cast<long>(owner_), path);
    }
  }

  Engine& engine_;
  const std::string path_;
  std::mutex mutex_;
  bool opened_ = false;  // open() has run (in this process or the one it was forked from)
  std::unique_ptr<trace::Writer> writer_;
  pid_t owner_ = 0;
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

}  // namespace spillway::interpose
