// One-line explanations of the command lines CLI11 refuses, for a user who mistyped: the
// unknown command or option named, with the closest accepted one, and a program's own
// options that `spillway run` met before `--` said as such.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace spillway::cli {

// A malformed command line or input the command refuses: the one line to print after
// "spillway: " (exit status 2). Thrown by the commands, caught where they are run.
struct UsageError {
  std::string message;
};

// The line to print ("spillway ...", without a newline) for `e`, thrown by
// `app.parse(args)`; empty where CLI11's own message is the right one (--help, --version, a
// value a validator refused). `args`: the command line less argv[0]. Thread safety: reads
// `app` only.
std::string explain_parse_error(const CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& args);

// The word of `accepted` nearest to `word` by edit distance (Levenshtein: insertions,
// deletions, substitutions), when that distance is at most a third of the word's length
// (at least 1, at most 3); empty otherwise. Ties: the first in `accepted`.
std::string closest(const std::string& word, const std::vector<std::string>& accepted);

}  // namespace spillway::cli
