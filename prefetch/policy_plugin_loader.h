// Loads policy plugins (spillway/policy_plugin.h) for the registry (policy_registry.h): a
// spec whose name holds a '/' is a plugin's path. Thread-safe; a plugin loaded once stays
// loaded (and is found again by its path) for the life of the process.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "spillway/policy.h"

namespace spillway {

// Whether a spec names a plugin: the text before its first ':' holds a '/'.
bool is_plugin_spec(std::string_view spec);

// A plugin spec split into (PATH, PARAMS): the whole spec when it names an existing file,
// else at the first ':' before which the text names an existing file (a path may hold ':'),
// else at the first ':' after the first '/' (no ':': PARAMS empty). White space around PATH
// is dropped.
std::pair<std::string, std::string> split_plugin_spec(std::string_view spec);

// Loads the plugin at `path` (dlopen, RTLD_NOW | RTLD_LOCAL) if not loaded yet, checks its
// ABI version and layout (kPolicyPluginAbi, policy_plugin_layout()), and makes an instance
// for `params`. On failure returns nullptr and sets *error to one line naming `path` and what
// is wrong: the file cannot be loaded (dlerror's text), an entry point is missing, the ABI or
// the layout differs (both values given), or the plugin's factory refused `params` (its line).
std::unique_ptr<Policy> make_plugin_policy(const std::string& path, const std::string& params, std::string* error);

}  // namespace spillway
