#include "spillway/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace spillway {

std::string with_pid(const std::string& path, long pid) {
  const std::size_t slash = path.rfind('/');
  const std::size_t name = slash == std::string::npos ? 0 : slash + 1;
  // The first dot of the name that is not its first character starts the extensions.
  std::size_t dot = path.find('.', name + 1);
  if (dot == std::string::npos || name >= path.size()) dot = path.size();
  return path.substr(0, dot) + "." + std::to_string(pid) + path.substr(dot);
}

bool valid_output_pattern(std::string_view pattern) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (i + 1 == pattern.size()) return false;
    const char next = pattern[++i];
    if (next != 'p' && next != 'r' && next != '%') return false;
  }
  return true;
}

namespace {

bool is_decimal(const char* s) {
  if (s == nullptr || *s == '\0') return false;
  for (const char* c = s; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9') return false;
  }
  return true;
}

}  // namespace

std::string rank_from_environment() {
  // torchrun (RANK), Open MPI, MPICH/Intel MPI (PMI_RANK), Slurm; then the node-local rank.
  for (const char* variable : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"}) {
    const char* v = std::getenv(variable);
    if (is_decimal(v)) return v;
  }
  return "0";
}

std::string expand_output_pattern(std::string_view pattern, long pid, std::string_view rank) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '%' && i + 1 < pattern.size()) {
      const char next = pattern[i + 1];
      if (next == 'p') out += std::to_string(pid);
      else if (next == 'r') out += rank;
      else if (next == '%') out += '%';
      else {
        out += c;
        continue;
      }
      ++i;
      continue;
    }
    out += c;
  }
  return out;
}

std::string expand_output_pattern(std::string_view pattern) {
  return expand_output_pattern(pattern, static_cast<long>(::getpid()), rank_from_environment());
}

namespace {

bool create_exclusive(const std::string& path, int* err) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  ::close(fd);
  return true;
}

}  // namespace

std::string claim_output_file(const std::string& path, std::string* error) {
  // Not a regular file (a FIFO, /dev/stdout, a symbolic link): written as it is, shared.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return path;
  int err = 0;
  if (create_exclusive(path, &err)) return path;
  if (err != EEXIST) {
    *error = fmt::format("cannot create '{}': {}", path, std::strerror(err));
    return {};
  }
  const std::string mine = with_pid(path, static_cast<long>(::getpid()));
  if (create_exclusive(mine, &err)) return mine;
  *error = fmt::format("'{}' exists and '{}' cannot be created: {}", path, mine, std::strerror(err));
  return {};
}

}  // namespace spillway
