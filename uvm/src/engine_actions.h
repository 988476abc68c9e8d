// The Engine's private types shared by its source files (engine.cpp: construction, the
// allocation path and statistics; engine_launch.cpp: the launch path and moves;
// engine_free.cpp: the free path and contexts).
#pragma once

#include <cstdint>
#include <vector>

#include "spillway/engine.h"

namespace spillway {

// A Policy's request, as the Engine carries it out.
struct Engine::Action {
  enum class Kind { prefetch, advise } kind;
  std::uint64_t addr;
  std::uint64_t bytes;
  Location where;
  Advice advice;
};

// Collects a Policy's requests while the Engine's lock is held; they are carried out after
// it is released, so no lock is ever held across a driver call.
class Engine::EngineActions final : public Actions {
 public:
  void prefetch(std::uint64_t addr, std::uint64_t bytes, Location to) override {
    list.push_back(Action{Action::Kind::prefetch, addr, bytes, to, Advice::preferred_location});
  }
  void advise(std::uint64_t addr, std::uint64_t bytes, Advice advice, Location where) override {
    list.push_back(Action{Action::Kind::advise, addr, bytes, where, advice});
  }
  std::vector<Action> list;
};

// One launch's plan: made under the planning lock (make_launch_plan), carried out after it.
struct Engine::LaunchPlan {
  EngineActions actions;
  std::vector<Move> moves;
  bool planned = false;       // the Engine planned residency (its moves carry the prefetches)
  std::uint64_t epoch = 0;    // kept in flight (0: none)
  std::uint64_t ticket = 0;   // PlanOrder's
  std::uint64_t frees_at_plan = ReleaseGate::kFreeInProgress;
};

}  // namespace spillway
