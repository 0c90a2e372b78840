// Strategy calibration: Jensen-Shannon similarity and PoD's greedy layer grouping on
// synthetic distributions, the JSON file round trip and its checks against the
// model, and pruneserve-calibrate end to end on stories260K.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/pruning/calibration.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Calibration, JsDivergenceInBitsOnSyntheticDistributions) {
  const std::vector<float> a = {0.5f, 0.5f, 0, 0}, b = {0, 0, 0.5f, 0.5f}, c = {0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_DOUBLE_EQ(JsDivergence(a, a), 0.0);
  EXPECT_NEAR(JsDivergence(a, b), 1.0, 1e-12) << "disjoint supports: one bit";
  // a against the uniform c: m = (3/8, 3/8, 1/8, 1/8); 0.5 * KL(a||m) + 0.5 * KL(c||m).
  const double kl_a = std::log2(0.5 / 0.375);
  const double kl_c = 0.5 * std::log2(0.25 / 0.375) + 0.5 * std::log2(0.25 / 0.125);
  EXPECT_NEAR(JsDivergence(a, c), 0.5 * kl_a + 0.5 * kl_c, 1e-9);
  EXPECT_NEAR(JsDivergence(c, a), JsDivergence(a, c), 1e-12) << "symmetric";
  const std::vector<float> scaled = {2, 2, 0, 0};
  EXPECT_DOUBLE_EQ(JsDivergence(a, scaled), 0.0) << "normalised first";
}

TEST(Calibration, GreedyGroupingJoinsOnlyLayersSimilarToTheWholeGroup) {
  // Layers 0-1-2 pairwise similar; 3 similar to 1 and 2 but not to 0: a new group
  // at 3; 4 like 3; 5 alone. A layer joins when 1 - sim < delta for the whole group.
  std::vector<std::vector<double>> sim(6, std::vector<double>(6, 0.1));
  auto set = [&](int a, int b, double v) { sim[a][b] = sim[b][a] = v; };
  for (int l = 0; l < 6; ++l) sim[l][l] = 1;
  set(0, 1, 0.9), set(0, 2, 0.8), set(1, 2, 0.9), set(2, 3, 0.9), set(1, 3, 0.9), set(0, 3, 0.4);
  set(3, 4, 0.7);
  EXPECT_THAT(GreedyLayerGroups(sim, 0.5), ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4), ElementsAre(5)));
  EXPECT_THAT(GreedyLayerGroups(sim, 0.15),
              ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4), ElementsAre(5)));
  EXPECT_EQ(GreedyLayerGroups(sim, 0.0).size(), 6u) << "delta 0: every layer alone, even identical ones";
  std::vector<std::vector<double>> same(3, std::vector<double>(3, 1.0));
  EXPECT_EQ(GreedyLayerGroups(same, 0.0).size(), 3u);
  EXPECT_THAT(GreedyLayerGroups(sim, 1.0), ElementsAre(ElementsAre(0, 1, 2, 3, 4, 5))) << "delta 1: one group";
}

ModelConfig Config(int layers, int kv_heads) {
  ModelConfig c;
  c.n_layers = layers;
  c.n_kv_heads = kv_heads;
  return c;
}

TEST(Calibration, JsonRoundTripAndChecksAgainstTheModel) {
  Calibration c{.model = "m", .n_layers = 3, .n_kv_heads = 2, .samples = 2, .queries = 4, .needle_layer = 1};
  c.similarity = {{{1, 0.9, 0.2}, {0.9, 1, 0.3}, {0.2, 0.3, 1}}, {{1, 0.1, 0.1}, {0.1, 1, 0.8}, {0.1, 0.8, 1}}};
  c.lazyllm_layers = {2};
  c.Regroup(0.5);
  EXPECT_THAT(c.groups[0], ElementsAre(ElementsAre(0, 1), ElementsAre(2)));
  EXPECT_THAT(c.groups[1], ElementsAre(ElementsAre(0), ElementsAre(1, 2)));
  EXPECT_THAT(c.BaseLayers(), ElementsAre(ElementsAre(0, 0, 2), ElementsAre(0, 1, 1)));
  const absl::StatusOr<Calibration> back = CalibrationFromJson(CalibrationToJson(c), Config(3, 2));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->groups, c.groups);
  EXPECT_EQ(back->similarity, c.similarity);
  EXPECT_EQ(back->needle_layer, 1);
  EXPECT_THAT(back->lazyllm_layers, ElementsAre(2));
  EXPECT_DOUBLE_EQ(back->delta, 0.5);

  EXPECT_THAT(std::string(CalibrationFromJson(CalibrationToJson(c), Config(4, 2)).status().message()),
              HasSubstr("calibrated for 3 layers and 2 KV heads"));
  Calibration gap = c;
  gap.groups[1] = {{0}, {2}};
  EXPECT_THAT(std::string(CalibrationFromJson(CalibrationToJson(gap), Config(3, 2)).status().message()),
              HasSubstr("pod.groups[1]"));
  EXPECT_FALSE(CalibrationFromJson("{", Config(3, 2)).ok());
  EXPECT_THAT(std::string(CalibrationFromJson(R"({"n_layers": 3})", Config(3, 2)).status().message()),
              HasSubstr("bad calibration"));
  EXPECT_EQ(LoadCalibration("/nonexistent/x.json", Config(3, 2)).status().code(), absl::StatusCode::kNotFound);
  // Found by fuzz_pod_groups (UBSan): a float beyond int's range converted into n_layers.
  EXPECT_EQ(CalibrationFromJson(R"({"n_layers": 2.50136e20, "n_kv_heads": 2})", Config(3, 2)).status().message(),
            "calibration: the number 2.50136e+20 is out of range");
}

TEST(Calibration, ToolWritesAFileTheModelAccepts) {
  const std::string out = ::testing::TempDir() + "/calibration_" + std::to_string(::getpid()) + ".json";
  const testing::CommandResult run = testing::RunCommand(
      std::string(PS_BINARY_DIR) + "/pruneserve-calibrate --model " + PS_TESTDATA +
      "/stories260K/stories260K.gguf --haystack " + PS_TESTDATA +
      "/haystack/paul_graham_essays --length 300 --samples 2 --queries 4 --threads 2 --out " + out + " 2>/dev/null");
  const std::string& printed = run.output;
  ASSERT_EQ(run.exit_code, 0) << printed;
  EXPECT_THAT(printed, HasSubstr("PoD delta 0.50"));
  EXPECT_THAT(printed, HasSubstr("wrote " + out));
  ModelConfig stories = Config(5, 4);
  const absl::StatusOr<Calibration> c = LoadCalibration(out, stories);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->samples, 2);
  ASSERT_EQ(c->similarity.size(), 4u);
  for (const auto& head : c->similarity) {
    for (int a = 0; a < 5; ++a) {
      EXPECT_DOUBLE_EQ(head[a][a], 1.0);
      for (int b = 0; b < 5; ++b) {
        EXPECT_DOUBLE_EQ(head[a][b], head[b][a]);
        EXPECT_GE(head[a][b], 0.0);
        EXPECT_LE(head[a][b], 1.0);
      }
    }
  }
  Calibration regrouped = *c;
  regrouped.Regroup(c->delta);
  EXPECT_EQ(regrouped.groups, c->groups) << "the groups are the similarities' greedy grouping";
  EXPECT_NE(std::string(printed).find("KV head 3:"), std::string::npos);
  std::remove(out.c_str());
}

}  // namespace
}  // namespace ps
