#include "policy_plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "spillway/policy_plugin.h"

namespace spillway {
namespace {

using AbiFn = std::uint32_t (*)();
using LayoutFn = std::uint64_t (*)();
using MakeFn = Policy* (*)(const char*, char*, std::size_t);

struct Plugin {
  MakeFn make = nullptr;
  std::string error;  // why it cannot be used (then make is null)
};

// The plugin at `path`, loaded and checked once. (Never unloaded: its code outlives the
// policies it made.)
Plugin load(const std::string& path) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return {nullptr, fmt::format("cannot load policy plugin {}: {}", path, why != nullptr ? why : "dlopen failed")};
  }
  auto abi = reinterpret_cast<AbiFn>(::dlsym(handle, "spillway_policy_plugin_abi"));
  auto layout = reinterpret_cast<LayoutFn>(::dlsym(handle, "spillway_policy_plugin_layout"));
  auto make = reinterpret_cast<MakeFn>(::dlsym(handle, "spillway_policy_plugin_make"));
  if (abi == nullptr || layout == nullptr || make == nullptr) {
    return {nullptr, fmt::format("{} is not a Spillway policy plugin: it lacks spillway_policy_plugin_abi, _layout or _make "
                                 "(define them with SPILLWAY_POLICY_PLUGIN, spillway/policy_plugin.h)",
                                 path)};
  }
  std::uint32_t plugin_abi = 0;
  std::uint64_t plugin_layout = 0;
  try {
    plugin_abi = abi();
    plugin_layout = layout();
  } catch (...) {
    return {nullptr, fmt::format("policy plugin {} threw when asked its ABI", path)};
  }
  if (plugin_abi != kPolicyPluginAbi) {
    return {nullptr, fmt::format("policy plugin {} was built for plugin ABI {}, this Spillway has {}: rebuild it against "
                                 "this Spillway's headers",
                                 path, plugin_abi, kPolicyPluginAbi)};
  }
  if (plugin_layout != policy_plugin_layout()) {
    return {nullptr, fmt::format("policy plugin {} lays out the Policy's types differently (layout {:#x}, this Spillway "
                                 "{:#x}): rebuild it against this Spillway's headers with the same compiler",
                                 path, plugin_layout, policy_plugin_layout())};
  }
  return {make, {}};
}

}  // namespace

bool is_plugin_spec(std::string_view spec) {
  return spec.substr(0, spec.find(':')).find('/') != std::string_view::npos;
}

std::pair<std::string, std::string> split_plugin_spec(std::string_view spec) {
  auto trimmed = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return std::string(s);
  };
  auto is_file = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  const std::size_t first = spec.find(':', spec.find('/'));
  if (first == std::string_view::npos || is_file(trimmed(spec))) return {trimmed(spec), ""};
  for (std::size_t c = first; c != std::string_view::npos; c = spec.find(':', c + 1)) {
    if (std::string path = trimmed(spec.substr(0, c)); is_file(path)) return {path, std::string(spec.substr(c + 1))};
  }
  return {trimmed(spec.substr(0, first)), std::string(spec.substr(first + 1))};
}

std::unique_ptr<Policy> make_plugin_policy(const std::string& path, const std::string& params, std::string* error) {
  static std::mutex mutex;
  static auto* plugins = new std::map<std::string, Plugin>;  // (leaked: used until exit)
  Plugin plugin;
  {
    std::lock_guard lock(mutex);
    auto it = plugins->find(path);
    if (it == plugins->end()) it = plugins->emplace(path, load(path)).first;
    plugin = it->second;
  }
  if (plugin.make == nullptr) {
    *error = plugin.error;
    return nullptr;
  }
  char why[512] = {};
  std::unique_ptr<Policy> p;
  try {  // (the macro's factory catches inside the plugin; an exception that leaves a plugin with
         // a C++ runtime of its own may abort before it gets here: policy_plugin.h)
    p.reset(plugin.make(params.c_str(), why, sizeof why));
  } catch (...) {
    std::snprintf(why, sizeof why, "its factory threw");
  }
  if (!p) {
    why[sizeof why - 1] = '\0';
    std::string reason = why[0] != '\0' ? why : "no reason given";
    std::replace_if(reason.begin(), reason.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
    *error = fmt::format("policy plugin {} refused '{}': {}", path, params, reason);
  }
  return p;
}

}  // namespace spillway
