#include "spillway/spill_array.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "spillway/log.h"

namespace spillway::spill_detail {

namespace {

std::size_t page_bytes() {
  static const std::size_t p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The spill folder (spill_array.h).
std::string spill_dir() {
  for (const char* var : {"SPILLWAY_SPILL_DIR", "TMPDIR"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return v;
  }
  return access("/var/tmp", W_OK) == 0 ? "/var/tmp" : "/tmp";
}

// An unlinked file in the spill folder, or -1.
int make_spill_file(std::string* dir_out) {
  const std::string dir = spill_dir();
  *dir_out = dir;
  int fd = -1;
#ifdef O_TMPFILE
  fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
#endif
  std::string path = dir + "/spillway-spill-XXXXXX";
  fd = mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) return -1;
  unlink(path.c_str());
  return fd;
}

}  // namespace

void Mapping::grow(std::size_t bytes) {
  const std::size_t page = page_bytes();
  std::size_t want = std::max({bytes, 2 * capacity, std::size_t{64} << 10});
  want = (want + page - 1) / page * page;
  if (base == nullptr) {
    std::string dir;
    fd = make_spill_file(&dir);
    if (fd < 0) {
      static std::once_flag once;
      std::call_once(once, [&] {
        log(LogLevel::warn, "cannot create a spill file in {} ({}); the simulator keeps its traces in memory (set SPILLWAY_SPILL_DIR)",
            dir, std::strerror(errno));
      });
    }
  }
  if (fd >= 0) {
    // Blocks reserved on disk now: a full disk is this error, not a SIGBUS at a later write.
    if (const int rc = posix_fallocate(fd, static_cast<off_t>(capacity), static_cast<off_t>(want - capacity)); rc != 0) {
      throw std::runtime_error(fmt::format("cannot grow the simulator's spill file to {} bytes: {} (set SPILLWAY_SPILL_DIR to a folder with room)",
                                           want, std::strerror(rc)));
    }
  }
  void* p = nullptr;
  if (base == nullptr) {
    p = fd >= 0 ? mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    p = mremap(base, capacity, want, MREMAP_MAYMOVE);
  }
  if (p == MAP_FAILED) throw std::bad_alloc();
  base = p;
  capacity = want;
}

void Mapping::release(std::size_t from, std::size_t to) const {
  if (fd < 0 || base == nullptr) return;  // anonymous: the pages are the only copy
  const std::size_t page = page_bytes();
  const std::size_t lo = (from + page - 1) / page * page, hi = std::min(to / page * page, capacity);
  if (lo < hi) madvise(static_cast<char*>(base) + lo, hi - lo, MADV_DONTNEED);
}

void Mapping::reset() noexcept {
  if (base != nullptr) munmap(base, capacity);
  if (fd >= 0) close(fd);
  base = nullptr;
  fd = -1;
  capacity = 0;
}

}  // namespace spillway::spill_detail
