// Policies by spec (prefetch/policy_registry.h): tunables as data, checked once, and the same
// decision code whatever spells the defaults.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "learned.h"
#include "policy_registry.h"
#include "spillway/sim/simulator.h"
#include "trace_builder.h"

namespace spillway::sim {
namespace {

using testing::kMs;
using testing::slow_link;

std::string error_of(std::string_view text, bool simulator = true) {
  std::string error;
  EXPECT_FALSE(parse_policy_spec(text, simulator, &error).has_value()) << text;
  return error;
}

PolicySpec spec_of(std::string_view text, bool simulator = true) {
  std::string error;
  std::optional<PolicySpec> spec = parse_policy_spec(text, simulator, &error);
  EXPECT_TRUE(spec.has_value()) << text << ": " << error;
  return spec.value_or(PolicySpec{});
}

double default_of(std::string_view policy, std::string_view key) {
  for (const Tunable& t : policy_tunables(policy))
    if (t.name == key) return t.default_value;
  ADD_FAILURE() << policy << " has no tunable " << key;
  return -1;
}

TEST(PolicyRegistry, NamesAloneKeepEveryDefault) {
  for (std::string_view name : sim_policy_names()) {
    PolicySpec s = spec_of(name);
    EXPECT_EQ(s.name, name);
    EXPECT_TRUE(s.values.empty());
    EXPECT_EQ(s.text(), name);
  }
  EXPECT_EQ(spec_of("demand").full_text(), "demand");
  EXPECT_EQ(spec_of("correlation").full_text(), "correlation:degree=16");
}

TEST(PolicyRegistry, LearnedDefaultsAreLearnedParamsOwn) {
  const LearnedParams p;
  EXPECT_EQ(policy_tunables("learned").size(), 16u);
  EXPECT_EQ(default_of("learned", "context"), p.context);
  EXPECT_EQ(default_of("learned", "link_bytes_per_s"), p.link_bytes_per_s);
  EXPECT_EQ(default_of("learned", "early_write_back"), p.early_write_back ? 1 : 0);
  EXPECT_EQ(default_of("learned", "slack_ns"), static_cast<double>(p.slack_ns));
  EXPECT_EQ(default_of("learned", "retry"), p.retry);
  EXPECT_EQ(default_of("learned", "max_log"), p.max_log);
  EXPECT_EQ(default_of("learned", "recurring_share"), p.recurring_share);
}

TEST(PolicyRegistry, ValuesAreReadCaseInsensitivelyAndKeptInTableOrder) {
  PolicySpec s = spec_of(" LEARNED : Slack_ns = 1e5 , context=16");
  EXPECT_EQ(s.text(), "learned:context=16,slack_ns=100000");
  EXPECT_EQ(s.value("context"), 16);
  EXPECT_EQ(s.value("min_ahead"), 2) << "a value the spec does not name is its default";
  EXPECT_NE(s.full_text().find("learned:context=16,link_bytes_per_s=25000000000,early_write_back=1,"), std::string::npos)
      << s.full_text();
}

TEST(PolicyRegistry, EveryBadSpecIsOneLineNamingWhatIsWrong) {
  EXPECT_EQ(error_of("magic"), "unknown policy 'magic': expected one of demand, advise, sequential, correlation, learned, oracle");
  EXPECT_EQ(error_of("oracle", false), "unknown policy 'oracle': expected one of demand, advise, sequential, correlation, learned");
  EXPECT_EQ(error_of("correlation:depth=2"), "unknown key 'depth': policy correlation has degree");
  EXPECT_EQ(error_of("demand:x=1"), "unknown key 'x': policy demand has no tunables");
  EXPECT_EQ(error_of("learned:context=0.5"),
            "invalid value '0.5' for learned:context: expected a whole number from 1 to 1024 (launches)");
  EXPECT_EQ(error_of("learned:context=2000"),
            "invalid value '2000' for learned:context: expected a whole number from 1 to 1024 (launches)");
  EXPECT_EQ(error_of("learned:min_precision=nan"),
            "invalid value 'nan' for learned:min_precision: expected 0 to 1 (share)");
  EXPECT_EQ(error_of("learned:early_write_back=yes"), "invalid value 'yes' for learned:early_write_back: expected 0 or 1");
  EXPECT_EQ(error_of("learned:context"), "'context' in policy learned: expected KEY=VALUE");
  EXPECT_EQ(error_of("learned:"), "'' in policy learned: expected KEY=VALUE");
  EXPECT_EQ(error_of("learned:context=4,context=5"), "learned:context is given twice");
  EXPECT_EQ(error_of("learned:min_ahead=10,max_ahead=5"), "learned:min_ahead (10) exceeds learned:max_ahead (5)");
  for (const char* bad : {"magic", "learned:context=0", "learned:x=1", "learned:context=1e999"}) {
    EXPECT_EQ(error_of(bad).find('\n'), std::string::npos) << bad;
    EXPECT_EQ(make_policy(bad), nullptr) << bad;
  }
}

TEST(PolicyRegistry, ListsSplitBetweenSpecsNotInsideThem) {
  EXPECT_EQ(split_policy_list("learned:context=4,slack_ns=0,demand,learned:context=8"),
            (std::vector<std::string>{"learned:context=4,slack_ns=0", "demand", "learned:context=8"}));
  EXPECT_EQ(split_policy_list("demand,advise"), (std::vector<std::string>{"demand", "advise"}));
  EXPECT_EQ(split_policy_list("x=1,demand"), (std::vector<std::string>{"x=1", "demand"})) << "nothing to continue: kept, then refused";
}

// The defaults spelled out make the very same policy; a value that matters changes the run.
TEST(PolicyRegistry, SpelledDefaultsRunIdenticallyAndValuesTakeEffect) {
  const CompiledTrace t = testing::training_loop(4, 12, 6 * kChunkBytes, 2 * kChunkBytes);
  const SimParams p = slow_link(40);
  const CellResult plain = run_cell(t, "learned", p);
  const CellResult spelled = run_cell(t, spec_of("learned").full_text(), p);
  EXPECT_EQ(spelled.sim.time_ns, plain.sim.time_ns);
  EXPECT_EQ(spelled.sim.h2d_bytes, plain.sim.h2d_bytes);
  EXPECT_EQ(spelled.sim.d2h_bytes, plain.sim.d2h_bytes);
  EXPECT_EQ(spelled.policy, spec_of("learned").full_text()) << "the cell is named as given";
  EXPECT_EQ(plain.policy_params, spec_of("learned").full_text());

  const CellResult short_look = run_cell(t, "learned:min_ahead=0,max_ahead=1,slack_ns=0", p);
  EXPECT_EQ(short_look.policy, "learned:slack_ns=0,min_ahead=0,max_ahead=1");
  EXPECT_GT(short_look.sim.time_ns, plain.sim.time_ns) << "a one-launch lookahead cannot hide the link";

  const CellResult seq1 = run_cell(t, "sequential:depth=1", p);
  const CellResult seq8 = run_cell(t, "sequential:depth=8", p);
  EXPECT_NE(seq1.sim.time_ns, seq8.sim.time_ns);
  EXPECT_THROW(run_cell(t, "learned:nope=1", p), std::invalid_argument);
}

}  // namespace
}  // namespace spillway::sim
