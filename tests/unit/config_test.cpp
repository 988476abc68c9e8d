// The configuration table (uvm/include/spillway/config.def, config.cpp): every SPILLWAY_*
// variable with a good and a bad value, the one-line error, and the defaults.
#include "spillway/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "spillway/output_file.h"
#include "spillway/policy.h"
#include "spillway/report.h"
#include "policy_registry.h"

namespace spillway {
namespace {

struct Sample {
  const char* good;
  const char* bad;
};

// One good and one bad value per variable. A row added to config.def without a sample here
// fails EveryVariableHasSamples.
const std::map<std::string, Sample>& samples() {
  static const std::map<std::string, Sample> s{
      {"SPILLWAY_POLICY", {"advise", "magic"}},
      {"SPILLWAY_BUDGET", {"24GiB", "lots"}},
      {"SPILLWAY_MAX_MANAGED", {"32GiB", "101%"}},
      {"SPILLWAY_EXCLUDE", {"libnccl,libfoo", "libnccl,,libfoo"}},
      {"SPILLWAY_REPORT_MEMORY", {"virtual", "both"}},
      {"SPILLWAY_LOG", {"debug", "loud"}},
      {"SPILLWAY_SUMMARY", {"off", "quiet"}},
      {"SPILLWAY_REPORT", {"/tmp/spillway-report.%r.%p.json", "/tmp/report-%d.json"}},
      {"SPILLWAY_TRACE", {"/tmp/spillway-trace.jsonl.gz", "/tmp/trace-100%"}},
      {"SPILLWAY_DISABLE", {"1", "maybe"}},
      {"SPILLWAY_SUBALLOCATOR", {"off", "sometimes"}},
      {"SPILLWAY_FRAMEWORK_ALLOCATOR", {"keep", "pytorch"}},
      {"SPILLWAY_FAULT_FEEDBACK", {"off", "cupti"}},
      {"SPILLWAY_STATE_MEMORY", {"1GiB", "8MiB"}},
      {"SPILLWAY_TRACE_WINDOW", {"1000+5000", "last:-3"}},
  };
  return s;
}

// Every field of a Config, as text, to compare whole configurations.
std::string describe(const Config& c) {
  std::string out = "policy=" + c.policy;
  auto size = [](const SizeSetting& s) {
    return s.unset ? std::string("unset") : std::to_string(s.bytes) + "/" + std::to_string(s.percent) + "%";
  };
  out += " budget=" + size(c.budget) + " max_managed=" + size(c.max_managed) + " exclude=";
  for (const auto& e : c.exclude) out += e + ",";
  out += " report_memory=" + std::to_string(static_cast<int>(c.report_memory));
  out += " log=" + std::to_string(static_cast<int>(c.log_level)) + " summary=" + std::to_string(c.summary);
  out += " report=" + c.report_path + " trace=" + c.trace_path + " disable=" + std::to_string(c.disable);
  out += " suballocator=" + std::to_string(c.suballocator) + " framework_per_tensor=" + std::to_string(c.framework_per_tensor) +
         " fault_feedback=" + std::to_string(c.fault_feedback) + " state_memory=" + std::to_string(c.state_memory) +
         " trace_window=" + std::to_string(c.trace_window.warmup) + "+" + std::to_string(c.trace_window.launches) +
         (c.trace_window.last ? "last" : "");
  return out;
}

ConfigResult read_with(std::map<std::string, std::string> env) {
  return read_config(policy_names(), [env = std::move(env)](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// What the message must list as accepted: the table's text, or for the policy every policy
// this build knows.
std::string accepted_for(const OptionInfo& o) {
  if (o.variable != "SPILLWAY_POLICY") return std::string(o.accepted);
  std::string names;
  for (std::string_view n : policy_names()) names += (names.empty() ? "" : ", ") + std::string(n);
  return "one of " + names;
}

TEST(Config, EveryVariableHasSamples) {
  ASSERT_FALSE(option_table().empty());
  for (const OptionInfo& o : option_table()) {
    EXPECT_EQ(samples().count(std::string(o.variable)), 1u) << o.variable << " has no sample values in config_test.cpp";
    EXPECT_EQ(o.variable.substr(0, 9), "SPILLWAY_");
    EXPECT_FALSE(o.accepted.empty()) << o.variable;
    EXPECT_FALSE(o.meaning.empty()) << o.variable;
  }
  EXPECT_EQ(samples().size(), option_table().size());
}

TEST(Config, GoodValueOfEveryVariableIsAccepted) {
  const std::string defaults = describe(Config{});
  for (const OptionInfo& o : option_table()) {
    std::string var(o.variable);
    ConfigResult r = read_with({{var, samples().at(var).good}});
    EXPECT_TRUE(r.errors.empty()) << var << ": " << (r.errors.empty() ? "" : r.errors[0].message);
    EXPECT_NE(describe(r.config), defaults) << var << "=" << samples().at(var).good << " changed nothing";
  }
}

TEST(Config, BadValueOfEveryVariableGivesOneLineNamingVariableValueAndAccepted) {
  const std::string defaults = describe(Config{});
  for (const OptionInfo& o : option_table()) {
    std::string var(o.variable);
    const char* bad = samples().at(var).bad;
    ConfigResult r = read_with({{var, bad}});
    ASSERT_EQ(r.errors.size(), 1u) << var << "=" << bad;
    const ConfigError& e = r.errors[0];
    EXPECT_EQ(e.variable, var);
    EXPECT_EQ(e.value, bad);
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << "one line: " << e.message;
    EXPECT_NE(e.message.find(var), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(std::string("'") + bad + "'"), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(accepted_for(o)), std::string::npos) << e.message;
    EXPECT_EQ(describe(r.config), defaults) << var << ": a bad value must leave the default";
  }
}

// A size that is valid but surely not meant: a bare number under 2 MiB is bytes
// (parse_size), which no plan can use. It is kept (the value is valid) and said once.
TEST(Config, BareSmallSizeIsKeptAndWarnedAbout) {
  ConfigResult r = read_with({{"SPILLWAY_BUDGET", " 4 "}, {"SPILLWAY_MAX_MANAGED", "64"}});
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(r.config.budget.bytes, 4u);
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_EQ(r.warnings[0], "SPILLWAY_BUDGET=4 means 4 bytes (a size without a unit is bytes); did you mean 4GiB or 4MiB?");
  EXPECT_EQ(r.warnings[1].rfind("SPILLWAY_MAX_MANAGED=64 means 64 bytes", 0), 0u) << r.warnings[1];
  for (const char* fine : {"4GiB", "2097152", "60%", "physical", "4MiB"}) {
    EXPECT_EQ(setting_warning("SPILLWAY_BUDGET", fine), "") << fine;
  }
  EXPECT_EQ(setting_warning("SPILLWAY_BUDGET", "2097151").empty(), false);
  EXPECT_EQ(setting_warning("SPILLWAY_STATE_MEMORY", "4"), "") << "only the GPU and host size settings";
  EXPECT_TRUE(read_with({{"SPILLWAY_BUDGET", "24GiB"}}).warnings.empty());
}

TEST(Config, Defaults) {
  ConfigResult r = read_with({});
  EXPECT_TRUE(r.errors.empty());
  const Config& c = r.config;
  EXPECT_EQ(c.policy, "learned");
  EXPECT_TRUE(c.budget.unset);
  EXPECT_FALSE(c.max_managed.unset);
  EXPECT_DOUBLE_EQ(c.max_managed.percent, 80.0);
  EXPECT_EQ(c.max_managed.resolve(1000), 800u);
  EXPECT_EQ(c.exclude, std::vector<std::string>{"libnccl"});
  EXPECT_EQ(c.report_memory, ReportMemory::physical);
  EXPECT_EQ(c.log_level, LogLevel::warn);
  EXPECT_TRUE(c.report_path.empty());
  EXPECT_FALSE(c.disable);
  // The documented defaults in the table say the same.
  std::map<std::string, std::string> text;
  for (const OptionInfo& o : option_table()) text[std::string(o.variable)] = std::string(o.default_text);
  EXPECT_EQ(text["SPILLWAY_POLICY"], c.policy);
  EXPECT_EQ(text["SPILLWAY_EXCLUDE"], "libnccl");
  EXPECT_EQ(text["SPILLWAY_LOG"], "warn");
  EXPECT_EQ(text["SPILLWAY_DISABLE"], "0");
}

TEST(Config, EmptyValueKeepsDefault) {
  ConfigResult r = read_with({{"SPILLWAY_BUDGET", ""}, {"SPILLWAY_POLICY", ""}});
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(describe(r.config), describe(Config{}));
}

TEST(Config, SizesAndPercentages) {
  ConfigResult r = read_with({{"SPILLWAY_BUDGET", "60%"}, {"SPILLWAY_MAX_MANAGED", "4GiB"}});
  ASSERT_TRUE(r.errors.empty());
  EXPECT_EQ(r.config.budget.resolve(1000), 600u);
  EXPECT_EQ(r.config.max_managed.resolve(1), 4ull << 30) << "an absolute size ignores the total";
  r = read_with({{"SPILLWAY_BUDGET", "physical"}});
  ASSERT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.config.budget.unset);
  EXPECT_EQ(r.config.budget.resolve(12345), 12345u);
  r = read_with({{"SPILLWAY_BUDGET", "0"}});
  EXPECT_EQ(r.errors.size(), 1u) << "a zero budget is refused";
}

TEST(Config, ExcludeListAndNone) {
  ConfigResult r = read_with({{"SPILLWAY_EXCLUDE", " libnccl , libfoo "}});
  ASSERT_TRUE(r.errors.empty());
  EXPECT_EQ(r.config.exclude, (std::vector<std::string>{"libnccl", "libfoo"}));
  r = read_with({{"SPILLWAY_EXCLUDE", "none"}});
  ASSERT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.config.exclude.empty());
  r = read_with({{"SPILLWAY_EXCLUDE", "/opt/lib/libx.so"}});
  EXPECT_TRUE(r.errors.empty()) << "an absolute path is a valid entry";
  r = read_with({{"SPILLWAY_EXCLUDE", "lib/x.so"}});
  EXPECT_EQ(r.errors.size(), 1u) << "a relative path is not";
}

TEST(Config, SeveralBadValuesEachReported) {
  ConfigResult r = read_with({{"SPILLWAY_BUDGET", "lots"}, {"SPILLWAY_POLICY", "magic"}, {"SPILLWAY_LOG", "info"}});
  ASSERT_EQ(r.errors.size(), 2u);
  std::set<std::string> vars{r.errors[0].variable, r.errors[1].variable};
  EXPECT_EQ(vars, (std::set<std::string>{"SPILLWAY_BUDGET", "SPILLWAY_POLICY"}));
  EXPECT_EQ(r.config.log_level, LogLevel::info) << "valid settings still apply";
}

TEST(Config, SetOptionUnknownVariable) {
  Config c;
  std::string err = set_option(c, "SPILLWAY_NOPE", "1", policy_names());
  EXPECT_NE(err.find("SPILLWAY_NOPE"), std::string::npos);
  EXPECT_EQ(set_option(c, "SPILLWAY_POLICY", "ADVISE", policy_names()), "") << "names are case-insensitive";
  EXPECT_EQ(c.policy, "advise");
  // A path (a '/' before any ':') names a policy plugin: kept as written, checked where the
  // policy is made (it is loaded there).
  EXPECT_EQ(set_option(c, "SPILLWAY_POLICY", " ./Plugins/libMine.so:Depth=2 ", policy_names()), "");
  EXPECT_EQ(c.policy, "./Plugins/libMine.so:Depth=2");
  EXPECT_EQ(set_option(c, "SPILLWAY_POLICY", "Learned:Path=/x", policy_names()), "");
  EXPECT_EQ(c.policy, "learned:path=/x") << "a '/' after the ':' makes no path: the built-in name, lowered";
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {
// SPILLWAY_TRACE_WINDOW's forms, and what each refuses.
TEST(Config, TraceWindowForms) {
  auto window = [](const char* v) { return read_with({{"SPILLWAY_TRACE_WINDOW", v}}); };
  ConfigResult r = window("last:500");
  ASSERT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.config.trace_window.last);
  EXPECT_EQ(r.config.trace_window.launches, 500u);
  r = window("2000+100");
  ASSERT_TRUE(r.errors.empty());
  EXPECT_FALSE(r.config.trace_window.last);
  EXPECT_EQ(r.config.trace_window.warmup, 2000u);
  EXPECT_EQ(r.config.trace_window.launches, 100u);
  r = window(" ALL ");
  ASSERT_TRUE(r.errors.empty());
  EXPECT_EQ(r.config.trace_window.launches, 0u);
  for (const char* bad : {"last:0", "10+", "+5", "5", "1+0", "last:", "1+2+3", "last:1e3", "99999999999999999999+1"}) {
    r = window(bad);
    ASSERT_EQ(r.errors.size(), 1u) << bad;
    EXPECT_NE(r.errors[0].message.find("SPILLWAY_TRACE_WINDOW"), std::string::npos) << r.errors[0].message;
    EXPECT_EQ(r.config.trace_window.launches, 0u) << bad;
  }
}
TEST(Config, OutputPathPatterns) {
  for (const char* good : {"r.json", "r-%p.json", "%r/%p", "100%%.json", "%%p", "a%r%p%%"}) {
    ConfigResult r = read_with({{"SPILLWAY_REPORT", good}, {"SPILLWAY_TRACE", good}});
    EXPECT_TRUE(r.errors.empty()) << good;
    EXPECT_EQ(r.config.report_path, good);
  }
  for (const char* bad : {"%", "r%", "r-%d.json", "%P", "%%%"}) {
    ConfigResult r = read_with({{"SPILLWAY_TRACE", bad}});
    ASSERT_EQ(r.errors.size(), 1u) << bad;
    EXPECT_NE(r.errors[0].message.find("SPILLWAY_TRACE"), std::string::npos) << r.errors[0].message;
    EXPECT_NE(r.errors[0].message.find("%r = the rank"), std::string::npos) << r.errors[0].message;
  }
  EXPECT_EQ(expand_output_pattern("/o/r%r-%p.json", 4242, "3"), "/o/r3-4242.json");
  EXPECT_EQ(expand_output_pattern("%%p%%r%p", 7, "1"), "%p%r7");
  EXPECT_EQ(expand_output_pattern("plain", 7, "1"), "plain");
}

TEST(Config, RankComesFromTheLaunchersVariables) {
  struct Saved {
    std::string name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"}) {
    const char* now = std::getenv(v);
    saved.push_back({v, now ? std::optional<std::string>(now) : std::nullopt});
  }
  auto set = [](const char* name, const char* value) { value ? ::setenv(name, value, 1) : ::unsetenv(name); };
  for (const Saved& s : saved) set(s.name.c_str(), nullptr);
  EXPECT_EQ(rank_from_environment(), "0");
  set("LOCAL_RANK", "2");
  EXPECT_EQ(rank_from_environment(), "2");
  set("SLURM_PROCID", "5");
  EXPECT_EQ(rank_from_environment(), "5") << "a global rank before the node's";
  set("OMPI_COMM_WORLD_RANK", "9");
  EXPECT_EQ(rank_from_environment(), "9");
  set("OMPI_COMM_WORLD_RANK", nullptr);
  set("SLURM_PROCID", nullptr);
  set("RANK", "17");
  EXPECT_EQ(rank_from_environment(), "17");
  set("RANK", "-1");  // not a rank: LOCAL_RANK is used
  EXPECT_EQ(rank_from_environment(), "2");
  set("LOCAL_RANK", "");
  EXPECT_EQ(rank_from_environment(), "0");
  for (const Saved& s : saved) set(s.name.c_str(), s.value ? s.value->c_str() : nullptr);
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {

// SPILLWAY_STATE_MEMORY and `--state-memory` (sweep, replay, run) share one rule
// (parse_state_memory, reached through set_option): the same values pass and fail both
// ways, 'unlimited' included, with one message listing what is accepted.
TEST(Config, StateMemoryHasOneRuleForTheVariableAndTheOption) {
  const std::vector<std::pair<const char*, std::uint64_t>> good{
      {"16MiB", 16ull << 20}, {"1GiB", 1ull << 30}, {" 256MiB ", 256ull << 20}, {"16777216", 16ull << 20},
      {"unlimited", kUnlimitedStateMemory}, {"UNLIMITED", kUnlimitedStateMemory}, {" Unlimited\t", kUnlimitedStateMemory}};
  for (const auto& [text, bytes] : good) {
    EXPECT_EQ(parse_state_memory(text), std::optional<std::uint64_t>(bytes)) << text;
    ConfigResult r = read_with({{"SPILLWAY_STATE_MEMORY", text}});
    EXPECT_TRUE(r.errors.empty()) << text;
    EXPECT_EQ(r.config.state_memory, bytes) << text;
  }
  for (const char* bad : {"8MiB", "16777215", "0", "-1", "lots", "unlimitedx", "un limited", "inf", "50%", "none"}) {
    EXPECT_EQ(parse_state_memory(bad), std::nullopt) << bad;
    ConfigResult r = read_with({{"SPILLWAY_STATE_MEMORY", bad}});
    ASSERT_EQ(r.errors.size(), 1u) << bad;
    EXPECT_EQ(r.errors[0].message, std::string("invalid value '") + bad +
                                       "' for SPILLWAY_STATE_MEMORY: expected a size such as 256MiB or 1GiB (at least "
                                       "16MiB), or 'unlimited' (no bound)");
    Config c;
    EXPECT_EQ(set_option(c, "SPILLWAY_STATE_MEMORY", bad, policy_names()), r.errors[0].message) << "the option's message";
  }
  EXPECT_EQ(kMinStateMemoryBytes, 16ull << 20);
}

// The matcher `spillway run` removes an earlier run's per-rank files with (it replaced a
// std::regex built from the user's file name): the same answers as that regex on ordinary
// names, and linear time on hostile ones.
std::regex old_rank_regex(const std::string& name) {
  std::string expression;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '%' && i + 1 < name.size() && name[i + 1] == 'r') {
      expression += "[0-9]+";
      ++i;
      continue;
    }
    if (name[i] == '%' && i + 1 < name.size() && name[i + 1] == '%') ++i;
    if (std::string_view(".^$|()[]{}*+?\\").find(name[i]) != std::string_view::npos) expression += '\\';
    expression += name[i];
  }
  return std::regex(expression);
}

TEST(OutputName, MatcherAgreesWithTheRegexItReplaced) {
  const std::vector<std::string> patterns{"r%r.json", "trace.%r.jsonl.gz", "%r", "%r%r", "a%r1%r", "1%r1", "r%%%r",
                                          "100%%-%r", "x(%r)[y]*+?.\\^$|{}", "%", "a%", "%%r%r", "%r.%r.%r", "%p%r"};
  const std::vector<std::string> names{"", "r0.json", "r12.json", "r.json", "rx.json", "r12.jsonx", "trace.3.jsonl.gz",
                                       "trace..jsonl.gz", "7", "77", "a1", "a11", "a121", "a1211", "1x1", "101",
                                       "r%5", "r%", "100%-0", "100%%-0", "x(9)[y]*+?.\\^$|{}", "x(9)[y]]*+?.\\^$|{}",
                                       "%", "a%", "%r1", "%r", "1.2.3", "1..3", "%p4", "%p"};
  for (const std::string& p : patterns) {
    const std::regex re = old_rank_regex(p);
    for (const std::string& n : names) {
      EXPECT_EQ(matches_output_name(p, n), std::regex_match(n, re)) << "pattern '" << p << "', name '" << n << "'";
    }
  }
}

TEST(OutputName, MatcherIsLinearOnHostileNames) {
  std::string many_ranks;
  for (int i = 0; i < 100000; ++i) many_ranks += "%r";
  const std::string digits(255, '7');
  const std::vector<std::pair<std::string, std::string>> hostile{
      {many_ranks + "x", digits},                                        // backtracking's worst case
      {std::string(127, '%').append("r").append(120, '%').append("%r"), digits},
      {std::string(100000, '('), std::string(255, '(')},
      {std::string(50000, '[') + "%r" + std::string(50000, ']'), "[[[1]]]"},
      {std::string(100000, '*') + std::string(100000, '+'), std::string(255, '*')},
      {std::string(100000, '\\'), std::string(255, '\\')},
      {"(" + std::string(1000, '%').append("r") + "*+)\\1", "(" + digits + "*+)\\1"},
  };
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [pattern, name] : hostile) EXPECT_FALSE(matches_output_name(pattern, name)) << pattern.substr(0, 40);
  std::string digit_runs;
  for (int i = 0; i < 127; ++i) digit_runs += "%r";
  EXPECT_TRUE(matches_output_name(digit_runs, std::string(254, '1')));
  EXPECT_FALSE(matches_output_name(digit_runs + "x", std::string(254, '1')));
  EXPECT_TRUE(matches_output_name("((%%%%%%%r[", "((%%%1["));
  EXPECT_TRUE(matches_output_name(std::string(126, '(') + "%r" + std::string(126, '['), std::string(126, '(') + "42" + std::string(126, '[')));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Every output goes through OutputFile: a full disk is one line naming the file and errno's
// text, whether the failure comes at a write, the flush or the close.
TEST(OutputFile, WritesTheFileAndNamesTheFileAndReasonOnFailure) {
  const auto dir = std::filesystem::temp_directory_path() / ("spillway-output-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "out.csv").string();
  {
    OutputFile out(path);
    out.write("a,b\n");
    out.write(std::string(100000, 'x'));
    out.close();
    out.close();  // (a second close does nothing)
  }
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}).size(), 100004u);
  auto error_of = [](const std::string& p, std::size_t bytes) -> std::string {
    try {
      OutputFile out(p);
      out.write(std::string(bytes, 'x'));
      out.close();
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  const std::string missing = (dir / "no-such-dir" / "t.json").string();
  EXPECT_EQ(error_of(missing, 1), "cannot write " + missing + ": No such file or directory");
  std::filesystem::remove_all(dir);
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  EXPECT_EQ(error_of("/dev/full", 10), "cannot write /dev/full: No space left on device") << "failure at the flush";
  EXPECT_EQ(error_of("/dev/full", 1 << 20), "cannot write /dev/full: No space left on device") << "failure at a write";
  EXPECT_EQ(write_report("/dev/full", Stats{}), "SPILLWAY_REPORT: cannot write /dev/full: No space left on device");
}

}  // namespace
}  // namespace spillway
