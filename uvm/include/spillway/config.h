// Spillway's settings, read once from SPILLWAY_* environment variables (docs/configuration.md).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillway/log.h"

namespace spillway {

enum class ReportMemory { physical, virtual_ };

// A size that may be absolute or relative to a total known only later (GPU or host RAM).
struct SizeSetting {
  std::uint64_t bytes = 0;   // used when percent == 0
  double percent = 0.0;      // share of the total, 0 < percent <= 100
  bool unset = true;         // "physical" / no limit given

  // Resolves against `total` bytes; an unset setting resolves to `total`.
  std::uint64_t resolve(std::uint64_t total) const;
};

struct Config {
  std::string policy = "learned";
  SizeSetting budget;                      // unset: the physical free memory at start
  SizeSetting max_managed{0, 80.0, false};  // of host RAM
  bool suballocator = true;                // SPILLWAY_SUBALLOCATOR
  bool framework_per_tensor = true;        // SPILLWAY_FRAMEWORK_ALLOCATOR: per-tensor (true) or keep
  bool fault_feedback = true;              // SPILLWAY_FAULT_FEEDBACK
  std::uint64_t state_memory = 256ull << 20;  // SPILLWAY_STATE_MEMORY, bytes
  std::vector<std::string> exclude{"libnccl"};
  ReportMemory report_memory = ReportMemory::physical;
  LogLevel log_level = LogLevel::warn;
  bool summary = true;      // SPILLWAY_SUMMARY: the exit line (report.h, exit_summary)
  std::string report_path;
  std::string trace_path;   // SPILLWAY_TRACE: empty = no trace
  // SPILLWAY_TRACE_WINDOW: which launches the trace holds. launches == 0: all of them;
  // last: the last `launches`; otherwise `launches` after the first `warmup`.
  struct TraceWindow {
    std::uint64_t launches = 0;
    std::uint64_t warmup = 0;
    bool last = false;
  } trace_window;
  bool disable = false;
};

// One row of config.def, for help texts and docs.
struct OptionInfo {
  std::string_view field;
  std::string_view variable;
  std::string_view default_text;
  std::string_view accepted;
  std::string_view meaning;
};
const std::vector<OptionInfo>& option_table();

struct ConfigError {
  std::string variable;
  std::string value;
  std::string message;  // one line: "invalid value 'x' for SPILLWAY_Y: expected ..."
};

struct ConfigResult {
  Config config;
  std::vector<ConfigError> errors;      // empty when every variable was valid
  std::vector<std::string> warnings;    // valid values that are probably not what was meant
                                        // (setting_warning), one line each
};

// A valid value that is probably a mistake, said in one line; empty when it is not one.
// Today: a size setting (SPILLWAY_BUDGET, SPILLWAY_MAX_MANAGED) given as a bare number of
// fewer than 2 MiB (a size without a unit is bytes, parse_size(): "4" is 4 bytes, and no
// GPU plan fits a chunk in it). read_config() collects these; the shim logs them at warn,
// `spillway info` prints them. Pure; thread-safe.
std::string setting_warning(std::string_view variable, std::string_view value);

// Reads every SPILLWAY_* variable through `lookup` (getenv by default). Unset or empty
// variables keep their defaults. An invalid value is reported in `errors` (the field keeps
// its default); the shim then passes everything through. Policy names are checked against
// `policy_names`. Thread-safe if `lookup` is. Never throws for bad input.
ConfigResult read_config(const std::vector<std::string_view>& policy_names,
                         const std::function<const char*(const char*)>& lookup = nullptr);

// Parses one variable's value into `config`; returns the error message, empty if valid.
// `variable` is e.g. "SPILLWAY_BUDGET". Used by `spillway run` to check options before exec.
std::string set_option(Config& config, std::string_view variable, std::string_view value,
                       const std::vector<std::string_view>& policy_names);

// SPILLWAY_STATE_MEMORY's one rule, which `spillway run`, `sweep` and `replay
// --state-memory` and the shim's environment all go through (set_option): a size of at
// least kMinStateMemoryBytes in parse_size()'s forms (256MiB, 1GiB, 2000000000), or
// "unlimited" (no bound: kUnlimitedStateMemory, the policies' own "no limit"); any case,
// surrounding spaces ignored. Returns the bytes, or nullopt for anything else; set_option()
// then gives the one error message, which lists the accepted values (config.def's row).
// Pure; thread-safe.
inline constexpr std::uint64_t kMinStateMemoryBytes = 16ull << 20;
inline constexpr std::uint64_t kUnlimitedStateMemory = UINT64_MAX;
std::optional<std::uint64_t> parse_state_memory(std::string_view text);

// The GPU bytes the Engine plans for on a device with `free_bytes` of `total_bytes` free
// (cuMemGetInfo at the first allocation): SPILLWAY_BUDGET resolved against the total, and
// never more than is free; unset, all that is free. The Engine and `spillway info` both use
// it. Pure.
std::uint64_t planned_budget_bytes(const Config& config, std::uint64_t free_bytes, std::uint64_t total_bytes);

// The cap on the managed bytes of the process: SPILLWAY_MAX_MANAGED resolved against
// `host_bytes` (read_host_memory_bytes()). Pure.
std::uint64_t managed_cap_bytes(const Config& config, std::uint64_t host_bytes);

// Host RAM in bytes (sysconf(_SC_PHYS_PAGES) * page size), bounded by the cgroup v2 memory
// limit of the process (/sys/fs/cgroup/memory.max) when one is set; 0 when unknown.
// Reads /sys on each call; thread-safe.
std::uint64_t read_host_memory_bytes();

}  // namespace spillway
