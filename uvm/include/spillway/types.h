// Vocabulary shared by the Engine, the Policies and the Backends (docs/design.md).
#pragma once

#include <cstdint>

namespace spillway {

// The driver's VA block / root chunk: residency is tracked per 2 MiB chunk
// (kernel-open/nvidia-uvm/uvm_va_block_types.h, UVM_VA_BLOCK_SIZE).
inline constexpr std::uint64_t kChunkBytes = 2ull << 20;

// Opaque handles of the world the Backend drives: a CUstream / CUevent in the shim, an index
// in the simulator. 0 is the legacy default stream.
using StreamHandle = std::uint64_t;
using EventHandle = std::uint64_t;

enum class Location { gpu, cpu };

enum class Advice {
  preferred_location,        // CU_MEM_ADVISE_SET_PREFERRED_LOCATION
  unset_preferred_location,  // CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION
  accessed_by,               // CU_MEM_ADVISE_SET_ACCESSED_BY
  unset_accessed_by,         // CU_MEM_ADVISE_UNSET_ACCESSED_BY
  read_mostly,               // CU_MEM_ADVISE_SET_READ_MOSTLY
  unset_read_mostly,         // CU_MEM_ADVISE_UNSET_READ_MOSTLY
};

// Which API family produced a block (for statistics and the trace's `kind`).
enum class AllocKind { alloc, pitch, async, pool_async, runtime, runtime_pitch, runtime_async };
const char* to_string(AllocKind kind);

// Outcome of a Backend or Engine call. `native` keeps the driver's own code (a CUresult in
// the shim) so hooks can hand back exactly what the driver said.
enum class Status { ok, out_of_memory, invalid_value, not_supported, not_ready, error };
struct Result {
  Status status = Status::ok;
  int native = 0;
  bool ok() const { return status == Status::ok; }
};

// One GPU page fault the device took, as the driver reports it (CUPTI's
// CUpti_ActivityUnifiedMemoryCounter3 with counterKind GPU_PAGE_FAULT, cupti_activity.h; the
// simulator: a chunk a kernel touched that was neither resident nor arriving). `addr` is an
// address in the faulting page; `launch_seq` is the Launch::seq of the kernel it is
// attributed to (CUPTI: the kernel running on that device when the driver began servicing
// the fault, found by timestamps and the external correlation id the shim pushed for that
// launch; with kernels running concurrently, a fault may be reported once for each).
// `write`: the faulting access was a write or an atomic (CUPTI: the record's `flags` hold a
// CUpti_ActivityUnifiedMemoryAccessType, WRITE = 2 or ATOMIC = 3; the simulator: the touch
// writes the chunk). A read fault does not show that the kernel only reads: the driver
// promotes a read fault's mapping to read-write where the page cannot be read-duplicated
// (compute_new_permission's query_promote rule, kernel-open/nvidia-uvm/uvm_va_block.c), so a
// later write in the same kernel does not fault again; a write to a read-mostly copy (mapped
// read-only everywhere, CUDA Programming Guide, "Unified Memory": cudaMemAdviseSetReadMostly)
// always faults, as a write.
struct FaultRecord {
  std::uint64_t launch_seq = 0;
  std::uint64_t addr = 0;
  bool write = false;
};

// One live managed block in the Engine's allocation table.
struct Block {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;   // as requested (pitch: pitch * height)
  std::uint64_t id = 0;      // 1, 2, ... in allocation order
  AllocKind kind = AllocKind::alloc;
  StreamHandle stream = 0;   // the stream of a stream-ordered allocation, else 0
  int device = 0;
  bool suballocated = false; // carved by the Engine's sub-allocator from one of its ranges
  // Every chunk it touches lies inside one managed allocation that other blocks may share
  // (carved, here or by the simulator's placement: Backend::blocks_share_ranges), so one
  // prefetch may span the bytes between two such blocks in one chunk.
  bool in_shared_range = false;
  // The Engine's number for the context current at its allocation (Backend::current_context;
  // Engine::context_ended releases a context's blocks). Numbers of ended contexts are reused.
  std::uint16_t context = 0;
  std::uint64_t end() const { return base + bytes; }
  bool contains(std::uint64_t addr) const { return addr >= base && addr - base < bytes; }
};
static_assert(sizeof(Block) == 48, "the allocation table holds one Block per live block: keep it small");

}  // namespace spillway
