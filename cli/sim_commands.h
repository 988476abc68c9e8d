// `spillway sweep` and `spillway replay`: the simulator's commands (docs/simulator.md).
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

namespace spillway::cli {

// Adds the `sweep` and `replay` subcommands to `app`. After app.parse(), if parsed() is
// true, run() carries out the one that was given and returns the exit status: 0 done,
// 2 bad options or malformed trace (one line "spillway: ..." on stderr), 1 other failure.
class SimCommands {
 public:
  explicit SimCommands(CLI::App& app);
  ~SimCommands();
  bool parsed() const;
  int run();

  struct Options;  // defined in sim_commands.cpp

 private:
  std::unique_ptr<Options> o_;
};

}  // namespace spillway::cli
