#include "policy_registry.h"
#include "policy_plugin_loader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <tuple>
#include <type_traits>

#include <fmt/format.h>

#include "learned.h"
#include "policies.h"

namespace spillway {
namespace {

using Factory = std::function<std::unique_ptr<Policy>(const PolicySpec&, const OracleFuture*)>;

struct Entry {
  std::string_view name;
  bool simulator_only = false;
  std::vector<Tunable> tunables;
  Factory make;
};

// learned's tunables: LearnedParams' fields (prefetch/learned.h says what each does and why
// its default is what it is); the defaults are the struct's own, kept there once.
using LearnedSetter = void (*)(LearnedParams&, double);
struct LearnedRow {
  Tunable tunable;
  LearnedSetter set;
};
#define SPILLWAY_LEARNED_TUNABLE(field, unit, lo, hi, meaning)                                                       \
  LearnedRow {                                                                                                         \
    Tunable{#field, unit, static_cast<double>(LearnedParams{}.field), lo, hi,                                          \
            std::is_integral_v<decltype(LearnedParams::field)>, meaning},                                              \
        [](LearnedParams& p, double v) { p.field = static_cast<decltype(LearnedParams::field)>(v); }                  \
  }

const std::vector<LearnedRow>& learned_rows() {
  static const std::vector<LearnedRow> rows{
      SPILLWAY_LEARNED_TUNABLE(context, "launches", 1, 1024, "execution ids hashed to find the place in the history after a divergence"),
      SPILLWAY_LEARNED_TUNABLE(link_bytes_per_s, "bytes/s", 1e8, 1e13, "link bandwidth toward the GPU assumed by the lookahead's virtual clock"),
      SPILLWAY_LEARNED_TUNABLE(early_write_back, "flag", 0, 1, "evict the victims of launches just past the horizon ahead of need"),
      SPILLWAY_LEARNED_TUNABLE(write_back_scan, "launches", 0, 65536, "launches past the horizon walked per launch for early write-back"),
      SPILLWAY_LEARNED_TUNABLE(slack_ns, "ns", 0, 1e10, "lookahead beyond the link's virtual queue"),
      SPILLWAY_LEARNED_TUNABLE(min_ahead, "launches", 0, 65536, "lookahead at least, in launches"),
      SPILLWAY_LEARNED_TUNABLE(max_ahead, "launches", 1, 1 << 24, "lookahead at most, in launches"),
      SPILLWAY_LEARNED_TUNABLE(max_scan, "launches", 1, 1 << 24, "predicted launches scanned per launch at most"),
      SPILLWAY_LEARNED_TUNABLE(default_dur_ns, "ns", 0, 1e10, "duration assumed for a launch never timed"),
      SPILLWAY_LEARNED_TUNABLE(anchor_ages, "launches", 0, 254, "anchor ages whose prefetch precision is tracked apart"),
      SPILLWAY_LEARNED_TUNABLE(min_precision, "share", 0, 1, "prefetch from an anchor age only while its precision is at least this"),
      SPILLWAY_LEARNED_TUNABLE(retry, "share per launch", 0, 1, "how fast a refused anchor age's precision returns toward 1"),
      SPILLWAY_LEARNED_TUNABLE(guess_factor, "x mean reuse distance", 0, 1000, "next use guessed from a signature, in mean reuse distances"),
      SPILLWAY_LEARNED_TUNABLE(max_waiting, "share", 0, 1, "early evictions MIN would not make are refused while waiting is at least this"),
      SPILLWAY_LEARNED_TUNABLE(max_log, "launches", 16, 2147483648.0, "history kept before it is compacted"),
      SPILLWAY_LEARNED_TUNABLE(recurring_share, "share", 0, 1, "share of a compacted history kept for recurring execution ids"),
  };
  return rows;
}
#undef SPILLWAY_LEARNED_TUNABLE

std::unique_ptr<Policy> make_learned(const PolicySpec& spec) {
  LearnedParams params;
  for (const auto& [key, value] : spec.values) {
    for (const LearnedRow& row : learned_rows())
      if (row.tunable.name == key) row.set(params, value);
  }
  return std::make_unique<LearnedPolicy>(params);
}

std::vector<Tunable> learned_tunables() {
  std::vector<Tunable> out;
  for (const LearnedRow& row : learned_rows()) out.push_back(row.tunable);
  return out;
}

// The defaults of the other policies are their constructors' (prefetch/policies.h).
const std::vector<Entry>& entries() {
  static const std::vector<Entry> table{
      {"demand", false, {}, [](const PolicySpec&, const OracleFuture*) { return std::make_unique<DemandPolicy>(); }},
      {"advise", false, {}, [](const PolicySpec&, const OracleFuture*) { return std::make_unique<AdvisePolicy>(); }},
      {"sequential", false,
       {{"depth", "launches", 2, 1, 4096, true, "launches ahead whose blocks are prefetched"},
        {"max_log", "launches", 1 << 16, 16, 1 << 24, true, "launches of history kept"}},
       [](const PolicySpec& s, const OracleFuture*) {
         return std::make_unique<SequentialPolicy>(static_cast<std::size_t>(s.value("depth")),
                                                   static_cast<std::size_t>(s.value("max_log")));
       }},
      {"correlation", false,
       {{"degree", "launches", 16, 1, 4096, true, "launches followed along the chain of successors"}},
       [](const PolicySpec& s, const OracleFuture*) {
         return std::make_unique<CorrelationPolicy>(static_cast<std::size_t>(s.value("degree")));
       }},
      {"learned", false, learned_tunables(), [](const PolicySpec& s, const OracleFuture*) { return make_learned(s); }},
      {"oracle", true,
       {{"max_lookahead", "launches", 256, 1, 1 << 20, true, "launches ahead the oracle prefetches for"},
        {"read_mostly", "flag", 1, 0, 1, true, "advise read-mostly the chunks read until their next write"},
        {"early_write_back", "flag", 1, 0, 1, true, "write back ahead of need by MIN"}},
       [](const PolicySpec& s, const OracleFuture* future) -> std::unique_ptr<Policy> {
         if (future == nullptr) return nullptr;
         return std::make_unique<OraclePolicy>(*future, static_cast<std::size_t>(s.value("max_lookahead")),
                                               s.value("read_mostly") != 0, s.value("early_write_back") != 0);
       }},
  };
  return table;
}

const Entry* find(std::string_view name) {
  for (const Entry& e : entries())
    if (e.name == name) return &e;
  return nullptr;
}

std::string lower_trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string range_text(const Tunable& t) {
  if (t.unit == "flag") return "0 or 1";
  return fmt::format("{}{} to {} ({})", t.whole ? "a whole number from " : "", t.min, t.max, t.unit);
}

std::string keys_text(const Entry& e) {
  if (e.tunables.empty()) return fmt::format("policy {} has no tunables", e.name);
  std::vector<std::string_view> keys;
  for (const Tunable& t : e.tunables) keys.push_back(t.name);
  return fmt::format("policy {} has {}", e.name, fmt::join(keys, ", "));
}

// One KEY=VALUE of `entry`: the value stored in `spec`, or the error.
std::string parse_value(const Entry& entry, std::string_view item, PolicySpec& spec) {
  const std::size_t eq = item.find('=');
  if (eq == std::string_view::npos) return fmt::format("'{}' in policy {}: expected KEY=VALUE", item, entry.name);
  const std::string key = lower_trimmed(item.substr(0, eq));
  const std::string text = lower_trimmed(item.substr(eq + 1));
  auto t = std::find_if(entry.tunables.begin(), entry.tunables.end(), [&](const Tunable& x) { return x.name == key; });
  if (t == entry.tunables.end()) return fmt::format("unknown key '{}': {}", key, keys_text(entry));
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool bad = text.empty() || ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v) ||
                   v < t->min || v > t->max || (t->whole && v != std::floor(v));
  if (bad) return fmt::format("invalid value '{}' for {}:{}: expected {}", text, entry.name, key, range_text(*t));
  for (auto& [k, old] : spec.values)
    if (k == t->name) return fmt::format("{}:{} is given twice", entry.name, key);
  spec.values.emplace_back(t->name, v);
  return {};
}

// Cross-checks between tunables of one policy.
std::string check_together(const PolicySpec& spec) {
  if (spec.name == "learned" && spec.value("min_ahead") > spec.value("max_ahead")) {
    return fmt::format("learned:min_ahead ({}) exceeds learned:max_ahead ({})", spec.value("min_ahead"), spec.value("max_ahead"));
  }
  return {};
}

void order_like_table(const Entry& e, PolicySpec& spec) {
  auto rank = [&](std::string_view k) {
    for (std::size_t i = 0; i < e.tunables.size(); ++i)
      if (e.tunables[i].name == k) return i;
    return e.tunables.size();
  };
  std::sort(spec.values.begin(), spec.values.end(), [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
}

std::string number_text(double v) { return v == std::floor(v) && std::fabs(v) < 1e15 ? fmt::format("{:.0f}", v) : fmt::format("{}", v); }

}  // namespace

double PolicySpec::value(std::string_view key) const {
  for (const auto& [k, v] : values)
    if (k == key) return v;
  for (const Tunable& t : policy_tunables(name))
    if (t.name == key) return t.default_value;
  return 0;
}

std::string PolicySpec::text() const {
  if (plugin) return plugin_params.empty() ? name : name + ":" + plugin_params;
  std::string out = name;
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += fmt::format("{}{}={}", i == 0 ? ":" : ",", values[i].first, number_text(values[i].second));
  }
  return out;
}

std::string PolicySpec::full_text() const {
  if (plugin) return text();
  std::string out = name;
  const auto& tunables = policy_tunables(name);
  for (std::size_t i = 0; i < tunables.size(); ++i) {
    out += fmt::format("{}{}={}", i == 0 ? ":" : ",", tunables[i].name, number_text(value(tunables[i].name)));
  }
  return out;
}

const std::vector<std::string_view>& policy_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const Entry& e : entries())
      if (!e.simulator_only) out.push_back(e.name);
    return out;
  }();
  return names;
}

