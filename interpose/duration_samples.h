// Kernel durations for Launch::dur_ns (hooks_launch.cpp, step 6): 1 launch in 64 per
// execution id (a direct-mapped table of 4096 slots) is timed with two events on the
// launching stream; completed samples are collected without blocking on later launches
// (cuEventQuery) and give that id's last duration. At most 32 samples are pending at once.
// Thread-safe: one mutex of its own (the pending samples and the event pool), a leaf; the
// table is atomic.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace spillway::hook {

// The last measured duration of `exec_id` in ns (0: unknown), and in *sample whether to time
// this launch.
std::uint64_t duration_of(std::uint64_t exec_id, bool* sample);
// An event from the pool, or a new one (nullptr: the driver refused).
CUevent take_event();
// Back to the pool (nullptr: ignored).
void give_event(CUevent e);
// A sample recorded on the launching stream: start and end events around launch of `exec_id`.
void add_sample(std::uint64_t exec_id, CUevent start, CUevent end);
// Collects completed samples, oldest first, without blocking (skipped while another thread
// collects).
void poll_samples();

}  // namespace spillway::hook
