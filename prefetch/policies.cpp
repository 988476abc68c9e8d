#include "policies.h"

namespace spillway {

void AdvisePolicy::on_alloc(const Block& block, Actions& actions) {
  actions.advise(block.base, block.bytes, Advice::preferred_location, Location::gpu);
  actions.advise(block.base, block.bytes, Advice::accessed_by, Location::gpu);
}

const std::vector<std::string_view>& policy_names() {
  static const std::vector<std::string_view> names{"demand", "advise"};
  return names;
}

std::unique_ptr<Policy> make_policy(std::string_view name) {
  if (name == "demand") return std::make_unique<DemandPolicy>();
  if (name == "advise") return std::make_unique<AdvisePolicy>();
  return nullptr;
}

}  // namespace spillway
