// The Python scripts the command runs (scripts/plot_sweep.py for `sweep --plot`,
// scripts/trace_torch.py for `trace`), and the interpreter that runs them.
#pragma once

#include <string>

namespace spillway::cli {

// The path of the script `file` (a name in scripts/): $`env_var` when set, else beside an
// installed command (bin/../share/spillway/FILE: cli/CMakeLists.txt installs it there), else
// in the source tree beside a build tree (build/bin/../../scripts) or the one this program
// was built from. "" when none exists. Reads the file system only.
std::string find_helper_script(const char* file, const char* env_var);

// The interpreter for those scripts: $SPILLWAY_PYTHON when set (the wheel's `spillway` sets
// it to the interpreter it is installed in: python/spillway/__main__.py), else
// /usr/bin/python3 where it exists (Debian's python3-matplotlib and python3-torch serve it;
// a pyenv or venv python3 first on PATH may lack them), else python3 from PATH.
std::string helper_python();

// `s` quoted for /bin/sh (single quotes).
std::string shell_quote(const std::string& s);

}  // namespace spillway::cli
