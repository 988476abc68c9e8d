#include "parse_errors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

namespace spillway::cli {

namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string joined(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : ", ") + w;
  return out;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& accepted) {
  const std::string near = closest(word, accepted);
  return near.empty() ? "" : fmt::format(" (did you mean {}?)", near);
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

std::vector<std::string> option_names(const CLI::App& sub) {
  std::vector<std::string> names;
  for (const CLI::Option* o : sub.get_options()) {
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    for (const std::string& n : o->get_snames()) names.push_back("-" + n);
  }
  return names;
}

// No command was recognised: the first word is the unknown one (commands come first).
std::string explain_command(const CLI::App& app, const std::vector<std::string>& args) {
  const std::vector<std::string> names = command_names(app);
  if (args.empty()) return fmt::format("spillway: a command is required: {} (spillway --help)", joined(names));
  const std::string& word = args.front();
  if (word.starts_with("-")) {
    return fmt::format("spillway: unknown option '{}'; a command comes first: {} (spillway --help)", word, joined(names));
  }
  return fmt::format("spillway: unknown command '{}'{}; the commands are {}", word, did_you_mean(word, names), joined(names));
}

// `spillway run`: what follows the program before `--` is taken for Spillway's options.
std::string explain_run(const CLI::App& run, const CLI::ParseError& e, const std::vector<std::string>& extras,
                        bool has_separator) {
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && extras.empty()) {
    return "spillway run: no program given: spillway run [OPTIONS] -- PROGRAM [ARGS...]";
  }
  if (extras.empty() || !extras.front().starts_with("-")) return "";
  const std::string& option = extras.front();
  const std::string near = did_you_mean(option.substr(0, option.find('=')), option_names(run));
  if (has_separator) return fmt::format("spillway run: unknown option '{}'{}", option, near);
  return fmt::format("spillway run: '{}' is not an option of spillway run{}; a program's own options go after --: "
                     "spillway run [OPTIONS] -- PROGRAM [ARGS...]",
                     option, near);
}

}  // namespace

std::string closest(const std::string& word, const std::vector<std::string>& accepted) {
  const std::size_t limit = std::clamp<std::size_t>(word.size() / 3, 1, 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const std::string& a : accepted) {
    if (const std::size_t d = edit_distance(word, a); d < best_distance) {
      best = a;
      best_distance = d;
    }
  }
  return best;
}

std::string explain_parse_error(const CLI::App& app, const CLI::ParseError& e, const std::vector<std::string>& args) {
  // (An error's get_name() is not its kind: ExtrasError carries the subcommand's name.)
  if (dynamic_cast<const CLI::Success*>(&e) != nullptr) return "";  // --help, --help-all, --version
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  if (parsed.empty()) return explain_command(app, args);
  const CLI::App& sub = *parsed.front();
  // (A subcommand whose options fall through to the top level leaves its extras there.)
  std::vector<std::string> extras = sub.remaining();
  if (extras.empty()) extras = app.remaining();
  if (sub.get_name() == "run") {
    return explain_run(sub, e, extras, std::find(args.begin(), args.end(), "--") != args.end());
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e) == nullptr || extras.empty()) return "";
  const std::string& word = extras.front();
  if (!word.starts_with("-")) return "";
  return fmt::format("spillway {}: unknown option '{}'{}", sub.get_name(), word,
                     did_you_mean(word.substr(0, word.find('=')), option_names(sub)));
}

}  // namespace spillway::cli
