#include "policies_command.h"

#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "policy_registry.h"

namespace spillway::cli {
namespace {

std::string number(double v) { return fmt::format("{}", v); }

bool in_shim(std::string_view name) {
  const auto& names = policy_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

nlohmann::json as_json(const std::vector<std::string_view>& names) {
  nlohmann::json list = nlohmann::json::array();
  for (std::string_view name : names) {
    nlohmann::json tunables = nlohmann::json::array();
    for (const Tunable& t : policy_tunables(name)) {
      tunables.push_back({{"name", t.name}, {"unit", t.unit}, {"default", t.default_value}, {"min", t.min},
                          {"max", t.max}, {"whole", t.whole}, {"meaning", t.meaning}});
    }
    list.push_back({{"name", name}, {"shim", in_shim(name)}, {"tunables", tunables}});
  }
  return {{"policies", list}};
}

void print_table(const std::vector<std::string_view>& names) {
  for (std::string_view name : names) {
    std::cout << name << (in_shim(name) ? "" : " (simulator only)") << '\n';
    const auto& tunables = policy_tunables(name);
    if (tunables.empty()) std::cout << "  (no tunables)\n";
    for (const Tunable& t : tunables) {
      std::cout << fmt::format("  {:<18} {:>12}  {} .. {} {}{}\n      {}\n", t.name, number(t.default_value), number(t.min),
                               number(t.max), t.unit, t.whole && t.unit != "flag" ? ", whole" : "", t.meaning);
    }
  }
  std::cout << "\nSet them as NAME:KEY=VALUE[,KEY=VALUE...] in --policy (run, sweep, replay) or SPILLWAY_POLICY;\n"
               "sweep a tunable with --policy learned:context=4,learned:context=16.\n";
}

}  // namespace

int policies_command(const std::vector<std::string>& given, bool json) {
  std::vector<std::string_view> names;
  for (const std::string& g : given) {
    const auto& all = sim_policy_names();
    auto it = std::find(all.begin(), all.end(), g);
    if (it == all.end()) {
      std::cerr << fmt::format("spillway: unknown policy '{}': expected one of {}\n", g, fmt::join(all, ", "));
      return 2;
    }
    names.push_back(*it);
  }
  if (names.empty()) names = sim_policy_names();
  if (json) std::cout << as_json(names).dump(2) << '\n';
  else print_table(names);
  return 0;
}

}  // namespace spillway::cli
