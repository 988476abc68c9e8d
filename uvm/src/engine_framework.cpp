// A framework's own allocator, followed (engine.h; docs/design.md, "A framework's allocator,
// followed"): its segments are our blocks, its tensors inside them come and go as it reports,
// and a launch's pointer into one is given that tensor's extent.
#include <algorithm>

#include "spillway/engine.h"

namespace spillway {

bool Engine::follow_segment(std::uint64_t base, std::uint64_t bytes) {
  std::optional<Block> block = table_.find(base);
  if (!block || bytes == 0 || bytes > block->end() - base) return framework_.refuse();
  return framework_.add_segment(base, bytes);
}

void Engine::unfollow_segment(std::uint64_t base, std::uint64_t bytes) { framework_.drop_segments(base, base + bytes); }

bool Engine::note_tensor_alloc(std::uint64_t addr, std::uint64_t bytes) {
  if (!table_.find(addr)) return framework_.refuse();
  return framework_.add_tensor(addr, bytes);
}

bool Engine::note_tensor_free(std::uint64_t addr) { return framework_.remove_tensor(addr).has_value(); }

std::optional<Block> Engine::find_extent(std::uint64_t addr) const {
  std::optional<Block> block = table_.find(addr);
  if (!block || framework_.live_tensors() == 0) return block;
  if (std::optional<FrameworkTensors::Extent> tensor = framework_.find(addr); tensor && block->contains(tensor->base)) {
    // (Clipped to the block: a tensor left from a block released meanwhile never widens it.)
    const std::uint64_t end = std::min(tensor->end, block->end());
    block->base = tensor->base;
    block->bytes = end - tensor->base;
  }
  return block;
}

}  // namespace spillway
