#include "spillway/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
