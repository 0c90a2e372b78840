// PoD and SlimInfer on stories260K: PoD's layer groups sharing distant scores and the
// keys it frees, SlimInfer's switches below gamma and its KV blocks between the tiers.
#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/pruning/pod.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/sliminfer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/pruning_model_fixture.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// PoD on the test calibration (tests/engine/test_calibration.h): delta 0 leaves every
// layer alone (exactly `full`); at 0.25 head 0 groups layers {0,1,2} {3,4}, heads 1-2
// {0,1} {2,3} {4}, head 3 none. With every token proximal the shared path equals dense
// attention; with a short window the distant scores come from the group's lowest
// layer and the logits move; a decode step skips distant parts where the gate allows.
TEST_F(PruningModelTest, PodGroupsShareDistantScores) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> prompt = Prompt(120);
  int64_t full_rows = 0, rows = 0;
  const std::vector<int32_t> full = Run(prompt, 24, nullptr, &full_rows);
  auto alone = Make("pod", {"delta=0"});
  EXPECT_EQ(Run(prompt, 24, alone.get(), &rows), full);
  EXPECT_EQ(static_cast<Pod*>(alone.get())->KeySaving(), 0.0);

  auto grouped = Make("pod", {"sinks=4", "recent=8"});
  const Pod& pod = *static_cast<Pod*>(grouped.get());
  EXPECT_THAT(pod.base(), ElementsAre(ElementsAre(0, 0, 0, 3, 3), ElementsAre(0, 0, 2, 2, 4),
                                      ElementsAre(0, 0, 2, 2, 4), ElementsAre(0, 1, 2, 3, 4)));
  EXPECT_DOUBLE_EQ(pod.KeySaving(), 7.0 / 20.0);
  const std::vector<float> dense = PromptLogits(prompt, nullptr);
  auto roomy = Make("pod", {"sinks=4", "recent=4096"});
  EXPECT_LT(MaxAbsDiff(PromptLogits(prompt, roomy.get()), dense), 1e-4f) << "every key proximal: the dense result";
  EXPECT_GT(MaxAbsDiff(PromptLogits(prompt, grouped.get()), dense), 1e-3f)
      << "distant keys scored by the group's lowest layer";

  for (float skip : {0.0f, 0.01f}) {
    auto gated = Make("pod", {"sinks=4", "recent=8", absl::StrCat("gate_skip=", skip)});
    Run(prompt, 8, gated.get());
    const int64_t skipped = static_cast<Pod*>(gated.get())->distant_skipped();
    if (skip == 0) {
      EXPECT_EQ(skipped, 0);
    } else {
      EXPECT_GT(skipped, 0) << "decode steps skip distant parts whose gate is at least " << skip;
    }
  }
  (void)c;
}

// PoD as it was before keys were dropped: the same plan, every key kept.
class PodKeepingKeys final : public PruningStrategy {
 public:
  explicit PodKeepingKeys(std::unique_ptr<PruningStrategy> pod) : pod_(std::move(pod)) {}
  std::string_view name() const override { return "pod_keeping_keys"; }
  absl::Status BeginStep(StepRows* rows, SeqContext& ctx) override { return pod_->BeginStep(rows, ctx); }
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    pod_->SelectKv(layer, att, ctx, selection);
  }
  const SharedScores* ShareScores(int layer) override {
    const SharedScores* share = pod_->ShareScores(layer);
    if (share == nullptr) return nullptr;
    plan_ = *share;
    plan_.drop_distant_keys = false;
    return &plan_;
  }

 private:
  std::unique_ptr<PruningStrategy> pod_;
  SharedScores plan_;
};

