#include "spillway/fault_router.h"

#include "device_plan.h"

namespace spillway {

std::size_t FaultRouter::deliver(Backend& backend, const DevicePlans& plans, int launching_device) {
  faults_.clear();
  if (backend.take_faults(faults_) == 0) return 0;
  if (plans.count() < 2) {
    if (DevicePlan* p = plans.of(launching_device)) p->policy->on_faults(faults_);
    return faults_.size();
  }
  plans.for_each([&](DevicePlan& p) {
    device_faults_.clear();
    for (const FaultRecord& f : faults_) {
      const auto& [seq, d] = seq_devices_[f.launch_seq % kSeqDevices];
      if ((seq == f.launch_seq + 1 ? d : launching_device) == p.device) device_faults_.push_back(f);
    }
    if (!device_faults_.empty()) p.policy->on_faults(device_faults_);
  });
  return faults_.size();
}

}  // namespace spillway
