#include "spillway/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "spillway/output_file.h"
#include "spillway/size.h"
#include "spillway/types.h"

namespace spillway {

std::uint64_t SizeSetting::resolve(std::uint64_t total) const {
  if (unset) return total;
  if (percent > 0.0) return static_cast<std::uint64_t>(std::floor(static_cast<double>(total) * percent / 100.0));
  return bytes;
}

namespace {

std::string trimmed(std::string_view s) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return std::string(s);
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Each parse_<field> returns true when `value` is valid and stores it.
using Names = std::vector<std::string_view>;

// A policy spec: NAME or NAME:KEY=VALUE[,...] (prefetch/policy_registry.h). Here the name
// is checked; its tunables are checked where the policy is made (the shim at start, the
// `spillway` command), which knows them. A NAME holding a '/' is a policy plugin's path
// (spillway/policy_plugin.h), kept as written: it is loaded and checked where the policy is
// made.
bool parse_policy(Config& c, std::string_view value, const Names& names) {
  const std::string as_written = trimmed(value);
  if (as_written.substr(0, as_written.find(':')).find('/') != std::string::npos) {
    c.policy = as_written;
    return true;
  }
  std::string v = lower(as_written);
  const std::string_view name = std::string_view(v).substr(0, v.find(':'));
  if (std::find(names.begin(), names.end(), name) == names.end()) return false;
  if (name.size() != v.size() && name.size() + 1 == v.size()) return false;  // "learned:" and nothing after
  c.policy = v;
  return true;
}

// A size or a percentage. `keyword` (if not empty) means "unset".
bool parse_size_setting(SizeSetting& out, std::string_view value, std::string_view keyword) {
  std::string v = trimmed(value);
  if (!keyword.empty() && lower(v) == keyword) {
    out = SizeSetting{};
    return true;
  }
  if (!v.empty() && v.back() == '%') {
    // Parse the percentage against a nominal total of 100 * 2^40 to keep precision.
    auto n = parse_size(v, 100ull << 40);
    if (!n || *n == 0) return false;
    out = SizeSetting{0, static_cast<double>(*n) / static_cast<double>(1ull << 40), false};
    return true;
  }
  auto n = parse_size(v);
  if (!n || *n == 0) return false;
  out = SizeSetting{*n, 0.0, false};
  return true;
}

bool parse_budget(Config& c, std::string_view value, const Names&) {
  return parse_size_setting(c.budget, value, "physical");
}

bool parse_max_managed(Config& c, std::string_view value, const Names&) {
  return parse_size_setting(c.max_managed, value, "");
}

bool parse_exclude(Config& c, std::string_view value, const Names&) {
  std::vector<std::string> libs;
  std::string v = trimmed(value);
  if (lower(v) == "none") {
    c.exclude.clear();
    return true;
  }
  std::size_t start = 0;
  while (start <= v.size()) {
    std::size_t comma = v.find(',', start);
    if (comma == std::string::npos) comma = v.size();
    std::string item = trimmed(std::string_view(v).substr(start, comma - start));
    if (item.empty()) return false;
    if (item.find('/') != std::string::npos && item.front() != '/') return false;
    libs.push_back(item);
    start = comma + 1;
  }
  if (libs.empty()) return false;
  c.exclude = std::move(libs);
  return true;
}

bool parse_report_memory(Config& c, std::string_view value, const Names&) {
  std::string v = lower(trimmed(value));
  if (v == "physical") c.report_memory = ReportMemory::physical;
  else if (v == "virtual") c.report_memory = ReportMemory::virtual_;
  else return false;
  return true;
}

bool parse_log_level(Config& c, std::string_view value, const Names&) {
  std::string v = lower(trimmed(value));
  if (v == "error") c.log_level = LogLevel::error;
  else if (v == "warn" || v == "warning") c.log_level = LogLevel::warn;
  else if (v == "info") c.log_level = LogLevel::info;
  else if (v == "debug") c.log_level = LogLevel::debug;
  else return false;
  return true;
}

bool parse_report_path(Config& c, std::string_view value, const Names&) {
  c.report_path = trimmed(value);
  return !c.report_path.empty() && valid_output_pattern(c.report_path);
}

// A count: decimal digits only, at most 2^63.
bool parse_count(std::string_view text, std::uint64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  std::uint64_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  *out = v;
  return true;
}

bool parse_trace_window(Config& c, std::string_view value, const Names&) {
  const std::string v = lower(trimmed(value));
  Config::TraceWindow w;
  if (v == "all") {
    c.trace_window = w;
    return true;
  }
  if (v.starts_with("last:")) {
    if (!parse_count(std::string_view(v).substr(5), &w.launches) || w.launches == 0) return false;
    w.last = true;
  } else {
    const std::size_t plus = v.find('+');
    if (plus == std::string::npos || !parse_count(std::string_view(v).substr(0, plus), &w.warmup) ||
        !parse_count(std::string_view(v).substr(plus + 1), &w.launches) || w.launches == 0) {
      return false;
    }
  }
  c.trace_window = w;
  return true;
}

bool parse_trace_path(Config& c, std::string_view value, const Names&) {
  c.trace_path = trimmed(value);
  return !c.trace_path.empty() && valid_output_pattern(c.trace_path);
}

bool parse_disable(Config& c, std::string_view value, const Names&) {
  std::string v = lower(trimmed(value));
  if (v == "1" || v == "true" || v == "yes") c.disable = true;
  else if (v == "0" || v == "false" || v == "no") c.disable = false;
  else return false;
  return true;
}

// "on"/"1" or "off"/"0" (any case, trimmed) into *out; false for anything else.
bool parse_on_off(std::string_view value, bool* out) {
  std::string v = lower(trimmed(value));
  if (v == "on" || v == "1") *out = true;
  else if (v == "off" || v == "0") *out = false;
  else return false;
  return true;
}

bool parse_suballocator(Config& c, std::string_view value, const Names&) { return parse_on_off(value, &c.suballocator); }

bool parse_state_memory(Config& c, std::string_view value, const Names&) {
  const auto n = spillway::parse_state_memory(value);
  if (n) c.state_memory = *n;
  return n.has_value();
}

bool parse_summary(Config& c, std::string_view value, const Names&) { return parse_on_off(value, &c.summary); }

bool parse_fault_feedback(Config& c, std::string_view value, const Names&) { return parse_on_off(value, &c.fault_feedback); }

bool parse_framework_allocator(Config& c, std::string_view value, const Names&) {
  std::string v = lower(trimmed(value));
  if (v == "per-tensor") c.framework_per_tensor = true;
  else if (v == "keep") c.framework_per_tensor = false;
  else return false;
  return true;
}

struct Row {
  OptionInfo info;
  bool (*parse)(Config&, std::string_view, const Names&);
};

const std::vector<Row>& rows() {
  static const std::vector<Row> table{
#define SPILLWAY_OPTION(field, variable, default_text, accepted, meaning) \
  Row{OptionInfo{#field, variable, default_text, accepted, meaning}, &parse_##field},
#include "spillway/config.def"
#undef SPILLWAY_OPTION
  };
  return table;
}

// `text` with control characters written as \xNN, so that an error message quoting a
// bad value stays on one line (a value may contain a newline: docs/configuration.md promises one line).
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out;
}

std::string accepted_text(const Row& row, const Names& policy_names) {
  if (row.info.field != "policy") return std::string(row.info.accepted);
  return fmt::format("one of {}, optionally followed by :KEY=VALUE[,KEY=VALUE...] (spillway policies), or a policy "
                     "plugin's path (PATH[:PARAMS], holding a '/')",
                     fmt::join(policy_names, ", "));
}

}  // namespace

const std::vector<OptionInfo>& option_table() {
  static const std::vector<OptionInfo> table = [] {
    std::vector<OptionInfo> out;
    for (const Row& r : rows()) out.push_back(r.info);
    return out;
  }();
  return table;
}

std::string set_option(Config& config, std::string_view variable, std::string_view value,
                       const std::vector<std::string_view>& policy_names) {
  for (const Row& row : rows()) {
    if (row.info.variable != variable) continue;
    Config candidate = config;
    if (row.parse(candidate, value, policy_names)) {
      config = std::move(candidate);
      return {};
    }
    return fmt::format("invalid value '{}' for {}: expected {}", printable(value), printable(variable),
                       accepted_text(row, policy_names));
  }
  return fmt::format("unknown setting {}", printable(variable));
}

std::optional<std::uint64_t> parse_state_memory(std::string_view text) {
  const std::string v = trimmed(text);
  if (lower(v) == "unlimited") return kUnlimitedStateMemory;
  const auto n = parse_size(v);
  if (!n || *n < kMinStateMemoryBytes) return std::nullopt;
  return n;
}

std::uint64_t planned_budget_bytes(const Config& config, std::uint64_t free_bytes, std::uint64_t total_bytes) {
  return config.budget.unset ? free_bytes : std::min(free_bytes, config.budget.resolve(total_bytes));
}

std::uint64_t managed_cap_bytes(const Config& config, std::uint64_t host_bytes) {
  return config.max_managed.resolve(host_bytes);
}

std::uint64_t read_host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  std::uint64_t bytes = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string text;
  if (in >> text && text != "max") {
    std::uint64_t limit = 0;
    if (parse_count(text, &limit) && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  }
  return bytes;
}

std::string setting_warning(std::string_view variable, std::string_view value) {
  if (variable != "SPILLWAY_BUDGET" && variable != "SPILLWAY_MAX_MANAGED") return {};
  const std::string v = trimmed(value);
  std::uint64_t bytes = 0;
  if (!parse_count(v, &bytes) || bytes >= kChunkBytes) return {};  // has a unit, a %, or is large enough
  return fmt::format("{}={} means {} bytes (a size without a unit is bytes); did you mean {}GiB or {}MiB?",
                     variable, v, bytes, v, v);
}

ConfigResult read_config(const std::vector<std::string_view>& policy_names,
                         const std::function<const char*(const char*)>& lookup) {
  ConfigResult result;
  for (const Row& row : rows()) {
    std::string variable(row.info.variable);
    const char* raw = lookup ? lookup(variable.c_str()) : std::getenv(variable.c_str());
    if (raw == nullptr || *raw == '\0') continue;
    std::string message = set_option(result.config, variable, raw, policy_names);
    if (!message.empty()) {
      result.errors.push_back(ConfigError{variable, raw, std::move(message)});
    } else if (std::string warning = setting_warning(variable, raw); !warning.empty()) {
      result.warnings.push_back(std::move(warning));
    }
  }
  return result;
}

}  // namespace spillway
