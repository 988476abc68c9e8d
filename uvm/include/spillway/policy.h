// Policies decide what to move and what to advise (DESIGN §4). A Policy is plain C++ with
// no CUDA dependency: it sees the Engine's events one at a time, in order, and answers
// through an Actions sink. It is deterministic for a given event sequence and never sees
// the future (the simulator-only `oracle` excepted).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "spillway/types.h"

namespace spillway {

// What a Policy asks the Engine to do. The Engine checks each request (budget, live block)
// before handing it to the Backend.
class Actions {
 public:
  virtual ~Actions() = default;
  virtual void prefetch(std::uint64_t addr, std::uint64_t bytes, Location to) = 0;
  virtual void advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where) = 0;
};

// Not thread-safe: the Engine serialises calls to one Policy.
class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // A managed block came to life (after the Backend allocated it).
  virtual void on_alloc(const Block& block, Actions& actions) { (void)block, (void)actions; }
  // A managed block is about to be released.
  virtual void on_free(const Block& block, Actions& actions) { (void)block, (void)actions; }
};

// The policies this build knows, by name (prefetch/policies.cpp).
const std::vector<std::string_view>& policy_names();
// A new instance of policy `name`; nullptr for an unknown name.
std::unique_ptr<Policy> make_policy(std::string_view name);

}  // namespace spillway
