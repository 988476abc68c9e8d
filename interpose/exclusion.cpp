// SPILLWAY_EXCLUDE: allocations whose call stack passes through an excluded library (by
// default libnccl, whose buffers must stay IPC-shareable device memory) are left alone.
//
// Cost: the loaded objects are scanned with dl_iterate_phdr only when the set of loaded
// objects changed (glibc's dlpi_adds/dlpi_subs counters); the stack is unwound with
// libunwind only while an excluded library is actually loaded.
#include <link.h>

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "shim.h"

namespace spillway::interpose {
namespace {

struct Range {
  std::uintptr_t begin, end;
};

struct Loaded {
  unsigned long long adds = 0, subs = 0;
};

// Never destroyed: allocations on other threads may check exclusion while exit() runs the
// static destructors.
std::mutex& g_mutex = *new std::mutex;
std::vector<Range>& g_ranges = *new std::vector<Range>;  // executable segments of excluded libraries
Loaded g_seen{~0ull, ~0ull};
// The common answer without the lock: the loaded objects' counters (adds in the high half,
// subs in the low) when the last scan found no excluded library, ~0 otherwise. Written
// under g_mutex after g_seen and g_ranges.
std::atomic<std::uint64_t> g_none_loaded_at{~0ull};
std::uint64_t packed(const Loaded& l) { return (l.adds << 32) | (l.subs & 0xffffffffull); }

int read_counters(struct dl_phdr_info* info, size_t size, void* data) {
  auto* out = static_cast<Loaded*>(data);
  if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
    out->adds = info->dlpi_adds;
    out->subs = info->dlpi_subs;
  }
  return 1;  // the counters are the same in every entry: stop at the first
}

struct Collect {
  const std::vector<std::string>* names;
  std::vector<Range>* ranges;
};

int collect(struct dl_phdr_info* info, size_t, void* data) {
  auto* c = static_cast<Collect*>(data);
  const char* path = info->dlpi_name;
  if (path == nullptr || *path == '\0') return 0;
  const char* file = std::strrchr(path, '/');
  file = file ? file + 1 : path;
  bool match = false;
  for (const std::string& n : *c->names) {
    if (n.front() == '/' ? n == path : std::strstr(file, n.c_str()) != nullptr) {
      match = true;
      break;
    }
  }
  if (!match) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      std::uintptr_t b = info->dlpi_addr + ph.p_vaddr;
      c->ranges->push_back(Range{b, b + ph.p_memsz});
    }
  }
  return 0;
}

}  // namespace

bool allocation_excluded() {
  Engine* e = engine();
  if (e == nullptr || e->config().exclude.empty()) return false;
  Loaded now;
  dl_iterate_phdr(read_counters, &now);
  if (g_none_loaded_at.load(std::memory_order_acquire) == packed(now)) return false;
  std::vector<Range> ranges;
  {
    std::lock_guard lock(g_mutex);
    if (now.adds != g_seen.adds || now.subs != g_seen.subs) {
      g_ranges.clear();
      Collect c{&e->config().exclude, &g_ranges};
      dl_iterate_phdr(collect, &c);
      g_seen = now;
    }
    g_none_loaded_at.store(g_ranges.empty() ? packed(g_seen) : ~0ull, std::memory_order_release);
    if (g_ranges.empty()) return false;
    ranges = g_ranges;
  }
  void* ips[64];
  int n = unw_backtrace(ips, 64);
  for (int i = 0; i < n; ++i) {
    auto ip = reinterpret_cast<std::uintptr_t>(ips[i]);
    for (const Range& r : ranges) {
      if (ip >= r.begin && ip < r.end) return true;
    }
  }
  return false;
}

}  // namespace spillway::interpose
