// Stream capture and CUDA graphs as the launch hooks see them (hooks_launch.cpp, file
// comment, step 4). Not a public interface.
//
// A kernel launched on a capturing stream does not run now: its footprint joins the capture,
// becomes the graph's (cuStreamEndCapture) and then each graph exec's
// (cuGraphInstantiateWithFlags), and a cuGraphLaunch is one launch with that footprint. A
// cuMemFreeAsync of a managed block inside a capture is a free node: the block stays live and
// follows the capture to its graph and the graph's execs; the first launch of one of them
// that the driver accepts releases it, stream-ordered after that launch ("Stream Capture",
// "Graph Memory Nodes", CUDA Programming Guide). A graph never launched never frees it, as the
// driver would not.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "spillway/policy.h"  // Access

namespace spillway::interpose {

// Whether `stream` (mapped: the per-thread default stream for a _ptsz call) is being
// captured, and the id of its capture (cuStreamGetCaptureInfo, CUDA 12.3+; the stream's own
// handle on older drivers); the driver's error for a stream it does not know. Thread-safe.
CUresult capture_of(CUstream stream, bool* capturing, std::uint64_t* capture);
// cuStreamIsCapturing's answer for `stream`, nullopt where the driver lacks it. *capturing:
// the call succeeded with any status but NONE (an invalidated capture still forbids new work
// on the stream until it ends). Thread-safe.
std::optional<CUresult> stream_is_capturing(CUstream stream, bool* capturing);

// The captures begun through the hooks, their footprints and frees, and those of the graphs
// and graph execs they made. One lock (a leaf, taken with the launching streams' lock held
// by the capture-begin hooks: stream_registry.h has the lock order). Thread-safe.
class CaptureRegistry {
 public:
  // The capture of `stream` began (after the real call succeeded).
  void begun(CUstream stream);
  // The capture of `stream` (id `capture`, asked before the real call) ended with `r`; on
  // success `graph` is the graph it made.
  void ended(CUstream stream, CUgraph* graph, CUresult r, std::uint64_t capture);
  // Whether a capture begun through the hooks is in progress (lock-free).
  bool in_progress() const { return in_progress_.load(std::memory_order_acquire) != 0; }
  // Whether `stream` is capturing: one whose capture began through the hooks without asking;
  // while any capture is in progress every other stream is asked (it may have joined a
  // capture through an event); with none nothing is asked (no driver call per launch).
  bool capturing(CUstream stream);
  // A kernel with footprint `accesses` was captured on `stream`.
  void add_footprint(CUstream stream, std::span<const Access> accesses);
  // The footprint of graph exec `exec` (empty for a graph built without capture), into `out`.
  void exec_footprint(CUgraphExec exec, std::vector<Access>& out);
  // Graph exec `exec` was instantiated from `graph`: it takes the graph's footprint and frees.
  void instantiated(CUgraphExec exec, CUgraph graph);
  void exec_destroyed(CUgraphExec exec);
  void graph_destroyed(CUgraph graph);
  // A cuMemFreeAsync of managed block `addr` inside capture `capture`.
  void defer_free(std::uint64_t capture, CUdeviceptr addr);
  // The frees captured into `exec`'s graph, handed out once (to the first accepted launch of
  // the graph or of any exec made from it); empty after that.
  std::vector<CUdeviceptr> take_frees(CUgraphExec exec);
  // Whether [addr, addr + bytes) may be used by a kernel captured so far by a capture still
  // in progress (its graph may still run on it).
  bool used_by_capture(std::uint64_t addr, std::uint64_t bytes);

 private:
  // One list of frees, shared by a graph and every exec made from it.
  struct Frees {
    std::vector<CUdeviceptr> blocks;
    bool released = false;
  };
  using FreesPtr = std::shared_ptr<Frees>;

  std::mutex mutex_;  // guards everything below but in_progress_
  std::vector<CUstream> streams_;  // capturing through the hooks
  std::atomic<int> in_progress_{0};  // streams_.size()
  std::unordered_map<CUstream, std::vector<Access>> captures_;
  std::unordered_map<CUgraph, std::vector<Access>> graphs_;
  std::unordered_map<CUgraphExec, std::vector<Access>> execs_;
  // Keyed by capture id: one capture's frees, whichever of its streams (the origin, streams
  // that joined it, a thread's per-thread default stream) they were made on.
  std::unordered_map<std::uint64_t, std::vector<CUdeviceptr>> capture_frees_;
  std::unordered_map<CUgraph, FreesPtr> graph_frees_;
  std::unordered_map<CUgraphExec, FreesPtr> exec_frees_;
};

// The process's registry (never destroyed: hooks may run during exit).
CaptureRegistry& capture_registry();

}  // namespace spillway::interpose
