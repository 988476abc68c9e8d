/* The fake CUDA libraries' test helpers (not CUDA): what tests and test programs may call
 * besides the CUDA API. The driver (libcuda.so.1) exports fakecuda_*, the runtime
 * (libcudart.so.13) fakecudart_*. See README.md. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef FAKECUDA_EXPORT
#define FAKECUDA_EXPORT
#endif

/* Re-reads FAKECUDA_* (resets FAKECUDA_FAIL counters, reopens FAKECUDA_LOG, forgets the
 * residency model's state and counters). */
FAKECUDA_EXPORT void fakecuda_reload_config(void);

/* Most recent launch: kernel name and up to max parameter values (first 8 bytes of each,
 * little endian). Returns the parameter count, or -1 if nothing was launched. */
FAKECUDA_EXPORT int fakecuda_last_launch(char* name, size_t name_len, uint64_t* params, size_t max);

/* Counters of the simulated GPU residency (FAKECUDA_GPU_MEMORY), in 2 MiB chunks. */
typedef struct fakecuda_residency_stats_t {
  uint64_t capacity_chunks;   /* FAKECUDA_GPU_MEMORY / 2 MiB */
  uint64_t resident_chunks;   /* on the GPU now */
  uint64_t launches;          /* launches that executed */
  uint64_t faults;            /* a launch touched a chunk on the CPU: migrated on demand */
  uint64_t populated;         /* fresh chunks first touched (launch or prefetch): no migration */
  uint64_t prefetched_in;     /* chunks a prefetch moved CPU -> GPU */
  uint64_t prefetched_out;    /* chunks a prefetch moved GPU -> CPU (evictions by prefetch) */
  uint64_t driver_evictions;  /* chunks the driver evicted for room (oldest migrated first) */
  uint64_t late_prefetches;   /* touched by a launch right after the prefetch that migrated them in */
  uint64_t remote_accesses;   /* chunks a launch read on the CPU (preferred location CPU + accessed by GPU) */
  uint64_t discarded;         /* chunks dropped by cuMemDiscardBatchAsync (nothing copied) */
} fakecuda_residency_stats_t;

/* Fills *out; returns 0, or -1 when the model is off (out is still filled: zeros). */
FAKECUDA_EXPORT int fakecuda_residency_stats(fakecuda_residency_stats_t* out);

/* Where the chunk holding p is; -1 when the model is off or p is not managed memory. */
enum { FAKECUDA_CHUNK_FRESH = 0, FAKECUDA_CHUNK_CPU = 1, FAKECUDA_CHUNK_GPU = 2 };
FAKECUDA_EXPORT int fakecuda_chunk_location(CUdeviceptr p);

/* What the residency model does, for the fake libcupti (cupti.cpp; libcupti.so.13 in
 * fakecuda/cupti/): called synchronously, on the thread whose driver call caused it, with
 * the model's lock held (a sink must not call the driver). kernel_begin/kernel_end bracket a
 * launch that executes; fault: the launch touched the chunk at `addr` (its 2 MiB base) that
 * was not on the GPU (`migrated` bytes came in: 2 MiB, or 0 for a fresh chunk populated on
 * first touch: the real driver reports a GPU page fault for both); migration: a prefetch or
 * an eviction moved `bytes` toward the GPU (to_gpu 1) or the host. */
typedef struct fakecuda_activity_sink_t {
  void (*kernel_begin)(void);
  void (*fault)(uint64_t addr, uint64_t migrated);
  void (*kernel_end)(void);
  void (*migration)(int to_gpu, uint64_t bytes);
} fakecuda_activity_sink_t;
/* Installs `sink` (NULL: none); it must outlive its use. */
FAKECUDA_EXPORT void fakecuda_set_activity_sink(const fakecuda_activity_sink_t* sink);

/* Runtime: makes `stub` (any host address, standing for a kernel's host stub) launch `f`
 * through cudaLaunchKernel / cudaLaunchKernelExC (+ _ptsz). With `resolvable` 0,
 * cudaGetFuncBySymbol answers cudaErrorInvalidDeviceFunction for it (launches still work);
 * f == NULL removes the stub. Returns 0. */
FAKECUDA_EXPORT int fakecudart_register_stub(const void* stub, CUfunction f, int resolvable);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDA_H */
