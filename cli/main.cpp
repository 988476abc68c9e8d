// spillway: the command-line front end.
//   spillway run [options] -- CMD [ARGS...]   run CMD with libspillway.so preloaded
//   spillway info [options] [--json] [--links] what Spillway would do on this machine
//   spillway policies [--json] [NAME...]      the policies and their tunables
//   spillway trace torch MODEL OUT [options]  record a trace of a PyTorch model (trace_torch.py)
#include <algorithm>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "spillway/config.h"
#include "spillway/output_file.h"
#include "spillway/policy.h"
#include "info_command.h"
#include "trace_command.h"
#include "parse_errors.h"
#include "policies_command.h"
#include "policy_plugin_loader.h"
#include "sim_commands.h"
#include "policy_registry.h"

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

// The regular files an earlier run wrote under the output pattern `pattern`
// (spillway/output_file.h): the name itself; where the last component holds %r (and no
// %p), every file of its folder that the pattern names for some rank (a decimal number), so
// a rank's file replaces the same rank's from before. Names with %p are one per process and
// are kept, as is a pattern with '%' in its folders. Errors reading the folder are ignored.
void remove_earlier_outputs(const std::string& pattern) {
  std::error_code ec;
  const fs::path path(pattern);
  const std::string folder = path.parent_path().string();
  const std::string name = path.filename().string();
  if (folder.find('%') != std::string::npos || name.find("%p") != std::string::npos) return;
  if (name.find("%r") == std::string::npos) {
    const std::string file = spillway::expand_output_pattern(pattern, 0, "0");  // (only %% is left)
    if (fs::symlink_status(file, ec).type() == fs::file_type::regular) fs::remove(file, ec);
    return;
  }
  fs::directory_iterator it(folder.empty() ? "." : folder, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it->symlink_status(type_ec).type() == fs::file_type::regular &&
        spillway::matches_output_name(name, it->path().filename().string())) {
      fs::remove(it->path(), type_ec);
    }
  }
}

// The setting options `run` and `info` share: each sets one SPILLWAY_* variable.
class SettingOptions {
 public:
  explicit SettingOptions(CLI::App* cmd) {
    for (const Flag& f : flags()) cmd->add_option(f.name, values_[f.variable], f.help);
    cmd->add_flag("--disable", disable_, "load the shim but pass every call through (SPILLWAY_DISABLE=1)");
  }

