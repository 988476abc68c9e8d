// spillway: the command-line front end.
//   spillway run [options] -- CMD [ARGS...]   run CMD with libspillway.so preloaded
#include <algorithm>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "spillway/config.h"
#include "spillway/policy.h"
#include "sim_commands.h"

namespace {

namespace fs = std::filesystem;

// libspillway.so next to this program: <prefix>/bin/spillway -> <prefix>/<libdir>/libspillway.so
// (SPILLWAY_LIB_RELATIVE is set by CMake), or build/bin -> build/lib.
std::string find_shim() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  fs::path bindir = exe.parent_path();
  for (const fs::path& candidate : {bindir / SPILLWAY_LIB_RELATIVE / "libspillway.so", bindir / ".." / "lib" / "libspillway.so"}) {
    if (fs::exists(candidate, ec)) return fs::weakly_canonical(candidate, ec).string();
  }
  return {};
}

[[noreturn]] void fail(int status, const std::string& message) {
  std::cerr << "spillway: " << message << '\n';
  std::exit(status);
}

std::string options_help() {
  std::string out = "\nSettings (each option sets the variable; the variables work without this command too):\n";
  for (const auto& o : spillway::option_table()) {
    out += fmt::format("  {:<24} default {}\n      {}\n      accepts {}\n", o.variable,
                       o.default_text.empty() ? "(none)" : o.default_text, o.meaning, o.accepted);
  }
  return out;
}

