// The policies by name, with their tunables as data: every policy declares its tunables
// (name, unit, default, range, one line of meaning) in one table, and a policy is named
// by a spec, `NAME` or `NAME:KEY=VALUE[,KEY=VALUE...]`, read the same way by the shim
// (SPILLWAY_POLICY), `spillway sweep`/`replay` (--policy) and `spillway policies`.
// A value is checked once, when the spec is parsed, against its tunable's range, as
// nvidia-uvm checks its module parameters once at load (uvm_perf_prefetch.c: each
// parameter has a default, a minimum and a maximum, and an out-of-range value is replaced
// with a warning; here it is refused with one line naming the key and its range).
// Everything here is pure and thread-safe (the tables are built once, read-only).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spillway/policy.h"

namespace spillway {

struct OracleFuture;

// One tunable of a policy. Values are carried as double: a whole-number tunable accepts
// only whole numbers, a flag (unit "flag") only 0 and 1.
struct Tunable {
  std::string_view name;     // the KEY of NAME:KEY=VALUE
  std::string_view unit;     // "launches", "ns", "bytes/s", "share", "flag", ...
  double default_value = 0;  // the value when the spec does not name it
  double min = 0, max = 0;   // the accepted range, inclusive
  bool whole = false;        // only whole numbers
  std::string_view meaning;  // one line
};

// A policy with its tunables' values. `values` holds every tunable the spec named, in the
// order of the policy's table; the rest keep their defaults.
struct PolicySpec {
  std::string name;  // a built-in policy's name, or a plugin's path (`plugin`)
  std::vector<std::pair<std::string_view, double>> values;
  // A policy plugin (spillway/policy_plugin.h): `name` is its path, and `plugin_params` the
  // text after the spec's first ':', given to the plugin's factory as it is.
  bool plugin = false;
  std::string plugin_params;
  // The value of tunable `key`: the spec's, else its default. `key` must be a tunable of `name`.
  double value(std::string_view key) const;
  // The spec as text: `NAME`, then `:` and the values the spec set, in table order
  // (`learned:context=16`); `NAME` alone when it set none.
  std::string text() const;
  // `NAME:` and every tunable with its value, defaults included: the full parameter string
  // a sweep's CSV records.
  std::string full_text() const;
};

// The policies the shim accepts (no `oracle`: it needs the future, which only the simulator has).
const std::vector<std::string_view>& policy_names();
// The same and `oracle`.
const std::vector<std::string_view>& sim_policy_names();
// The tunables of policy `name` (empty for an unknown name or a policy without any).
const std::vector<Tunable>& policy_tunables(std::string_view name);

// Parses `text` (`NAME` or `NAME:KEY=VALUE[,KEY=VALUE...]`; names and keys are
// case-insensitive, white space around them is ignored). `simulator`: `oracle` is accepted.
// A NAME holding a '/' is a policy plugin's path (`PATH` or `PATH:PARAMS`,
// spillway/policy_plugin.h): the plugin is loaded and asked for an instance with PARAMS here,
// so that a bad path, a plugin built for another Spillway or PARAMS it refuses are errors of
// the spec.
// On bad input returns nullopt and sets `*error` to one line naming what is wrong (the
// unknown name with the accepted ones, the unknown key with the policy's keys, or the value
// with the key's range and unit).
std::optional<PolicySpec> parse_policy_spec(std::string_view text, bool simulator, std::string* error);

// Splits a comma-separated list of specs (`--policy learned:a=1,b=2,demand`): a piece that
// holds `=` but no `:` continues the spec before it. Does not validate.
std::vector<std::string> split_policy_list(std::string_view text);

// A new instance of the policy `spec` names with its values; nullptr for `oracle`.
std::unique_ptr<Policy> make_policy(const PolicySpec& spec);
// The same from text; nullptr for an invalid spec (or `oracle`).
std::unique_ptr<Policy> make_policy(std::string_view text);
// Simulator: also `oracle`, over `future` (nullptr: no oracle).
std::unique_ptr<Policy> make_sim_policy(const PolicySpec& spec, const OracleFuture* future);
std::unique_ptr<Policy> make_sim_policy(std::string_view text, const OracleFuture* future);

}  // namespace spillway
