// PyTorch's allocator trace, followed (docs/design.md, "A framework's allocator, followed"):
// while the framework's allocator is kept (SPILLWAY_FRAMEWORK_ALLOCATOR=keep), the shim
// attaches a tracker to PyTorch's CUDA caching allocator and reports its segments and tensors
// to the Engine (Engine::follow_segment, note_tensor_alloc/free), so that launches get the
// tensors' exact extents.
//
// How, without building against PyTorch:
//   * `c10::cuda::CUDACachingAllocator::allocator` (an exported std::atomic<CUDAAllocator*>
//     of libc10_cuda.so) is looked up in the libc10_cuda.so already loaded (found among the
//     loaded objects: PyTorch's extension loads it RTLD_LOCAL); the shim never loads PyTorch;
//   * the version comes from torch/version.py beside torch/lib/libc10_cuda.so; each known
//     version's vtable offsets of CUDAAllocator::attachAllocatorTraceTracker and
//     ::initialized() and its TraceEntry layout were read from that version's headers
//     (scripts/torch-trace-abi; the table in docs/design.md);
//   * before anything is called, each vtable entry is checked against the address of the
//     native allocator's own method in libc10_cuda.so's symbol table (.symtab: local
//     symbols, read from the file), so a different allocator backend (cudaMallocAsync, a
//     pluggable one), a vtable that is not the expected one or a stripped library are all
//     refused before any call;
//   * the tracker is attached once initialized() says the per-device allocators exist (an
//     attach before that reaches no device), passed as a std::function whose argument is
//     read at the table's offsets: action_ (int32 at 0), addr_ (8), stream_ (32), size_
//     (40), mempool_ (48, from 2.8).
// Refused (one line at info level saying why; the shim goes on with fault feedback) where any
// step fails: not PyTorch, a version outside 2.2-2.15, no symbol table, an allocator object
// that is not the native allocator's (its vtable pointer is checked against the symbol
// table's vtable), an allocator not initialized after kMaxTries tries, a shim not built with
// libstdc++ (the std::function passed must be PyTorch's).
//
// Thread-safe. The tracker runs inside PyTorch's allocator, under its lock: it calls only
// the Engine's followed-tensor functions (leaf locks, no Backend calls, never throws).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spillway {
class Engine;
}

namespace spillway::interpose {

// The layout of PyTorch's allocator trace in one version (docs/design.md's table).
struct TorchTraceLayout {
  int major = 0, minor = 0;
  long attach_offset = 0;       // bytes into the vtable: CUDAAllocator::attachAllocatorTraceTracker
  long initialized_offset = 0;  // ... CUDAAllocator::initialized
  bool has_mempool = false;     // TraceEntry::mempool_ at 48 (2.8 on)
};
// The layout of torch major.minor, or nullopt when it is not one checked.
std::optional<TorchTraceLayout> torch_trace_layout(int major, int minor);
// major.minor from a torch/version.py's text (`__version__ = '2.5.1+cu124'`).
std::optional<std::pair<int, int>> parse_torch_version(const std::string& version_py);

// Where an attempt is made. `allocation`: a redirected allocation's hook, before the
// allocation (it may run inside PyTorch's allocator, holding one device's lock, so that the
// segment being allocated is followed from its SEGMENT_ALLOC on); tried there only while the
// process sees one device, since the attach takes every device allocator's lock in turn,
// which PyTorch itself never nests. `launch`: a launch hook, where no allocator lock is held
// (with several devices the segments allocated before the first launch stay unfollowed).
enum class AttachPoint { allocation, launch };
// Tries to attach the tracker (at most once successfully; after kMaxTries unsuccessful
// tries, or a refusal, never again). Called under `keep` only. Lock-free once decided.
void maybe_attach_torch_tracker(Engine& engine, AttachPoint where) noexcept;
// "attached: torch 2.5" / "off: <why>" / "off so far: <why>" / "off: not tried yet" /
// "off: being attached" (Backend::framework_trace_state).
std::string torch_tracker_state();

}  // namespace spillway::interpose