int run(const std::vector<std::pair<std::string, std::string>>& settings, const std::vector<std::string>& command) {
  spillway::Config config;
  for (const auto& [variable, value] : settings) {
    std::string err = spillway::set_option(config, variable, value, spillway::policy_names());
    if (!err.empty()) fail(2, err);
  }
  if (command.empty()) fail(2, "no command given: spillway run [options] -- CMD [ARGS...]");
  std::string shim = find_shim();
  if (shim.empty()) fail(2, "cannot find libspillway.so next to this program (looked in ../lib)");

  for (const auto& [variable, value] : settings) {
    setenv(variable.c_str(), value.c_str(), 1);
    // The run's trace and report replace those of an earlier run. Each process of the run
    // creates its file exclusively (spillway/output_file.h): the first takes the name given.
    // (Regular files only: a FIFO, a device or a symbolic link is the user's to keep.)
    if (variable == "SPILLWAY_TRACE" || variable == "SPILLWAY_REPORT") {
      std::error_code ec;
      if (fs::symlink_status(value, ec).type() == fs::file_type::regular) fs::remove(value, ec);
    }
  }
  // The frameworks' per-tensor modes (issue 12; docs/configuration.md), each unless the
  // user set it: every tensor is then a cudaMalloc/cudaFree the shim's sub-allocator serves.
  //  - PyTorch: any value of PYTORCH_NO_CUDA_MEMORY_CACHING turns its caching allocator off
  //    (forceUncachedAllocator(): getenv(...) != nullptr; c10/cuda/CUDACachingAllocator.cpp);
  //  - JAX/XLA: XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates and frees exactly on demand,
  //    XLA_PYTHON_CLIENT_PREALLOCATE=false drops the 75% preallocation (JAX docs, "GPU memory
  //    allocation").
  // SPILLWAY_FRAMEWORK_ALLOCATOR=keep (--framework-allocator keep) leaves them alone.
  if (config.framework_per_tensor) {
    if (const char* v = std::getenv("SPILLWAY_FRAMEWORK_ALLOCATOR"); v != nullptr && *v != '\0' &&
        std::none_of(settings.begin(), settings.end(), [](const auto& s) { return s.first == "SPILLWAY_FRAMEWORK_ALLOCATOR"; })) {
      std::string err = spillway::set_option(config, "SPILLWAY_FRAMEWORK_ALLOCATOR", v, spillway::policy_names());
      if (!err.empty()) fail(2, err);
    }
  }
  if (config.framework_per_tensor) {
    setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 0);
    setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", 0);
    setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false", 0);
  }
  const char* previous = std::getenv("LD_PRELOAD");
  std::string preload = shim;
  if (previous != nullptr && *previous != '\0') preload += ":" + std::string(previous);
  setenv("LD_PRELOAD", preload.c_str(), 1);

  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  int err = errno;
  fail(err == ENOENT ? 127 : 126, fmt::format("cannot run '{}': {}", command[0], std::strerror(err)));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Spillway: run an unmodified CUDA program with its device memory made managed, so it can "
               "overflow into host RAM instead of failing with out-of-memory."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "spillway " SPILLWAY_VERSION);

  CLI::App* run_cmd = app.add_subcommand("run", "Run CMD with libspillway.so preloaded (LD_PRELOAD) and the given settings.");
  std::string budget, max_managed, policy, report, log_level, exclude, trace, trace_window, framework_allocator, suballocator,
      fault_feedback, state_memory;
  bool disable = false;
  run_cmd->add_option("--budget", budget, "GPU bytes to plan for (SPILLWAY_BUDGET), e.g. 4GiB or 60%");
  run_cmd->add_option("--max-managed", max_managed, "cap on total managed bytes (SPILLWAY_MAX_MANAGED), e.g. 24GiB or 80%");
  run_cmd->add_option("--policy", policy, fmt::format("policy (SPILLWAY_POLICY): {}", fmt::join(spillway::policy_names(), ", ")));
  run_cmd->add_option("--report", report, "write statistics as JSON to FILE at exit (SPILLWAY_REPORT)");
  run_cmd->add_option("--trace", trace, "record a trace (format v1) of what the Engine sees to FILE (SPILLWAY_TRACE; .gz: gzip, .zst: zstd); replay it with `spillway replay`");
  run_cmd->add_option("--trace-window", trace_window,
                      "record only part of the run (SPILLWAY_TRACE_WINDOW): last:N (the last N launches, written at exit) or "
                      "W+N (N launches after the first W, then the file is closed)");
  run_cmd->add_option("--state-memory", state_memory,
                      "host memory Spillway's own state may take (SPILLWAY_STATE_MEMORY), e.g. 256MiB");
  run_cmd->add_option("--log", log_level, "error, warn, info or debug (SPILLWAY_LOG); info prints the report at exit");
  run_cmd->add_option("--exclude", exclude, "libraries whose allocations stay device memory (SPILLWAY_EXCLUDE), e.g. libnccl,libfoo");
  run_cmd->add_option("--framework-allocator", framework_allocator,
                      "per-tensor (default: sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, XLA_PYTHON_CLIENT_ALLOCATOR=platform, "
                      "XLA_PYTHON_CLIENT_PREALLOCATE=false unless set) or keep (the frameworks keep their caches) "
                      "(SPILLWAY_FRAMEWORK_ALLOCATOR)");
  run_cmd->add_option("--suballocator", suballocator, "on or off (SPILLWAY_SUBALLOCATOR): carve allocations from managed ranges");
  run_cmd->add_option("--fault-feedback", fault_feedback,
                      "on or off (SPILLWAY_FAULT_FEEDBACK): give `learned` the driver's GPU page faults through CUPTI");
  run_cmd->add_flag("--disable", disable, "load the shim but pass every call through (SPILLWAY_DISABLE=1)");
  std::vector<std::string> command;
  run_cmd->add_option("command", command, "the program and its arguments, after --")->required();
  run_cmd->footer(options_help() +
                  "\nSizes: 123, 4KiB, 512MiB, 8GiB, 1.5TB (KiB/MiB/GiB = 1024-based, KB/MB/GB = 1000-based).\n"
                  "The exit status is CMD's; 2 means a bad option, 126/127 that CMD could not be run.");
  run_cmd->prefix_command(false);

  spillway::cli::SimCommands sim_commands(app);  // `sweep` and `replay` (issue 3)

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (sim_commands.parsed()) return sim_commands.run();
  if (run_cmd->parsed()) {
    std::vector<std::pair<std::string, std::string>> settings;
    auto add = [&settings](const char* variable, const std::string& value) {
      if (!value.empty()) settings.emplace_back(variable, value);
    };
    add("SPILLWAY_BUDGET", budget);
    add("SPILLWAY_MAX_MANAGED", max_managed);
    add("SPILLWAY_POLICY", policy);
    add("SPILLWAY_REPORT", report.empty() ? std::string() : fs::absolute(report).string());
    add("SPILLWAY_TRACE", trace.empty() ? std::string() : fs::absolute(trace).string());
    add("SPILLWAY_TRACE_WINDOW", trace_window);
    add("SPILLWAY_STATE_MEMORY", state_memory);
    add("SPILLWAY_LOG", log_level);
    add("SPILLWAY_EXCLUDE", exclude);
    add("SPILLWAY_FRAMEWORK_ALLOCATOR", framework_allocator);
    add("SPILLWAY_SUBALLOCATOR", suballocator);
    add("SPILLWAY_FAULT_FEEDBACK", fault_feedback);
    if (disable) settings.emplace_back("SPILLWAY_DISABLE", "1");
    return run(settings, command);
  }
  return 0;
}