// Above a group's base layer a head's keys distant to every query to come are freed:
// with sinks 4 and recent 8 (pages of 16), after a 120-token prompt pages 1-6 of each
// of the 7 (layer, head) pairs that share. The logits stay those of keeping every
// key: over the prompt, fed in chunks of 48 (a later chunk's queries skip the keys
// dropped after the earlier ones), and over the decode steps after (which drop page 7
// once position 134 is cached).
TEST_F(PruningModelTest, PodFreesTheKeysNoQueryReadsAgain) {
  const ModelConfig& c = model_->config();
  auto dropping = Make("pod", {"sinks=4", "recent=8"});
  PodKeepingKeys keeping(Make("pod", {"sinks=4", "recent=8"}));
  const int64_t per_page = 2 * c.n_kv_heads;
  Transformer ta(*model_, backend_), tb(*model_, backend_);
  std::unique_ptr<KvCache> kv_a = testing::KvFor(*model_, backend_, 256), kv_b = testing::KvFor(*model_, backend_, 256);
  const std::vector<int32_t> prompt = Prompt(120);
  std::vector<int32_t> tokens, positions;
  for (int step = 0; step < 22; ++step) {
    if (step < 3) {  // the prompt's chunks
      const int begin = 48 * step, end = std::min(120, begin + 48);
      tokens.assign(prompt.begin() + begin, prompt.begin() + end);
      positions.resize(end - begin);
      std::iota(positions.begin(), positions.end(), begin);
    }
    ForwardOutput out_a, out_b;
    SeqInput in_a{
        .seq_id = 1, .tokens = tokens, .positions = positions, .all_logits = true, .strategy = dropping.get()};
    SeqInput in_b{.seq_id = 1, .tokens = tokens, .positions = positions, .all_logits = true, .strategy = &keeping};
    ASSERT_TRUE(ta.Forward(std::span<const SeqInput>(&in_a, 1), *kv_a, &out_a).ok() && out_a.status[0].ok());
    ASSERT_TRUE(tb.Forward(std::span<const SeqInput>(&in_b, 1), *kv_b, &out_b).ok() && out_b.status[0].ok());
    ASSERT_EQ(out_a.logits, out_b.logits) << "step " << step;
    const int32_t context = out_a.next_position[0];
    const int64_t pages = (context + 15) / 16;
    EXPECT_EQ(kv_b->manager().BlocksIn(1, Tier::kDevice), c.n_layers * pages * per_page);
    // Full pages whose last position is at most context - 8 are dropped, from page 1.
    const int64_t dropped = std::max<int64_t>(0, std::min<int64_t>((context - 8 + 1) / 16, pages - 1) - 1);
    EXPECT_EQ(kv_a->manager().BlocksIn(1, Tier::kDevice), c.n_layers * pages * per_page - 7 * dropped)
        << "step " << step << ", " << context << " tokens cached";
    EXPECT_TRUE(kv_a->manager().VerifyIntegrity().ok()) << kv_a->manager().VerifyIntegrity();
    if (step >= 2) {
      tokens.assign(1, 300 + step);
      positions.assign(1, context);
    }
  }
  kv_a->Free(1);
  EXPECT_EQ(kv_a->manager().UsedBlocks(Tier::kDevice), 0);
}

// SlimInfer with scripted block scores: `prefer` lists the blocks each step ranks
// first (in that order), the others follow by index.
class ScriptedSlimInfer : public SlimInfer {
 public:
  using SlimInfer::SlimInfer;
  std::vector<std::vector<int32_t>> prefer;
  int step = 0;
  int64_t attended_inactive = 0;  // rows attended at a slim stage that are neither active nor generated

  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    SlimInfer::SelectKv(layer, att, ctx, selection);
    if (layer < 2) return;  // layers 0-1 attend to everything
    const std::vector<int32_t>& positions = ctx.Kv(layer).positions;
    auto check = [&](int32_t r) {
      attended_inactive += positions[r] < 128 && !Active(layer < 4 ? 0 : 1, positions[r] / 16);
    };
    if (selection->all()) {
      for (size_t r = 0; r < positions.size(); ++r) check(static_cast<int32_t>(r));
    } else {
      for (const KvRange& range : selection->segments.at(0).ranges) {
        for (int32_t r = range.begin; r < range.end; ++r) check(r);
      }
    }
  }

 protected:
  void Score(int stage, std::span<const float> q_mean, std::vector<float>* scores) override {
    SlimInfer::Score(stage, q_mean, scores);  // -inf marks blocks without keys at this layer
    const std::vector<int32_t>& p = prefer[step];
    for (size_t b = 0; b < scores->size(); ++b) {
      if ((*scores)[b] > -std::numeric_limits<float>::infinity()) (*scores)[b] = -static_cast<float>(b);
    }
    for (size_t r = 0; r < p.size(); ++r) {
      if ((*scores)[p[r]] > -std::numeric_limits<float>::infinity()) (*scores)[p[r]] = 1000.0f - static_cast<float>(r);
    }
  }
};

