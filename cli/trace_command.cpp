#include "trace_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "helper_scripts.h"

namespace spillway::cli {

int trace_command(const std::vector<std::string>& args) {
  constexpr const char* kUsage = "spillway trace torch MODEL OUT.jsonl.gz [options] (spillway trace torch --help)";
  if (args.empty()) {
    std::cerr << "spillway trace: which framework? " << kUsage << '\n';
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::cout << "Usage: " << kUsage << "\n  MODEL: a built-in model or MODULE:FACTORY, a function returning your "
                 "torch.nn.Module (docs/trace-format.md, \"Tracing your own model\")\n";
    return 0;
  }
  if (args[0] != "torch") {
    std::cerr << "spillway trace: unknown framework '" << args[0] << "' (accepted: torch): " << kUsage << '\n';
    return 2;
  }
  const std::string script = find_helper_script("trace_torch.py", "SPILLWAY_TRACE_SCRIPT");
  if (script.empty()) {
    std::cerr << "spillway trace: cannot find scripts/trace_torch.py (set SPILLWAY_TRACE_SCRIPT)\n";
    return 1;
  }
  const std::string python = helper_python();
  setenv("SPILLWAY_TRACE_PROG", "spillway trace torch", 1);  // (its usage and messages name this command)
  std::vector<std::string> words{python, script};
  words.insert(words.end(), args.begin() + 1, args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  const int err = errno;
  std::cerr << "spillway trace: cannot run " << python << ": " << std::strerror(err)
            << " (SPILLWAY_PYTHON names the interpreter that has PyTorch)\n";
  return 1;
}

}  // namespace spillway::cli
