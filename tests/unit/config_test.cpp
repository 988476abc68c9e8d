// The configuration table (uvm/include/spillway/config.def, config.cpp): every SPILLWAY_*
// variable with a good and a bad value, the one-line error, and the defaults.
#include "spillway/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "spillway/output_file.h"
#include "spillway/policy.h"
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
  out += " log=" + std::to_string(static_cast<int>(c.log_level));
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
}

}  // namespace
}  // namespace spillway

namespace spillway {
namespace {
// SPILLWAY_TRACE_WINDOW's forms (issue 17 item 2), and what each refuses.
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
