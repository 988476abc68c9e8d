// Policy plugins (spillway/policy_plugin.h, prefetch/policy_plugin_loader.h): how a spec is
// told from a built-in name and split into path and parameters, and the pin that makes a
// change of the Policy interface raise kPolicyPluginAbi.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "policy_plugin_loader.h"
#include "policy_registry.h"
#include "spillway/policy_plugin.h"

namespace spillway {
namespace {

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The headers a plugin is built against, pinned to the ABI version that describes them. A
// change to either fails this test: if it changes what a plugin is handed or may call (a
// type, a virtual function, their order), raise kPolicyPluginAbi (policy_plugin.h); then pin
// the new hash here, with the version it belongs to.
TEST(PolicyPlugin, TheInterfaceHeadersArePinnedToTheAbiVersion) {
  const std::string dir = std::string(SPILLWAY_SOURCE_DIR) + "/uvm/include/spillway/";
  const std::uint64_t hash = fnv1a(read(dir + "policy.h") + read(dir + "types.h"));
  EXPECT_EQ(kPolicyPluginAbi, 1u);
  EXPECT_EQ(hash, 0x441e642f0648bba4ull) << std::hex << "policy.h or types.h changed (hash 0x" << hash
                                         << "): raise kPolicyPluginAbi if what a plugin sees changed, then pin the hash";
}

TEST(PolicyPlugin, ASpecIsAPluginWhenItsNameHoldsASlash) {
  EXPECT_TRUE(is_plugin_spec("/opt/p/libmine.so"));
  EXPECT_TRUE(is_plugin_spec("./libmine.so:depth=2"));
  EXPECT_FALSE(is_plugin_spec("learned"));
  EXPECT_FALSE(is_plugin_spec("learned:path=/x")) << "a '/' after the ':' is a value";
}

TEST(PolicyPlugin, APathMayHoldAColonWhereAFileIsThere) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("plugin-spec-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "a:b");
  const std::string file = (dir / "a:b" / "lib.so").string();
  std::ofstream(file) << "x";
  EXPECT_EQ(split_plugin_spec(" " + file + " :depth=1,dir=/x:y"), std::make_pair(file, std::string("depth=1,dir=/x:y")));
  EXPECT_EQ(split_plugin_spec(file), std::make_pair(file, std::string()));
  // No file at any ':': the first ':' after the first '/' ends the path (the load then names it).
  EXPECT_EQ(split_plugin_spec("/nowhere/lib.so:a=1:b"), std::make_pair(std::string("/nowhere/lib.so"), std::string("a=1:b")));
  std::filesystem::remove_all(dir);
}

TEST(PolicyPlugin, AMissingPluginIsRefusedWithOneLineNamingIt) {
  std::string error;
  EXPECT_FALSE(parse_policy_spec("/nowhere/libmine.so:depth=2", false, &error));
  EXPECT_EQ(error.rfind("cannot load policy plugin /nowhere/libmine.so: ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace spillway