const std::vector<std::string_view>& sim_policy_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const Entry& e : entries()) out.push_back(e.name);
    return out;
  }();
  return names;
}

const std::vector<Tunable>& policy_tunables(std::string_view name) {
  static const std::vector<Tunable> none;
  const Entry* e = find(name);
  return e != nullptr ? e->tunables : none;
}

namespace {

// A plugin's spec (is_plugin_spec): loaded and tried once here.
std::optional<PolicySpec> parse_plugin_spec(std::string_view text, std::string* error) {
  PolicySpec spec;
  spec.plugin = true;
  std::tie(spec.name, spec.plugin_params) = split_plugin_spec(text);
  if (!make_plugin_policy(spec.name, spec.plugin_params, error)) return std::nullopt;
  return spec;
}

}  // namespace

std::optional<PolicySpec> parse_policy_spec(std::string_view text, bool simulator, std::string* error) {
  const std::size_t colon = text.find(':');
  if (is_plugin_spec(text)) return parse_plugin_spec(text, error);
  PolicySpec spec;
  spec.name = lower_trimmed(text.substr(0, colon));
  const Entry* e = find(spec.name);
  if (e == nullptr || (e->simulator_only && !simulator)) {
    const auto& names = simulator ? sim_policy_names() : policy_names();
    *error = fmt::format("unknown policy '{}': expected one of {}", spec.name, fmt::join(names, ", "));
    return std::nullopt;
  }
  if (colon != std::string_view::npos) {
    std::string_view rest = text.substr(colon + 1);
    while (true) {
      const std::size_t comma = rest.find(',');
      if (std::string err = parse_value(*e, rest.substr(0, comma), spec); !err.empty()) {
        *error = std::move(err);
        return std::nullopt;
      }
      if (comma == std::string_view::npos) break;
      rest = rest.substr(comma + 1);
    }
  }
  order_like_table(*e, spec);
  if (std::string err = check_together(spec); !err.empty()) {
    *error = std::move(err);
    return std::nullopt;
  }
  return spec;
}

