#include "spillway/managed_cap.h"

#include "spillway/log.h"
#include "spillway/size.h"

namespace spillway {

Result wait_at_cap(Backend& backend, const ManagedCap& cap, EventHandle handle, bool fence) {
  Result r = fence ? backend.wait_fence_for(handle, cap.wait()) : backend.wait_event_for(handle, cap.wait());
  if (r.status == Status::not_ready) {
    SPILLWAY_LOG_ONCE(LogLevel::warn,
                      "an allocation at the managed cap (SPILLWAY_MAX_MANAGED = {}) gave up after {} ms waiting for device "
                      "work on freed memory (a kernel that never ends?); it is refused as out of memory "
                      "(raise SPILLWAY_MAX_MANAGED to give such a program room)",
                      format_bytes(cap.limit()), cap.wait().count());
  }
  return r;
}

}  // namespace spillway
