// A framework's own allocator, followed (engine.h; docs/design.md, "A framework's allocator,
// followed"): its segments are our blocks, its tensors inside them come and go as it reports.
#include <mutex>

#include "spillway/engine.h"
#include "device_plan.h"
#include "engine_actions.h"

namespace spillway {

namespace {

bool refused(std::mutex& mutex, std::uint64_t& count) {
  std::lock_guard lock(mutex);
  ++count;
  return false;
}

}  // namespace

bool Engine::follow_segment(std::uint64_t base, std::uint64_t bytes) {
  std::optional<Block> block = table_.find(base);
  if (!block || bytes == 0 || bytes > block->end() - base) return refused(mutex_, counters_.framework_events_refused);
  return framework_.add_segment(base, bytes);
}

void Engine::unfollow_segment(std::uint64_t base, std::uint64_t bytes) { framework_.drop_segments(base, base + bytes); }

bool Engine::note_tensor_alloc(std::uint64_t addr, std::uint64_t bytes) {
  std::optional<Block> segment_block = table_.find(addr);
  if (!segment_block) return refused(mutex_, counters_.framework_events_refused);
  if (!framework_.add_tensor(addr, bytes)) return false;  // (counted there)
  Block tensor = *segment_block;
  tensor.base = addr;
  tensor.bytes = bytes;
  tensor.id = next_id_.fetch_add(1, std::memory_order_relaxed);
  tensor.suballocated = true;  // (the framework keeps the range when the tensor dies)
  {
    std::lock_guard lock(mutex_);
    ++counters_.framework_tensor_allocs;
  }
  run_policy_tensor(tensor, true);
  return true;
}

bool Engine::note_tensor_free(std::uint64_t addr) {
  std::optional<FrameworkTensors::Extent> extent = framework_.remove_tensor(addr);
  if (!extent) return false;
  std::optional<Block> segment_block = table_.find(addr);
  if (!segment_block) return true;  // (its block is being released: the Policies see that free)
  Block tensor = *segment_block;
  tensor.base = extent->base;
  tensor.bytes = extent->bytes();
  tensor.suballocated = true;
  run_policy_tensor(tensor, false);
  return true;
}

std::optional<Block> Engine::find_extent(std::uint64_t addr) const {
  std::optional<Block> block = table_.find(addr);
  if (!block || framework_.live_tensors() == 0) return block;
  if (std::optional<FrameworkTensors::Extent> tensor = framework_.find(addr); tensor && block->contains(tensor->base)) {
    block->base = tensor->base;
    block->bytes = tensor->bytes();
  }
  return block;
}

void Engine::run_policy_tensor(const Block& tensor, bool alive) {
  if (!plans_.facts().sees_allocations) return;
  EngineActions actions;
  DevicePlan* owner = plans_.of(tensor.device);
  {
    std::lock_guard lock(mutex_);
    plans_.for_each([&](DevicePlan& p) {
      EngineActions ignored;
      if (alive) {
        p.policy->on_alloc(tensor, &p == owner ? actions : ignored);
      } else {
        p.policy->on_free(tensor, ignored);  // (a policy may not act for a dying tensor)
      }
    });
  }
  for (const Action& a : actions.list) send_checked(a, tensor.device, owner);
}

}  // namespace spillway