// Decode under the overlap rule, with the KV tiers checked after every step: at each
// layer of a stage a cache block is in the device tier exactly when it holds an active
// or generated row (or is the last); attention reads only active and generated rows;
// every position is computed once per layer; blocks that left the prefill's selection
// come back through the Aux Cache, offloaded ones through prefetches.
TEST_F(PruningModelTest, SlimInferSwitchesBelowGammaAndKeepsOnlyActiveBlocksOnDevice) {
  const ModelConfig& c = model_->config();
  using Sets = std::vector<std::set<int32_t>>;
  for (float gamma : {0.9f, 0.7f}) {
    SCOPED_TRACE(absl::StrCat("gamma=", gamma));
    // 128 prompt tokens in 8 blocks of 16 (sink 0, tail 7); stage 0 after layer 1 keeps
    // 5 blocks, stage 1 after layer 3 keeps 3 (among those with keys at layer 3).
    ScriptedSlimInfer slim(
        SlimInferParams{.layers = {1, 3}, .budgets = {80, 48}, .block_size = 16, .unit_size = 4, .gamma = gamma}, c);
    slim.prefer = {{1, 2, 3}, {1, 2, 3}, {1, 2, 4}, {4, 5, 6}, {1, 2, 3}};
    // Step 2's stage-0 candidates overlap the active set by 0.8: a switch for gamma 0.9
    // only. Step 3's overlap 0.6 or 0.4, step 4's 0.4, stage 1's 2/3: switches for both.
    const Sets stage0 = gamma > 0.8f
                            ? Sets{{0, 1, 2, 3, 7}, {0, 1, 2, 3, 7}, {0, 1, 2, 4, 7}, {0, 4, 5, 6, 7}, {0, 1, 2, 3, 7}}
                            : Sets{{0, 1, 2, 3, 7}, {0, 1, 2, 3, 7}, {0, 1, 2, 3, 7}, {0, 4, 5, 6, 7}, {0, 1, 2, 3, 7}};
    const Sets stage1 = {{0, 1, 7}, {0, 1, 7}, {0, 1, 7}, {0, 4, 7}, {0, 1, 7}};
    Transformer t(*model_, backend_);
    std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, c.n_ctx);
    std::vector<int32_t> tokens = Prompt(128), positions(128);
    std::iota(positions.begin(), positions.end(), 0);
    ForwardOutput out;
    for (int step = 0; step < 5; ++step) {
      slim.step = step;
      SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .strategy = &slim};
      ASSERT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok());
      ASSERT_TRUE(out.status[0].ok()) << out.status[0];
      ASSERT_TRUE(kv->WaitAllMoves().ok());
      const int32_t context = out.next_position[0];
      for (int32_t b = 0; b < 8; ++b) {
        EXPECT_EQ(slim.Active(0, b), stage0[step].count(b) == 1) << "step " << step << " block " << b;
        EXPECT_EQ(slim.Active(1, b), stage1[step].count(b) == 1) << "step " << step << " block " << b;
      }
      for (int l = 0; l < c.n_layers; ++l) {
        const LayerTable& table = kv->manager().Table(1, l);
        std::set<int32_t> seen;
        for (int32_t p : table.positions) EXPECT_TRUE(seen.insert(p).second) << "position " << p << " twice at " << l;
        for (int32_t p = 0; p < context; ++p) {
          EXPECT_EQ(seen.count(p) == 1, l < slim.rows().Depth(p)) << "step " << step << " layer " << l << " pos " << p;
        }
        if (l < 2) continue;  // layers 0-1 hold every token in the device tier
        const int stage = l < 4 ? 0 : 1;
        for (size_t cb = 0; cb < table.tiers.size(); ++cb) {
          bool needed = cb + 1 == table.tiers.size();
          for (size_t r = cb * 16; r < std::min(table.positions.size(), (cb + 1) * 16); ++r) {
            const int32_t p = table.positions[r];
            needed = needed || p >= 128 || slim.Active(stage, p / 16);
          }
          EXPECT_EQ(table.tiers[cb], needed ? Tier::kDevice : Tier::kHost)
              << "step " << step << " layer " << l << " cache page " << cb;
        }
      }
      tokens.assign(1, 300 + step);
      positions.assign(1, context);
    }
    EXPECT_EQ(slim.switches(), gamma > 0.8f ? 5 : 4);
    EXPECT_EQ(slim.attended_inactive, 0);
    EXPECT_GT(slim.rows().revived(), 0) << "blocks pruned in prefill came back through the Aux Cache";
    EXPECT_GT(kv->swap().bytes_to_host(), 0u) << "leaving blocks went to the host tier";
    EXPECT_GT(kv->swap().bytes_to_device(), 0u) << "returning blocks were prefetched";
    EXPECT_TRUE(kv->manager().VerifyIntegrity().ok());
  }
}

}  // namespace
}  // namespace ps
