// The policies of DESIGN §4 that run in the shim. Each is registered in policies.cpp.
#pragma once

#include "spillway/policy.h"

namespace spillway {

// `demand`: does nothing; the driver's demand paging alone (plain cudaMallocManaged).
class DemandPolicy final : public Policy {
 public:
  std::string_view name() const override { return "demand"; }
};

// `advise`: static advice at allocation: preferred location = the allocating GPU, and
// accessed-by that GPU, so pages the driver evicts stay mapped for the GPU instead of
// faulting (CUDA Programming Guide, "Performance Tuning" of Unified Memory:
// cudaMemAdviseSetPreferredLocation / cudaMemAdviseSetAccessedBy; RMM's managed resource
// does the same).
class AdvisePolicy final : public Policy {
 public:
  std::string_view name() const override { return "advise"; }
  void on_alloc(const Block& block, Actions& actions) override;
};

}  // namespace spillway
