// Fault feedback's routing: the GPU page faults the Backend reports (Backend::take_faults)
// go to the Policy of the device that planned the launch they were taken by (engine.h, "One
// plan per device"). Fault records name their launch (FaultRecord::launch_seq); this
// remembers the device of the last kSeqDevices launches, by sequence number.
// Guarded by the Engine's planning lock (Engine::mutex_): every call is made with it held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "spillway/backend.h"
#include "spillway/device_plans.h"
#include "spillway/state_bytes.h"

namespace spillway {

class FaultRouter {
 public:
  static constexpr std::size_t kSeqDevices = 4096;  // launches remembered

  FaultRouter() : seq_devices_(kSeqDevices, {0, 0}) {}

  // Launch `seq` is planned on `device`.
  void note_launch(std::uint64_t seq, int device) { seq_devices_[seq % kSeqDevices] = {seq + 1, device}; }
  // Takes the Backend's fault records and gives each plan's Policy those of the launches it
  // planned (a launch too old to be remembered: `launching_device`'s). Returns how many
  // records were taken.
  std::size_t deliver(Backend& backend, const DevicePlans& plans, int launching_device);
  std::uint64_t state_bytes() const {  // heap bytes (spillway/state_bytes.h)
    return vector_heap_bytes(seq_devices_) + vector_heap_bytes(faults_) + vector_heap_bytes(device_faults_);
  }

 private:
  std::vector<std::pair<std::uint64_t, int>> seq_devices_;  // by seq % kSeqDevices: (seq + 1, device)
  std::vector<FaultRecord> faults_;         // the Backend's records (scratch)
  std::vector<FaultRecord> device_faults_;  // one device's share (scratch)
};

}  // namespace spillway
