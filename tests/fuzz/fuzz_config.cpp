// libFuzzer target: the configuration table (uvm/include/spillway/config.h). The input is a
// list of lines "VARIABLE=value" (VARIABLE may be abbreviated to the index of a row, "#3=").
// Checks beyond "no crash":
//   - read_config over the same settings reports exactly the variables set_option rejects;
//   - every error is one line naming the variable (bad values are shown, never split lines);
//   - a rejected value leaves the Config unchanged; an accepted one is idempotent;
//   - sizes resolve to at most their total and percentages lie in (0, 100].
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/config.h"

namespace {
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_config: invariant failed: %s\n", what);
    std::abort();
  }
}

bool same(const spillway::Config& a, const spillway::Config& b) {
  auto size_eq = [](const spillway::SizeSetting& x, const spillway::SizeSetting& y) {
    return x.bytes == y.bytes && x.percent == y.percent && x.unset == y.unset;
  };
  return a.policy == b.policy && size_eq(a.budget, b.budget) && size_eq(a.max_managed, b.max_managed) &&
         a.exclude == b.exclude && a.report_memory == b.report_memory && a.log_level == b.log_level &&
         a.report_path == b.report_path && a.disable == b.disable;
}

void check_sizes(const spillway::SizeSetting& s) {
  if (s.unset) return;
  check(s.percent >= 0.0 && s.percent <= 100.0, "percentage outside [0, 100]");
  check(s.resolve(1000) <= 1000 || s.percent == 0.0, "a percentage resolves above its total");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<std::string_view> kPolicies{"demand", "advise"};
  const auto& table = spillway::option_table();
  std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> env;  // last value of a variable wins, as with setenv
  std::size_t start = 0;
  while (start < input.size()) {
    std::size_t nl = input.find('\n', start);
    if (nl == std::string::npos) nl = input.size();
    std::string line = input.substr(start, nl - start);
    start = nl + 1;
    std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string var = line.substr(0, eq), value = line.substr(eq + 1);
    if (!var.empty() && var[0] == '#') {
      std::size_t row = static_cast<std::size_t>(std::atoi(var.c_str() + 1));
      var = std::string(table[row % table.size()].variable);
    }
    // "\\n" in a value stands for a newline, so values spanning lines can be expressed.
    for (std::size_t p; (p = value.find("\\n")) != std::string::npos;) value.replace(p, 2, "\n");
    env[var] = value;
  }

  spillway::Config direct;
  std::map<std::string, bool> rejected;
  for (const auto& [var, value] : env) {
    spillway::Config before = direct;
    std::string msg = spillway::set_option(direct, var, value, kPolicies);
    if (!msg.empty()) {
      check(same(before, direct), "a rejected value changed the Config");
      check(msg.find('\n') == std::string::npos && msg.find('\r') == std::string::npos,
            "an error message spans more than one line");
      bool plain_name = true;
      for (char c : var) plain_name = plain_name && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
      if (plain_name) check(msg.find(var) != std::string::npos, "an error message does not name its variable");
      rejected[var] = true;
    } else {
      spillway::Config twice = direct;
      check(spillway::set_option(twice, var, value, kPolicies).empty() && same(twice, direct),
            "setting the same value twice is not idempotent");
    }
  }
  check_sizes(direct.budget);
  check_sizes(direct.max_managed);

  auto lookup = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  spillway::ConfigResult r = spillway::read_config(kPolicies, lookup);
  std::size_t expected = 0;
  for (const auto& row : table) {
    auto it = env.find(std::string(row.variable));
    // read_config skips empty values and stops a string at its first NUL, like getenv.
    if (it == env.end() || it->second.c_str()[0] == '\0') continue;
    spillway::Config scratch;
    if (!spillway::set_option(scratch, row.variable, it->second.c_str(), kPolicies).empty()) ++expected;
  }
  check(r.errors.size() == expected, "read_config and set_option disagree on which values are bad");
  for (const auto& e : r.errors) {
    check(e.message.find('\n') == std::string::npos, "a read_config error spans more than one line");
  }
  return 0;
}
