#include "helper_scripts.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

namespace spillway::cli {

namespace fs = std::filesystem;

std::string find_helper_script(const char* file, const char* env_var) {
  if (const char* env = std::getenv(env_var); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    candidates.push_back(exe.parent_path() / ".." / "share" / "spillway" / file);
    candidates.push_back(exe.parent_path() / ".." / ".." / "scripts" / file);
  }
  candidates.push_back(fs::path(SPILLWAY_SOURCE_DIR) / "scripts" / file);
  for (const fs::path& p : candidates) {
    if (fs::exists(p, ec)) return fs::weakly_canonical(p, ec).string();
  }
  return {};
}

std::string helper_python() {
  if (const char* env = std::getenv("SPILLWAY_PYTHON"); env != nullptr && *env != '\0') return env;
  if (std::error_code ec; fs::exists("/usr/bin/python3", ec)) return "/usr/bin/python3";
  return "python3";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

}  // namespace spillway::cli
