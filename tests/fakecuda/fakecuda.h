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

/* Re-reads FAKECUDA_* and CUDA_VISIBLE_DEVICES (resets FAKECUDA_FAIL counters, reopens
 * FAKECUDA_LOG, forgets the residency model's state and counters, destroys the contexts made
 * by cuCtxCreate, drops the primary contexts' retains and flags, and the streams and events
 * of devices no longer visible). */
FAKECUDA_EXPORT void fakecuda_reload_config(void);

/* Most recent launch: kernel name and up to max parameter values (first 8 bytes of each,
 * little endian). Returns the parameter count, or -1 if nothing was launched. */
FAKECUDA_EXPORT int fakecuda_last_launch(char* name, size_t name_len, uint64_t* params, size_t max);

/* Devices (FAKECUDA_DEVICES, CUDA_VISIBLE_DEVICES): the physical ordinal of visible device
 * `device` (what the program sees as ordinal `device`), or -1 when no such device is visible.
 * Two processes with CUDA_VISIBLE_DEVICES=0 and =1 both see device 0, on physical 0 and 1. */
FAKECUDA_EXPORT int fakecuda_device_physical(int device);

/* Counters of the simulated GPU residency (FAKECUDA_GPU_MEMORY), in 2 MiB chunks: per device
 * (fakecuda_device_residency_stats), or summed over the visible devices
 * (fakecuda_residency_stats). */
typedef struct fakecuda_residency_stats_t {
  uint64_t capacity_chunks;   /* FAKECUDA_GPU_MEMORY / 2 MiB (summed: times the device count) */
  uint64_t resident_chunks;   /* on the GPU now */
  uint64_t launches;          /* launches that executed on the GPU */
  uint64_t faults;            /* a launch touched a chunk on the CPU or another GPU: migrated on demand */
  uint64_t populated;         /* fresh chunks first touched (launch or prefetch): no migration */
  uint64_t prefetched_in;     /* chunks a prefetch moved to the GPU (from the CPU or another GPU) */
  uint64_t prefetched_out;    /* chunks a prefetch moved GPU -> CPU (evictions by prefetch) */
  uint64_t driver_evictions;  /* chunks the driver evicted for room (oldest migrated first) */
  uint64_t late_prefetches;   /* touched by a launch right after the prefetch that migrated them in */
  uint64_t remote_accesses;   /* chunks a launch read on the CPU (preferred location CPU + accessed by the GPU) */
  uint64_t discarded;         /* chunks dropped by cuMemDiscardBatchAsync (nothing copied) */
  uint64_t from_peer;         /* chunks that came from another GPU (a fault or a prefetch; counted there too) */
  uint64_t read_mostly_drops; /* read-mostly duplicates that left the GPU with nothing copied (eviction or prefetch) */
  uint64_t collapses;         /* writes to a read-mostly duplicate on the GPU (write faults, counted in faults too) */
} fakecuda_residency_stats_t;

/* Fills *out with the sums over the visible devices; returns 0, or -1 when the model is off
 * (out is still filled: zeros). */
FAKECUDA_EXPORT int fakecuda_residency_stats(fakecuda_residency_stats_t* out);
/* The same for one visible device; -1 (and zeros) also for an ordinal that is not visible. */
FAKECUDA_EXPORT int fakecuda_device_residency_stats(int device, fakecuda_residency_stats_t* out);

/* Where the chunk holding p is; -1 when the model is off or p is not managed memory.
 * FAKECUDA_CHUNK_GPU: on any GPU (fakecuda_chunk_device says which). */
enum { FAKECUDA_CHUNK_FRESH = 0, FAKECUDA_CHUNK_CPU = 1, FAKECUDA_CHUNK_GPU = 2 };
FAKECUDA_EXPORT int fakecuda_chunk_location(CUdeviceptr p);

/* The visible ordinal of the GPU holding the chunk of p (>= 0), FAKECUDA_DEVICE_CPU,
 * FAKECUDA_DEVICE_FRESH (never touched), or FAKECUDA_DEVICE_NONE when the model is off or p
 * is not managed memory. FAKECUDA_DEVICE_CPU is also the host in the sink's migrations. */
enum { FAKECUDA_DEVICE_CPU = -1, FAKECUDA_DEVICE_FRESH = -2, FAKECUDA_DEVICE_NONE = -3 };
FAKECUDA_EXPORT int fakecuda_chunk_device(CUdeviceptr p);

/* What the residency model does, for the fake libcupti (cupti.cpp; libcupti.so.13 in
 * fakecuda/cupti/): called synchronously, on the thread whose driver call caused it, with
 * the model's lock held (a sink must not call the driver). Devices are visible ordinals.
 * kernel_begin/kernel_end bracket a launch that executes on `device`; fault: the launch
 * touched the chunk at `addr` (its 2 MiB base) that was not on its GPU (the real driver
 * reports a GPU page fault both for a chunk that must migrate and for a fresh one populated
 * on first touch; a migration follows for the former), or wrote a read-mostly duplicate on
 * it; `write`: 1 when the launch writes the chunk (a write fault), else 0; migration: `bytes` at `addr` moved
 * from `src` to `dst` (a device, or FAKECUDA_DEVICE_CPU for the host), for a fault, a
 * prefetch or an eviction. */
typedef struct fakecuda_activity_sink_t {
  void (*kernel_begin)(int device);
  void (*fault)(int device, uint64_t addr, int write);
  void (*kernel_end)(int device);
  void (*migration)(int src, int dst, uint64_t addr, uint64_t bytes);
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
