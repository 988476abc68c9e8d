// next-launch: an example Spillway policy plugin (spillway/policy_plugin.h). Before each
// launch it prefetches what the launch that followed this kernel's last occurrence used, and
// (depth > 1) what followed that one, and so on; the Engine evicts the least recently used
// chunks to make room. With depth=1 it decides as the built-in `sequential:depth=1` does.
//
//   spillway sweep TRACE --policy sequential:depth=1,/abs/path/libnext_launch.so:depth=1
//   SPILLWAY_POLICY=/abs/path/libnext_launch.so:depth=2 LD_PRELOAD=.../libspillway.so ./my_program
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <spillway/policy_plugin.h>

namespace {

class NextLaunch final : public spillway::Policy {
 public:
  explicit NextLaunch(unsigned depth) : depth_(depth) {}
  std::string_view name() const override { return "next-launch"; }
  bool manages_residency() const override { return true; }

  void on_launch(const spillway::Launch& launch, spillway::Actions& actions) override {
    if (has_previous_) {  // this launch followed `previous_`
      Next& n = next_[previous_];
      n.exec_id = launch.exec_id;
      n.accesses.assign(launch.accesses.begin(), launch.accesses.end());
    }
    std::uint64_t id = launch.exec_id;
    for (unsigned step = 0; step < depth_; ++step) {
      auto it = next_.find(id);
      if (it == next_.end()) break;
      for (const spillway::Access& a : it->second.accesses) actions.prefetch(a.addr, a.bytes, spillway::Location::gpu);
      id = it->second.exec_id;
    }
    previous_ = launch.exec_id;
    has_previous_ = true;
  }

  std::uint64_t state_bytes() const override {
    std::uint64_t bytes = next_.size() * (sizeof(Next) + 32);
    for (const auto& [id, n] : next_) bytes += n.accesses.capacity() * sizeof(spillway::Access);
    return bytes;
  }

 private:
  struct Next {
    std::uint64_t exec_id = 0;                 // the launch that followed
    std::vector<spillway::Access> accesses;   // and what it used
  };
  unsigned depth_;
  std::unordered_map<std::uint64_t, Next> next_;  // exec id -> what followed its last occurrence
  std::uint64_t previous_ = 0;
  bool has_previous_ = false;
};

// PARAMS: empty, or depth=N with N in 1..64.
std::unique_ptr<spillway::Policy> make(std::string_view params, std::string* error) {
  unsigned depth = 1;
  if (!params.empty()) {
    constexpr std::string_view key = "depth=";
    const char* end = params.data() + params.size();
    if (params.substr(0, key.size()) != key ||
        std::from_chars(params.data() + key.size(), end, depth).ptr != end || depth < 1 || depth > 64) {
      *error = "expected depth=N with N in 1..64, got '" + std::string(params) + "'";
      return nullptr;
    }
  }
  return std::make_unique<NextLaunch>(depth);
}

}  // namespace

SPILLWAY_POLICY_PLUGIN(make)
