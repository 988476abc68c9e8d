// `spillway info`: what Spillway would do on this machine, without running a
// program: the driver and CUDA versions, each device, CUPTI, the budget and host cap the
// shim would use, and every setting with where it came from.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace spillway::cli {

// Prints the report on stdout (one screen of text, or one JSON object when `json`). The
// simulator's link profiles (spillway sweep/replay --link) are one line of the text, every
// figure with its source after it when `links`, and always whole in the JSON ("links").
// `options` are the settings given as `spillway info` options (variable, value), which take
// precedence over the SPILLWAY_* variables of the environment, as under `spillway run`.
// `shim` is the path of libspillway.so that `spillway run` would preload ("" if not found).
// Opens libcuda.so.1 (dlopen, no shim) and retains each device's primary context to read
// its free memory. Returns the exit status: 0 (also when no driver or no GPU is found: the
// report says so), 2 for a bad setting (one line on stderr naming the variable).
int info_command(const std::vector<std::pair<std::string, std::string>>& options, const std::string& shim, bool json,
                 bool links);

}  // namespace spillway::cli