  // (variable, value) for each option given, in the table's order; paths made absolute.
  std::vector<std::pair<std::string, std::string>> settings() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Flag& f : flags()) {
      const std::string& v = values_.at(f.variable);
      if (!v.empty()) out.emplace_back(f.variable, f.path ? fs::absolute(v).string() : v);
    }
    if (disable_) out.emplace_back("SPILLWAY_DISABLE", "1");
    return out;
  }

 private:
  struct Flag {
    const char* name;
    const char* variable;
    std::string help;
    bool path = false;
  };
  static const std::vector<Flag>& flags() {
    static const std::vector<Flag> f{
        {"--budget", "SPILLWAY_BUDGET", "GPU bytes to plan for (SPILLWAY_BUDGET), e.g. 4GiB or 60%"},
        {"--max-managed", "SPILLWAY_MAX_MANAGED", "cap on total managed bytes (SPILLWAY_MAX_MANAGED), e.g. 24GiB or 80%"},
        {"--policy", "SPILLWAY_POLICY",
         fmt::format("policy (SPILLWAY_POLICY): {} (default learned), optionally NAME:KEY=VALUE[,...] "
                     "(spillway policies lists the tunables)", fmt::join(spillway::policy_names(), ", "))},
        {"--report", "SPILLWAY_REPORT",
         "write statistics as JSON to FILE at exit (SPILLWAY_REPORT; %p = process id, %r = rank)", true},
        {"--trace", "SPILLWAY_TRACE",
         "record a trace (format v1) of what the Engine sees to FILE (SPILLWAY_TRACE; .gz: gzip, .zst: zstd; %p, %r as "
         "for --report); replay it with `spillway replay`",
         true},
        {"--trace-window", "SPILLWAY_TRACE_WINDOW",
         "record only part of the run (SPILLWAY_TRACE_WINDOW): last:N (the last N launches, written at exit) or "
         "W+N (N launches after the first W, then the file is closed)"},
        {"--state-memory", "SPILLWAY_STATE_MEMORY", "host memory Spillway's own state may take (SPILLWAY_STATE_MEMORY), e.g. 256MiB"},
        {"--log", "SPILLWAY_LOG", "error, warn, info or debug (SPILLWAY_LOG); info prints the report at exit"},
        {"--summary", "SPILLWAY_SUMMARY", "on or off: one line at exit with the time, bytes moved and faults (SPILLWAY_SUMMARY, default on)"},
        {"--exclude", "SPILLWAY_EXCLUDE", "libraries whose allocations stay device memory (SPILLWAY_EXCLUDE), e.g. libnccl,libfoo"},
        {"--framework-allocator", "SPILLWAY_FRAMEWORK_ALLOCATOR",
         "per-tensor (default: sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, XLA_PYTHON_CLIENT_ALLOCATOR=platform, "
         "XLA_PYTHON_CLIENT_PREALLOCATE=false unless set) or keep (the frameworks keep their caches) "
         "(SPILLWAY_FRAMEWORK_ALLOCATOR)"},
        {"--suballocator", "SPILLWAY_SUBALLOCATOR", "on or off (SPILLWAY_SUBALLOCATOR): carve allocations from managed ranges"},
        {"--fault-feedback", "SPILLWAY_FAULT_FEEDBACK",
         "on or off (SPILLWAY_FAULT_FEEDBACK): give `learned` the driver's GPU page faults through CUPTI"},
    };
    return f;
  }

  std::map<std::string, std::string> values_;
  bool disable_ = false;
};

// A policy plugin's path made absolute (the program may change its folder before it first
// calls CUDA, when the shim loads the plugin); any other spec as it is.
std::string absolute_policy(const std::string& spec) {
  if (!spillway::is_plugin_spec(spec)) return spec;
  auto [path, params] = spillway::split_plugin_spec(spec);
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) return spec;
  return absolute.string() + (params.empty() ? "" : ":" + params);
}

