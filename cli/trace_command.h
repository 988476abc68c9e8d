// `spillway trace torch MODEL OUT [options]`: records a Spillway trace of a PyTorch model on
// the meta device (no GPU, no data), by scripts/trace_torch.py: MODEL is one of its built-in
// models or MODULE:FACTORY, a function returning the user's torch.nn.Module
// (docs/trace-format.md, "Tracing your own model").
#pragma once

#include <string>
#include <vector>

namespace spillway::cli {

// `args` are the words after `trace`. Runs the script with helper_python() in place of this
// process (its exit status, output and signals are the script's): it prints one line and
// exits 2 for a bad model or option, and says how to install PyTorch where it is missing.
// Returns 0 after printing the usage for --help; else only on failure: 2 for a framework
// other than torch or no arguments, 1 when the script or the interpreter cannot be found or
// run (one line on stderr each).
int trace_command(const std::vector<std::string>& args);

}  // namespace spillway::cli
