#include "spillway/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

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

// One step of a file name pattern (matches_output_name): a byte, one digit, or any number
// of digits (%r is a digit and then any number).
struct NameToken {
  enum Kind : unsigned char { byte, digit, digits } kind;
  char c;
};

std::vector<NameToken> name_tokens(std::string_view pattern) {
  std::vector<NameToken> out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'r') {
      out.push_back({NameToken::digit, 0});
      out.push_back({NameToken::digits, 0});
      ++i;
      continue;
    }
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == '%') ++i;
    out.push_back({NameToken::byte, pattern[i]});
  }
  return out;
}

}  // namespace

bool matches_output_name(std::string_view name_pattern, std::string_view file_name) {
  const std::vector<NameToken> tokens = name_tokens(name_pattern);
  std::size_t least = 0;  // the bytes a match needs
  for (const NameToken& t : tokens) least += t.kind != NameToken::digits;
  if (least > file_name.size()) return false;
  // at[j]: the first j tokens match the bytes read so far (every position at once, as
  // Thompson's construction runs an automaton: no backtracking).
  std::vector<char> at(tokens.size() + 1, 0), next(tokens.size() + 1, 0);
  auto skip_digit_runs = [&](std::vector<char>& s) {  // (a run of digits may be empty)
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      if (s[j] && tokens[j].kind == NameToken::digits) s[j + 1] = 1;
    }
  };
  at[0] = 1;
  skip_digit_runs(at);
  for (const char c : file_name) {
    const bool digit = c >= '0' && c <= '9';
    bool alive = false;
    std::fill(next.begin(), next.end(), 0);
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      if (!at[j]) continue;
      const NameToken& t = tokens[j];
      const bool step = t.kind == NameToken::byte ? t.c == c : digit;
      if (!step) continue;
      next[t.kind == NameToken::digits ? j : j + 1] = 1;
      alive = true;
    }
    if (!alive) return false;
    skip_digit_runs(next);
    at.swap(next);
  }
  return at[tokens.size()] != 0;
}

std::string write_error(std::string_view path, int err) {
  return fmt::format("cannot write {}: {}", path, err != 0 ? std::strerror(err) : "write failed");
}

std::string why_not_writable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file(path);
  if (fs::is_directory(file, ec)) return fmt::format("{}: is a folder, not a file", path);
  const bool exists = fs::exists(file, ec);
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (!exists && !fs::is_directory(folder, ec)) return fmt::format("{}: there is no folder {}", path, folder.string());
  const fs::path& checked = exists ? file : folder;  // (what fopen "w" needs to write)
  if (access(checked.c_str(), W_OK) != 0) return fmt::format("{}: cannot write {}: {}", path, checked.string(), std::strerror(errno));
  return "";
}

OutputFile::OutputFile(const std::string& path) : path_(path) {
  errno = 0;
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) throw std::runtime_error(write_error(path_, errno));
}

OutputFile::~OutputFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void OutputFile::fail(int err) {
  std::fclose(std::exchange(file_, nullptr));
  throw std::runtime_error(write_error(path_, err));
}

void OutputFile::write(std::string_view bytes) {
  if (file_ == nullptr) throw std::logic_error(fmt::format("{}: written after close", path_));
  errno = 0;
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) fail(errno);
}

void OutputFile::close() {
  if (file_ == nullptr) return;
  errno = 0;
  if (std::fflush(file_) != 0 || std::ferror(file_)) fail(errno);
  errno = 0;
  if (std::fclose(std::exchange(file_, nullptr)) != 0) throw std::runtime_error(write_error(path_, errno));
}

std::string flush_standard_output() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout)) return {};
  return write_error("standard output", flushed ? 0 : err);  // (0: an earlier write failed, its errno is gone)
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