int run(const std::vector<std::pair<std::string, std::string>>& settings, const std::vector<std::string>& command) {
  spillway::Config config;
  for (const auto& [variable, value] : settings) {
    std::string err = spillway::set_option(config, variable, value, spillway::policy_names());
    if (!err.empty()) fail(2, err);
  }
  if (std::string err; !spillway::parse_policy_spec(config.policy, false, &err)) {
    fail(2, fmt::format("invalid value '{}' for SPILLWAY_POLICY: {}", config.policy, err));
  }
  if (command.empty()) fail(2, "no command given: spillway run [options] -- CMD [ARGS...]");
  std::string shim = find_shim();
  if (shim.empty()) fail(2, "cannot find libspillway.so next to this program (looked in ../lib)");

  for (const auto& [variable, given] : settings) {
    const std::string value = variable == "SPILLWAY_POLICY" ? absolute_policy(given) : given;
    setenv(variable.c_str(), value.c_str(), 1);
    // The run's trace and report replace those of an earlier run. Each process of the run
    // creates its file exclusively (spillway/output_file.h): the first takes the name given.
    // (Regular files only: a FIFO, a device or a symbolic link is the user's to keep.)
    if (variable == "SPILLWAY_TRACE" || variable == "SPILLWAY_REPORT") remove_earlier_outputs(value);
  }
  // The frameworks' per-tensor modes (docs/configuration.md), each unless the
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
  // Into a file or a pipe, standard output is kept in one 1 MiB buffer (the default is a
  // few KiB), so that a failure to write it is met at the final flush, with its errno.
  static char stdout_buffer[1 << 20];
  if (!isatty(STDOUT_FILENO)) std::setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
  // (Named, so that usage lines say `spillway`, not the path it was started by.)
  CLI::App app{"Spillway: run an unmodified CUDA program with its device memory made managed, so it can "
               "overflow into host RAM instead of failing with out-of-memory.",
               "spillway"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "spillway " SPILLWAY_VERSION);

  CLI::App* run_cmd = app.add_subcommand("run", "Run CMD with libspillway.so preloaded (LD_PRELOAD) and the given settings.");
  SettingOptions run_settings(run_cmd);
  std::vector<std::string> command;
  run_cmd->add_option("command", command, "the program and its arguments, after --")->required();
  run_cmd->footer(options_help() +
                  "\nSizes: 123, 4KiB, 512MiB, 8GiB, 1.5TB (KiB/MiB/GiB = 1024-based, KB/MB/GB = 1000-based).\n"
                  "The exit status is CMD's; 2 means a bad option, 126/127 that CMD could not be run.");
  run_cmd->prefix_command(false);

  CLI::App* info_cmd = app.add_subcommand(
      "info", "What Spillway would do here: driver and CUDA versions, each device, CUPTI, the budget and host cap, "
              "and every setting with where it came from (the same options as run).");
  SettingOptions info_settings(info_cmd);
  bool info_json = false;
  info_cmd->add_flag("--json", info_json, "print one JSON object instead of the table");
  bool info_links = false;
  info_cmd->add_flag("--links", info_links, "also print the simulator's link profiles, each figure with its source");

  spillway::cli::SimCommands sim_commands(app);  // `sweep` and `replay`

  CLI::App* policies_cmd = app.add_subcommand(
      "policies", "List the policies and their tunables (NAME:KEY=VALUE in --policy and SPILLWAY_POLICY).");
  std::vector<std::string> policy_filter;
  bool policies_json = false;
  policies_cmd->add_option("names", policy_filter, "only these policies");
  policies_cmd->add_flag("--json", policies_json, "print one JSON object instead of the table");

  CLI::App* trace_cmd = app.add_subcommand(
      "trace", "Record a trace of a PyTorch model on the meta device (no GPU): spillway trace torch MODEL OUT.jsonl.gz "
               "[options], MODEL a built-in model or MODULE:FACTORY (a function returning your torch.nn.Module); "
               "spillway trace torch --help lists the options");
  trace_cmd->prefix_command();  // (every word after `trace` goes to scripts/trace_torch.py)
  trace_cmd->set_help_flag();

  int status = 0;
  try {
    app.parse(argc, argv);
    if (sim_commands.parsed()) status = sim_commands.run();
    else if (run_cmd->parsed()) status = run(run_settings.settings(), command);
    else if (policies_cmd->parsed()) status = spillway::cli::policies_command(policy_filter, policies_json);
    else if (info_cmd->parsed()) status = spillway::cli::info_command(info_settings.settings(), find_shim(), info_json, info_links);
    else if (trace_cmd->parsed()) status = spillway::cli::trace_command(trace_cmd->remaining());
  } catch (const CLI::ParseError& e) {
    if (std::string why = spillway::cli::explain_parse_error(app, e, std::vector<std::string>(argv + 1, argv + argc));
        !why.empty()) {
      std::cerr << why << '\n';
      status = 2;
    } else {
      status = app.exit(e) == 0 ? 0 : 2;  // (--help and --version print and end here)
    }
  }
  // What went to standard output (a table, JSON, --help) must have been written too:
  // `spillway sweep ... > /dev/full` is an error, not status 0.
  if (std::string err = spillway::flush_standard_output(); !err.empty()) {
    std::cerr << "spillway: " << err << '\n';
    return status == 0 ? 1 : status;
  }
  return status;
}
