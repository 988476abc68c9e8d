#include "policy_plugin_loader.h"

#include <dlfcn.h>

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
  if (abi() != kPolicyPluginAbi) {
    return {nullptr, fmt::format("policy plugin {} was built for plugin ABI {}, this Spillway has {}: rebuild it against "
                                 "this Spillway's headers",
                                 path, abi(), kPolicyPluginAbi)};
  }
  if (layout() != policy_plugin_layout()) {
    return {nullptr, fmt::format("policy plugin {} lays out the Policy's types differently (layout {:#x}, this Spillway "
                                 "{:#x}): rebuild it against this Spillway's headers with the same compiler",
                                 path, layout(), policy_plugin_layout())};
  }
  return {make, {}};
}

}  // namespace

bool is_plugin_path(std::string_view name) { return name.find('/') != std::string_view::npos; }

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
  std::unique_ptr<Policy> p(plugin.make(params.c_str(), why, sizeof why));
  if (!p) *error = fmt::format("policy plugin {} refused '{}': {}", path, params, why[0] != '\0' ? why : "no reason given");
  return p;
}

}  // namespace spillway
