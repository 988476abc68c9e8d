// `spillway policies [--json] [NAME...]`: every policy and its tunables (name, unit, default,
// range, meaning), from the one table each policy declares (prefetch/policy_registry.h), so
// that what can be swept or set (NAME:KEY=VALUE in --policy and SPILLWAY_POLICY) is listed
// by the same code that checks it.
#pragma once

#include <string>
#include <vector>

namespace spillway::cli {

// Prints the listing on stdout: a table, or one JSON object when `json` ({"policies": [{name,
// shim, tunables: [{name, unit, default, min, max, whole, meaning}]}]}). `names` limits it to
// those policies (all when empty). Returns 0, or 2 with one line on stderr for an unknown name.
int policies_command(const std::vector<std::string>& names, bool json);

}  // namespace spillway::cli
