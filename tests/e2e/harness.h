// Runs a program in a child process (posix_spawn) with an explicit environment and collects
// its exit status, stdout and stderr. Shared by e2e_test (fake driver) and gpu_test.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace spillway::test {

struct RunResult {
  int status = -1;  // exit status; 128 + signal if killed; -1 if it could not be started
  std::string out, err;
  std::vector<std::string> err_lines() const;
  std::vector<std::string> out_lines() const;
};

using Env = std::map<std::string, std::string>;

// Runs argv[0] (a path) with exactly `env` (plus PATH=/usr/bin:/bin unless given, and the
// parent's *SAN_OPTIONS), killing it after `timeout_s` seconds. When the parent has
// SPILLWAY_TEST_PRELOAD_FIRST (a sanitizer runtime, set by scripts/test --sanitize), it is
// put first in the child's LD_PRELOAD — except for a program that links that runtime itself
// and was given an LD_PRELOAD, which is then passed exactly as given.
RunResult run(const std::vector<std::string>& argv, const Env& env, int timeout_s = 120);

std::vector<std::string> split_lines(const std::string& text);
std::string read_file(const std::string& path);
// A fresh empty directory under the temporary directory, removed at exit.
std::string temp_dir();
// The value after "key=" in the first line that has it, or "" if none.
std::string field(const std::string& text, const std::string& key);
// "exit N", then the child's stdout and stderr under headings: a failed check's message.
std::string describe(const RunResult& r);
// Lines of `text` that contain `needle`.
std::vector<std::string> lines_with(const std::string& text, const std::string& needle);

}  // namespace spillway::test
