// The capture registry (capture_registry.h) and the driver's capture queries.
#include "capture_registry.h"

#include <algorithm>

#include "shim.h"

namespace spillway::interpose {

CUresult capture_of(CUstream stream, bool* capturing, std::uint64_t* capture) {
  ShimCallScope scope;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r;
  *capture = 0;
  if (real().cuStreamGetCaptureInfo_v3 != nullptr) {
    cuuint64_t id = 0;
    r = real().cuStreamGetCaptureInfo_v3(stream, &status, &id, nullptr, nullptr, nullptr, nullptr);
    *capture = id;
  } else if (real().cuStreamIsCapturing != nullptr) {
    r = real().cuStreamIsCapturing(stream, &status);
    *capture = reinterpret_cast<std::uintptr_t>(stream);  // (per stream: the best there is)
  } else {
    r = CUDA_SUCCESS;
  }
  *capturing = r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
  return r;
}

std::optional<CUresult> stream_is_capturing(CUstream stream, bool* capturing) {
  ShimCallScope scope;
  *capturing = false;
  if (real().cuStreamIsCapturing == nullptr) return std::nullopt;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = real().cuStreamIsCapturing(stream, &status);
  *capturing = r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
  return r;
}

void CaptureRegistry::begun(CUstream stream) {
  std::lock_guard lock(mutex_);
  streams_.push_back(stream);
  in_progress_.fetch_add(1, std::memory_order_acq_rel);
  captures_.erase(stream);
}

void CaptureRegistry::ended(CUstream stream, CUgraph* graph, CUresult r, std::uint64_t capture) {
  const bool made = r == CUDA_SUCCESS && graph != nullptr && *graph != nullptr;
  std::lock_guard lock(mutex_);
  // The frees captured by `capture` go to the graph it made (with a failed capture: nowhere,
  // never freed).
  if (auto it = capture_frees_.find(capture); it != capture_frees_.end()) {
    auto frees = std::make_shared<Frees>();
    frees->blocks = std::move(it->second);
    capture_frees_.erase(it);
    if (made) graph_frees_[*graph] = std::move(frees);
  }
  // The capture is over unless the driver refused the call for a stream that was not
  // capturing (then it was not in the list either).
  if (auto it = std::find(streams_.begin(), streams_.end(), stream); it != streams_.end()) {
    streams_.erase(it);
    in_progress_.fetch_sub(1, std::memory_order_acq_rel);
  }
  auto it = captures_.find(stream);
  if (it == captures_.end()) return;
  if (made) graphs_[*graph] = std::move(it->second);
  captures_.erase(it);
}

bool CaptureRegistry::capturing(CUstream stream) {
  if (!in_progress()) return false;
  {
    std::lock_guard lock(mutex_);
    if (std::find(streams_.begin(), streams_.end(), stream) != streams_.end()) return true;
  }
  bool capturing = false;
  const std::optional<CUresult> r = stream_is_capturing(stream, &capturing);
  return r && (*r != CUDA_SUCCESS || capturing);
}

void CaptureRegistry::add_footprint(CUstream stream, std::span<const Access> accesses) {
  std::lock_guard lock(mutex_);
  std::vector<Access>& acc = captures_[stream];
  for (const Access& a : accesses) {
    bool dup = std::any_of(acc.begin(), acc.end(), [&](const Access& x) { return x.addr == a.addr && x.bytes == a.bytes; });
    if (!dup) acc.push_back(a);
  }
}

void CaptureRegistry::exec_footprint(CUgraphExec exec, std::vector<Access>& out) {
  out.clear();
  std::lock_guard lock(mutex_);
  if (auto it = execs_.find(exec); it != execs_.end()) out = it->second;
}

void CaptureRegistry::instantiated(CUgraphExec exec, CUgraph graph) {
  std::lock_guard lock(mutex_);
  if (auto it = graphs_.find(graph); it != graphs_.end()) execs_[exec] = it->second;
  else execs_.erase(exec);
  if (auto f = graph_frees_.find(graph); f != graph_frees_.end()) exec_frees_[exec] = f->second;
  else exec_frees_.erase(exec);
}

void CaptureRegistry::exec_destroyed(CUgraphExec exec) {
  std::lock_guard lock(mutex_);
  execs_.erase(exec);
  exec_frees_.erase(exec);
}

void CaptureRegistry::graph_destroyed(CUgraph graph) {
  std::lock_guard lock(mutex_);
  graphs_.erase(graph);
  graph_frees_.erase(graph);
}

void CaptureRegistry::defer_free(std::uint64_t capture, CUdeviceptr addr) {
  std::lock_guard lock(mutex_);
  capture_frees_[capture].push_back(addr);
}

std::vector<CUdeviceptr> CaptureRegistry::take_frees(CUgraphExec exec) {
  std::lock_guard lock(mutex_);
  auto it = exec_frees_.find(exec);
  if (it == exec_frees_.end() || it->second->released) return {};
  it->second->released = true;
  return it->second->blocks;
}

bool CaptureRegistry::used_by_capture(std::uint64_t addr, std::uint64_t bytes) {
  if (!in_progress()) return false;
  std::lock_guard lock(mutex_);
  for (const auto& [stream, accesses] : captures_) {
    for (const Access& a : accesses) {
      if (a.addr < addr + bytes && addr < a.addr + a.bytes) return true;
    }
  }
  return false;
}

CaptureRegistry& capture_registry() {
  static auto* registry = new CaptureRegistry();
  return *registry;
}

}  // namespace spillway::interpose
