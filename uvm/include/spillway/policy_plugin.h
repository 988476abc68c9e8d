// A Policy in a shared library of its own (a plugin), loaded by name at run time: the shim
// (SPILLWAY_POLICY=/path/libmypolicy.so), `spillway sweep`/`replay` (--policy
// /path/libmypolicy.so) and `spillway run` take a path wherever they take a policy name, so
// the same decision code runs in the simulator and in front of a real program
// (docs/research.md, "A policy as a plugin"). A spec is `PATH` or `PATH:PARAMS`; a PATH holds
// a '/' (`./libmine.so` for one in the current folder), and PARAMS, the text after the first
// ':', goes to the plugin's factory as it is.
//
// A plugin is built against this header and spillway/policy.h alone (`find_package(Spillway)`
// gives the target Spillway::policy; examples/policy-plugin) — their types and inline code:
// it links nothing of Spillway's (`to_string(AllocKind)`, declared in spillway/types.h, lives
// in Spillway's library and is not for plugins) — and defines its three entry points with
// SPILLWAY_POLICY_PLUGIN(make) below, `make` being
//   std::unique_ptr<spillway::Policy> make(std::string_view params, std::string* error);
// which returns the policy, or nullptr with *error set to one line naming what is wrong in
// `params` (the host then refuses the spec with that line: exit 2 in the command, and the shim
// passes every call through).
//
// The contract, checked when the plugin is loaded (a mismatch is refused with one line naming
// the file and what differs):
//  - kPolicyPluginAbi: the version of the entry points and of the Policy interface;
//  - policy_plugin_layout(): the sizes and offsets of the types a Policy is handed (Access,
//    Launch, Block, FaultRecord) and the C++ library's ABI, as this header computes them for
//    the plugin's build and for Spillway's.
// The host never unloads a plugin (its code outlives every Policy it made). Each device's
// plan, and each simulated cell, gets an instance of its own, called by one thread at a time
// (the Engine serialises a Policy's calls: spillway/policy.h); the factory itself is called
// from several threads at once (`spillway sweep --jobs`), so it must be thread-safe. No
// exception may leave the plugin — not from its static constructors, an entry point or a
// callback: the host's C++ runtime may not be the plugin's (the wheel's command and shim
// link theirs statically), and an exception crossing between two runtimes aborts the
// process. SPILLWAY_POLICY_PLUGIN's factory catches inside the plugin what `make` throws
// (the spec is then refused); the callbacks must catch their own. Under the
// shim the plugin is loaded while the shim starts: CUDA calls made from its constructors or
// factory reach the driver directly. The plugin may use the C++ standard library freely; it
// must not keep pointers into a Launch past the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "spillway/policy.h"

namespace spillway {

// The entry points' and the Policy interface's version; raised whenever either changes.
inline constexpr std::uint32_t kPolicyPluginAbi = 1;

// A fingerprint of the layout of what crosses between host and plugin, computed where this
// header is compiled (FNV-1a over the sizes and offsets, and the C++ library's dual-ABI
// setting). Equal on both sides, or the plugin is refused.
inline std::uint64_t policy_plugin_layout() {
  const std::uint64_t facts[] = {
      sizeof(Access), offsetof(Access, addr), offsetof(Access, bytes), offsetof(Access, write), offsetof(Access, inferred),
      offsetof(Access, block_end),
      sizeof(Launch), offsetof(Launch, seq), offsetof(Launch, name), offsetof(Launch, exec_id), offsetof(Launch, accesses),
      offsetof(Launch, dur_ns), offsetof(Launch, now_ns), offsetof(Launch, device), offsetof(Launch, writes_known),
      sizeof(Block), offsetof(Block, base), offsetof(Block, bytes), offsetof(Block, id), offsetof(Block, kind),
      offsetof(Block, stream), offsetof(Block, device), sizeof(FaultRecord), offsetof(FaultRecord, launch_seq),
      offsetof(FaultRecord, addr), offsetof(FaultRecord, write), sizeof(Location), sizeof(Advice), sizeof(AllocKind),
      sizeof(ChunkIndex), sizeof(Policy), sizeof(Actions), sizeof(VictimQuery), sizeof(std::function<bool(ChunkIndex)>),
      sizeof(std::string), sizeof(std::string_view),
#ifdef _GLIBCXX_USE_CXX11_ABI
      _GLIBCXX_USE_CXX11_ABI,
#endif
  };
  std::uint64_t h = 14695981039346656037ull;
  for (std::uint64_t f : facts) {
    h ^= f;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace spillway

// The plugin's entry points (C linkage, default visibility), defined by the macro below.
extern "C" {
// kPolicyPluginAbi of the plugin's build.
std::uint32_t spillway_policy_plugin_abi();
// policy_plugin_layout() of the plugin's build.
std::uint64_t spillway_policy_plugin_layout();
// A new instance for `params` (NUL-terminated, "" when the spec has none), or nullptr with a
// NUL-terminated line in error[0, error_bytes). The host deletes the instance (virtual
// destructor).
spillway::Policy* spillway_policy_plugin_make(const char* params, char* error, std::size_t error_bytes);
}

// Defines the three entry points from `make_fn`, a function
//   std::unique_ptr<spillway::Policy> make_fn(std::string_view params, std::string* error).
#define SPILLWAY_POLICY_PLUGIN(make_fn)                                                                             \
  extern "C" __attribute__((visibility("default"))) std::uint32_t spillway_policy_plugin_abi() {                   \
    return spillway::kPolicyPluginAbi;                                                                              \
  }                                                                                                                 \
  extern "C" __attribute__((visibility("default"))) std::uint64_t spillway_policy_plugin_layout() {                \
    return spillway::policy_plugin_layout();                                                                        \
  }                                                                                                                 \
  extern "C" __attribute__((visibility("default"))) spillway::Policy* spillway_policy_plugin_make(                 \
      const char* params, char* error, std::size_t error_bytes) {                                                  \
    std::string why;                                                                                                \
    std::unique_ptr<spillway::Policy> p;                                                                            \
    try {                                                                                                           \
      p = make_fn(params == nullptr ? std::string_view() : std::string_view(params), &why);                         \
    } catch (...) {                                                                                                 \
      why = "the plugin's factory threw";                                                                           \
      p.reset();                                                                                                    \
    }                                                                                                               \
    if (!p && error != nullptr && error_bytes > 0) {                                                                \
      if (why.empty()) why = "the plugin made no policy";                                                           \
      const std::size_t n = why.size() < error_bytes - 1 ? why.size() : error_bytes - 1;                            \
      std::memcpy(error, why.data(), n);                                                                            \
      error[n] = '\0';                                                                                              \
    }                                                                                                               \
    return p.release();                                                                                             \
  }
