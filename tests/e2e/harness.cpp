#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace spillway::test {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> RunResult::err_lines() const { return split_lines(err); }
std::vector<std::string> RunResult::out_lines() const { return split_lines(out); }

namespace {
// True if the ELF file at `path` names `soname_prefix` (e.g. "libasan.so") among its strings:
// enough to tell a sanitizer-linked binary from a plain one.
bool links_library(const std::string& path, const std::string& soname_prefix) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes.find(soname_prefix) != std::string::npos;
}
}  // namespace

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.status) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

RunResult run(const std::vector<std::string>& argv, const Env& env, int timeout_s) {
  RunResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);

  std::vector<std::string> env_strings;
  Env full = env;
  full.emplace("PATH", "/usr/bin:/bin");
  // The toolkit's libcupti must never meet the fake driver: fault feedback stays off unless a
  // test turns it on, with the fake libcupti (tests/fakecuda/cupti.cpp) on its library path.
  full.emplace("SPILLWAY_FAULT_FEEDBACK", "off");
  // The exit line (SPILLWAY_SUMMARY) stays off unless a test asks for it: most tests check
  // that the shim writes nothing to stderr.
  full.emplace("SPILLWAY_SUMMARY", "off");
  // Sanitizer settings of a sanitizer build (scripts/test --sanitize) reach the children too.
  for (const char* var : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"}) {
    if (const char* v = std::getenv(var)) full.emplace(var, v);
  }
  // A sanitized libspillway.so preloaded into an unsanitized program needs the sanitizer
  // runtime ahead of it (scripts/test --sanitize sets SPILLWAY_TEST_PRELOAD_FIRST).
  if (const char* first = std::getenv("SPILLWAY_TEST_PRELOAD_FIRST"); first != nullptr && *first != '\0') {
    auto it = full.find("LD_PRELOAD");
    bool given = it != full.end() && !it->second.empty();
    // A program that links the runtime itself (a sanitized build's own binaries) already has
    // it first; a LD_PRELOAD its caller chose is then left exactly as given.
    if (!(given && links_library(argv[0], std::filesystem::path(first).filename().string()))) {
      full["LD_PRELOAD"] = given ? std::string(first) + ":" + it->second : std::string(first);
    }
  }
  for (const auto& [k, v] : full) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    result.err = std::string("cannot start ") + argv[0] + ": " + std::strerror(rc);
    return result;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  bool killed = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1000))) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (WIFEXITED(wstatus)) result.status = WEXITSTATUS(wstatus);
  else if (WIFSIGNALED(wstatus)) result.status = 128 + WTERMSIG(wstatus);
  if (killed) result.err += "\n[harness: killed after timeout]";
  return result;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs g_temp_dirs;
}  // namespace

std::string temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "spillway-e2e-XXXXXX").string();
  char* made = mkdtemp(pattern.data());
  if (made == nullptr) std::abort();
  g_temp_dirs.dirs.push_back(made);
  return made;
}

std::string field(const std::string& text, const std::string& key) {
  for (const std::string& line : split_lines(text)) {
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w.rfind(key + "=", 0) == 0) return w.substr(key.size() + 1);
    }
  }
  return "";
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(text))
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

}  // namespace spillway::test