std::vector<std::string> split_policy_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    std::string_view piece = text.substr(0, comma);
    const bool continues = piece.find('=') != std::string_view::npos && piece.find(':') == std::string_view::npos;
    if (continues && !out.empty()) out.back() += "," + std::string(piece);
    else out.emplace_back(piece);
    if (comma == std::string_view::npos) break;
    text = text.substr(comma + 1);
  }
  return out;
}

std::unique_ptr<Policy> make_policy(const PolicySpec& spec) {
  if (spec.plugin) {
    std::string error;  // (the spec was tried when it was parsed)
    return make_plugin_policy(spec.name, spec.plugin_params, &error);
  }
  const Entry* e = find(spec.name);
  return e != nullptr && !e->simulator_only ? e->make(spec, nullptr) : nullptr;
}

std::unique_ptr<Policy> make_policy(std::string_view text) {
  std::string error;
  std::optional<PolicySpec> spec = parse_policy_spec(text, false, &error);
  return spec ? make_policy(*spec) : nullptr;
}

std::unique_ptr<Policy> make_sim_policy(const PolicySpec& spec, const OracleFuture* future) {
  if (spec.plugin) return make_policy(spec);
  const Entry* e = find(spec.name);
  return e != nullptr ? e->make(spec, future) : nullptr;
}

std::unique_ptr<Policy> make_sim_policy(std::string_view text, const OracleFuture* future) {
  std::string error;
  std::optional<PolicySpec> spec = parse_policy_spec(text, true, &error);
  return spec ? make_sim_policy(*spec, future) : nullptr;
}

}  // namespace spillway
