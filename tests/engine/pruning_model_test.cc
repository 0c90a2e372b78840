// Token pruning on stories260K: the no-op settings (keep 1.0, top_k >= prompt, budget >=
// prompt) giving exactly `full`'s tokens, the rows each strategy computes and what its
// hooks read on the host, LazyLLM's Aux Cache invariants through forced revivals and its
// attention to the selected tokens only (PoD's shared scores and freed keys, SlimInfer's
// switches and KV tiers: pruning_kv_model_test.cc). The selection math on hand-built
// inputs is pruning_math_test.cc.
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/pruning/gemfilter.h"
#include "engine/pruning/kv_compression.h"
#include "engine/pruning/lazyllm.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/sliminfer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/pruning_model_fixture.h"
#include "tests/engine/test_util.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(PruningModelTest, NoOpSettingsGiveExactlyFullTokens) {
  const std::vector<int32_t> prompt = Prompt(120);
  int64_t full_rows = 0;
  const std::vector<int32_t> full = Run(prompt, 40, nullptr, &full_rows);
  EXPECT_EQ(full_rows, 120 * model_->config().n_layers);
  auto lazy = Make("lazyllm", {"layers=1,2,3,4", "keep=1,1,1,1"});
  int64_t rows = 0;
  EXPECT_EQ(Run(prompt, 40, lazy.get(), &rows), full);
  EXPECT_EQ(rows, full_rows);
  for (const char* k : {"top_k=120", "top_k=4096"}) {
    auto gem = Make("gemfilter", {k});
    EXPECT_EQ(Run(prompt, 40, gem.get(), &rows), full) << k;
    EXPECT_EQ(rows, full_rows) << "no prefix pass when nothing is filtered";
  }
  for (const char* b : {"budget=120", "budget=4096"}) {
    auto criti = Make("critiprefill", {"segment_size=16", "block_size=4", "dense_prefix=0", b});
    EXPECT_EQ(Run(prompt, 40, criti.get(), &rows), full) << b;
  }
  for (const char* b : {"budgets=120,120", "budgets=4096,128"}) {
    auto slim = Make("sliminfer", {"layers=1,3", b, "block_size=8", "unit_size=4"});
    EXPECT_EQ(Run(prompt, 40, slim.get(), &rows), full) << b;
    EXPECT_EQ(rows, full_rows) << b;
  }
  for (const char* r : {"recent=120", "recent=4096"}) {
    auto stream = Make("streamingllm", {r});
    EXPECT_EQ(Run(prompt, 40, stream.get(), &rows), full) << r;
  }
  for (const char* b : {"budget=120", "budget=4096"}) {
    auto snap = Make("snapkv", {b});
    EXPECT_EQ(Run(prompt, 40, snap.get(), &rows), full) << b;
  }
  // The prompt's logits: equal at the no-op budget, changed by a small one (else the
  // lines above would prove nothing; the tiny model's greedy tokens survive it).
  const std::vector<float> dense = PromptLogits(prompt, nullptr);
  auto roomy = Make("critiprefill", {"segment_size=16", "block_size=4", "dense_prefix=0", "budget=120"});
  EXPECT_EQ(PromptLogits(prompt, roomy.get()), dense);
  auto sparse = Make("critiprefill", {"segment_size=16", "block_size=4", "dense_prefix=0", "budget=8"});
  EXPECT_GT(MaxAbsDiff(PromptLogits(prompt, sparse.get()), dense), 1e-3f);
}

TEST_F(PruningModelTest, StrategiesComputeLessAndGemFilterKeepsTheLastToken) {
  const std::vector<int32_t> prompt = Prompt(200);
  const int layers = model_->config().n_layers;
  int64_t rows = 0;
  auto lazy = Make("lazyllm", {"layers=1,3", "keep=0.5,0.25"});
  Run(prompt, 8, lazy.get(), &rows);
  EXPECT_EQ(rows, 200 + 100 * 2 + 50 * 2);  // layer 0 whole, 1-2 half, 3-4 a quarter
  auto gem = Make("gemfilter", {"top_k=32", "filter_layer=1"});
  Run(prompt, 8, gem.get(), &rows);
  EXPECT_EQ(rows, 200 * 2 + 32 * layers);  // prefix pass over layers 0-1, then 32 tokens through all
  const auto& sel = static_cast<GemFilter*>(gem.get())->selected();
  ASSERT_EQ(sel.size(), 32u);
  EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
  EXPECT_EQ(sel.back(), 199);
  // 13 blocks of 16 (the last holds 8): layers 0-1 whole, 2-3 six blocks, 4 three,
  // the last block among them.
  auto slim = Make("sliminfer", {"layers=1,3", "budgets=96,48", "block_size=16", "unit_size=4"});
  Run(prompt, 8, slim.get(), &rows);
  EXPECT_EQ(rows, 200 * 2 + (5 * 16 + 8) * 2 + (2 * 16 + 8));
  auto* s = static_cast<SlimInfer*>(slim.get());
  EXPECT_TRUE(s->Active(0, 0) && s->Active(0, 12) && s->Active(1, 0) && s->Active(1, 12)) << "sink and tail";
  // A first stage that keeps everything, then one that prunes.
  auto late = Make("sliminfer", {"layers=1,3", "budgets=4096,48", "block_size=16", "unit_size=4"});
  Run(prompt, 8, late.get(), &rows);
  EXPECT_EQ(rows, 200 * 4 + (2 * 16 + 8));
}

// GemFilter's scoring pass frees each layer's scratch KV once the layer's attention is
// done, and the sequence's peak counts the scratch blocks: the pass holds one layer's
// prompt blocks at a time, so the peak is the larger of that and the kept tokens' KV.
TEST_F(PruningModelTest, GemFilterHoldsOneScratchLayerAtATimeAndCountsIt) {
  const std::vector<int32_t> prompt = Prompt(200);
  const int layers = model_->config().n_layers;
  Transformer t(*model_, backend_);
  std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, 256);
  const KvCacheManager& m = kv->manager();
  const int64_t per_page = m.blocks_per_page();
  const int64_t prompt_blocks = (200 + 15) / 16 * per_page;  // one layer's
  const int64_t kept_blocks = (64 + 15) / 16 * per_page;     // one layer's
  std::vector<int32_t> positions(prompt.size());
  std::iota(positions.begin(), positions.end(), 0);
  auto gem = Make("gemfilter", {"top_k=64", absl::StrCat("filter_layer=", layers - 2)});
  SeqInput in{.seq_id = 1, .tokens = prompt, .positions = positions, .strategy = gem.get()};
  ForwardOutput out;
  ASSERT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok() && out.status[0].ok());
  EXPECT_EQ(m.BlocksIn(1, Tier::kDevice), kept_blocks * layers);
  const KvCacheManager::Peak peak = m.PeakBlocks(1);
  EXPECT_EQ(peak.device, std::max(prompt_blocks, kept_blocks * layers)) << "not " << (layers - 1) * prompt_blocks;
  EXPECT_LE(peak.device, 2 * prompt_blocks + kept_blocks * layers);
  EXPECT_EQ(peak.total, peak.device) << "nothing in the host tier";
  EXPECT_TRUE(m.VerifyIntegrity().ok()) << m.VerifyIntegrity();
}

// The KV-cache baselines after a dense prefill: at the first decode step each layer's
// evicted prompt pages lose their blocks (per KV head), the kept ones and the
// generated tokens' stay, and decoding goes on over them alone (a read of a freed
// block would fault: their pointers are null). StreamingLLM keeps the sink page and
// the recent pages at every head; SnapKV its budget per head, the window included,
// chosen per head.
TEST_F(PruningModelTest, KvBaselinesEvictPagesPerHeadAfterThePrompt) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> prompt = Prompt(200);  // 12 whole pages of 16 and 8 tokens
  const int64_t per_page = 2 * c.n_kv_heads;
  auto decode = [&](PruningStrategy* strategy, KvCache& kv) {
    Transformer t(*model_, backend_);
    std::vector<int32_t> tokens = prompt, positions(prompt.size());
    std::iota(positions.begin(), positions.end(), 0);
    std::vector<int32_t> out_tokens;
    for (int step = 0; step < 8; ++step) {
      SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .strategy = strategy};
      ForwardOutput out;
      EXPECT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), kv, &out).ok() && out.status[0].ok());
      const auto best = std::max_element(out.logits.end() - c.n_vocab, out.logits.end());
      out_tokens.push_back(static_cast<int32_t>(best - (out.logits.end() - c.n_vocab)));
      tokens.assign(1, out_tokens.back());
      positions.assign(1, out.next_position[0]);
    }
    return out_tokens;
  };
  std::unique_ptr<KvCache> dense_kv = testing::KvFor(*model_, backend_, 256);
  const std::vector<int32_t> full = decode(nullptr, *dense_kv);
  const int64_t pages = (200 + 8 + 15) / 16;  // after 8 steps (the last token's KV is not stored yet: 207)

  auto stream = Make("streamingllm", {"sinks=4", "recent=40"});
  std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, 256);
  const std::vector<int32_t> streamed = decode(stream.get(), *kv);
  auto* s = static_cast<KvCompression*>(stream.get());
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) EXPECT_THAT(s->Kept(l, h), ElementsAre(0, 10, 11)) << l << " " << h;
  }
  EXPECT_EQ(kv->manager().BlocksIn(1, Tier::kDevice), c.n_layers * (pages - 9) * per_page) << "9 pages evicted";
  EXPECT_TRUE(kv->manager().VerifyIntegrity().ok());
  EXPECT_NE(streamed, full) << "the eviction changes what the model sees (else this test proves little)";

  auto snap = Make("snapkv", {"window=8", "budget=64", "kernel=5"});
  kv = testing::KvFor(*model_, backend_, 256);
  decode(snap.get(), *kv);
  auto* k = static_cast<KvCompression*>(snap.get());
  std::set<std::vector<int32_t>> distinct;
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const std::vector<int32_t>& kept = k->Kept(l, h);
      EXPECT_EQ(kept.size(), 4u) << "64 tokens: 4 whole pages";
      EXPECT_EQ(kept.back(), 11) << "the window (tokens 192-199): the last whole page and the partial one";
      distinct.insert(kept);
    }
  }
  EXPECT_GT(distinct.size(), 1u) << "heads choose their own pages";
  EXPECT_EQ(kv->manager().BlocksIn(1, Tier::kDevice), c.n_layers * (pages - 8) * per_page) << "8 of 12 evicted";
  EXPECT_TRUE(kv->manager().VerifyIntegrity().ok());
}

// What the strategies' hooks read on the host in a prompt's step: on a backend whose
// activations host code cannot reach (GuardedBackend, as on a GPU), every read is a
// copy. CritiPrefill reads only its representatives, the reductions of the rows.
TEST_F(PruningModelTest, StrategiesReadTheirScoresNotTheRowsOnTheHost) {
  const ModelConfig& c = model_->config();
  const int n = 200;
  const std::vector<int32_t> prompt = Prompt(n);
  testing::GuardedBackend guarded(backend_);
  auto host_bytes = [&](PruningStrategy* strategy) {
    Transformer t(*model_, guarded);
    std::unique_ptr<KvCache> kv = testing::KvFor(*model_, guarded, 256);
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    SeqInput in{.seq_id = 1, .tokens = prompt, .positions = positions, .strategy = strategy};
    ForwardOutput out;
    EXPECT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok() && out.status[0].ok());
    return out.host_bytes.at(0);
  };
  // Every row's hidden state, query and key at every layer after the first: what the
  // hooks were handed before they read through views.
  const int64_t rows_bytes = int64_t{n} * (c.n_embd + c.q_dim() + c.kv_dim()) * (c.n_layers - 1) * 4;
  EXPECT_EQ(host_bytes(nullptr), 0);
  // Segments of 16, blocks of 4: segments 1-11 sparse. Per layer from 1: the max and
  // min rows of segments 0-11 (queries) and of the 44 blocks before segment 11 (keys).
  auto criti = Make("critiprefill", {"segment_size=16", "block_size=4", "dense_prefix=0", "budget=8"});
  EXPECT_EQ(host_bytes(criti.get()), (12 * 2 * c.q_dim() + 44 * 2 * c.kv_dim()) * 4 * (c.n_layers - 1));
  // SlimInfer: its key units' sums and the last queries at layers 1 and 3, and the
  // hidden states of the rows that leave for the Aux Cache; LazyLLM: the last query's
  // probabilities at every layer, and those hidden states.
  auto slim = Make("sliminfer", {"layers=1,3", "budgets=96,48", "block_size=16", "unit_size=4"});
  const int64_t slim_bytes = host_bytes(slim.get());
  EXPECT_GT(slim_bytes, 0);
  EXPECT_LT(slim_bytes, rows_bytes / 8);
  auto lazy = Make("lazyllm", {"layers=1,3", "keep=0.5,0.25"});
  const int64_t lazy_bytes = host_bytes(lazy.get());
  EXPECT_GT(lazy_bytes, 0);
  EXPECT_LT(lazy_bytes, rows_bytes / 4);
}

// Forces revivals: odd steps favour the lowest positions, even steps the highest,
// so tokens pruned in one step are selected again in the next.
class SeesawLazyLlm : public LazyLlm {
 public:
  using LazyLlm::LazyLlm;
  int step = 0;

 protected:
  void Score(int layer, std::span<const float> probs, std::span<const int32_t> kv_positions) override {
    (void)layer, (void)probs;
    for (int32_t p : kv_positions) scores_[p] = step % 2 == 0 ? static_cast<float>(p) : 1000.0f - static_cast<float>(p);
  }
};

// Unbounded (the default), a step revives every selected token waiting in the Aux
// Cache; with max_revivals 3, at most 3 per pruning layer (the others stay there, out
// of the selection); the invariants hold in both.
TEST_F(PruningModelTest, AuxCacheInvariantsHoldThroughForcedRevivals) {
  for (int cap : {0, 3}) {
    SCOPED_TRACE(absl::StrCat("max_revivals=", cap));
    const ModelConfig& c = model_->config();
    SeesawLazyLlm lazy(LazyLlmParams{.layers = {1, 3}, .keep = {0.6f, 0.3f}, .max_revivals = cap}, c);
    Transformer t(*model_, backend_);
    std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, c.n_ctx);
    std::vector<int32_t> tokens = Prompt(64), positions(64);
    std::iota(positions.begin(), positions.end(), 0);
    ForwardOutput out;
    int64_t revived_rows = 0, revived_before = 0, short_selections = 0;
    for (int step = 0; step < 12; ++step) {
      lazy.step = step;
      SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .strategy = &lazy};
      ASSERT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok());
      ASSERT_TRUE(out.status[0].ok()) << out.status[0];
      const int32_t context = out.next_position[0];
      // In decode steps the new token goes through every layer; rows beyond it are revived ones.
      if (step > 0) revived_rows += out.rows_computed[0] - c.n_layers;
      if (cap > 0) {
        EXPECT_LE(lazy.revived() - revived_before, 2 * cap) << "step " << step;
      }
      revived_before = lazy.revived();
      // Uncapped (the paper, the default), every selected token waiting in the Aux
      // Cache comes back, so the last pruning layer's selection is whole; capped, the
      // tokens left waiting leave it.
      int64_t selected = 0;
      for (int32_t p = 0; p < context; ++p) selected += lazy.Selected(p);
      if (cap == 0) {
        EXPECT_EQ(selected, KeepCount(0.3, context)) << "step " << step;
      } else {
        short_selections += selected < KeepCount(0.3, context);
      }
      for (int l = 0; l < c.n_layers; ++l) {
        std::set<int32_t> in_kv;
        for (int32_t p : kv->manager().Table(1, l).positions) {
          EXPECT_TRUE(in_kv.insert(p).second) << "position " << p << " computed twice at layer " << l;
        }
        for (int32_t p = 0; p < context; ++p) {
          // KV at the layers below the token's depth, none from there on; the Aux Cache
          // holds it exactly at its depth when that is not the end.
          EXPECT_EQ(in_kv.count(p) == 1, l < lazy.Depth(p)) << "step " << step << " layer " << l << " position " << p;
          if (lazy.InAux(p) && lazy.Depth(p) == l) {
            EXPECT_EQ(in_kv.count(p), 0u);
          }
        }
      }
      for (int32_t p = 0; p < context; ++p) EXPECT_EQ(lazy.InAux(p), lazy.Depth(p) < c.n_layers) << p;
      EXPECT_EQ(context - 1, positions.back());
      EXPECT_EQ(lazy.Depth(context - 1), c.n_layers) << "the newest token is always computed through";
      // Next step: one new token.
      tokens.assign(1, 300 + step);
      positions.assign(1, context);
    }
    EXPECT_GT(lazy.revived(), 20) << "the test meant to force revivals";
    if (cap > 0) {
      EXPECT_GT(short_selections, 0) << "the cap left tokens waiting";
    }
    EXPECT_GT(revived_rows, lazy.revived()) << "revived tokens are computed from their layer on";
    int64_t in_aux = 0;
    for (int32_t p = 0; p < 64 + 12; ++p) in_aux += lazy.InAux(p);
    EXPECT_EQ(lazy.aux_entries(), in_aux);
    EXPECT_EQ(kv->manager().host_rows().Rows(1), in_aux) << "the Aux Cache's host-tier rows are the strategy's entries";
    EXPECT_GT(kv->manager().host_rows().Blocks(1), 0);
  }
}

// From the first pruning layer on, LazyLLM's queries attend only to the tokens selected
// at that layer (paper Fig. 3), in decode as in prefill; below it, to everything.
class AttendedLazyLlm : public LazyLlm {
 public:
  using LazyLlm::LazyLlm;
  void SelectKv(int layer, const LayerAttention& att, SeqContext& ctx, KvSelection* selection) override {
    LazyLlm::SelectKv(layer, att, ctx, selection);
    const std::vector<int32_t>& positions = ctx.Kv(layer).positions;
    std::vector<int32_t> rows(positions.size());
    std::iota(rows.begin(), rows.end(), 0);
    if (!selection->all()) {
      EXPECT_EQ(selection->segments.size(), 1u);
      rows.clear();
      for (const KvRange& r : selection->segments[0].ranges) {
        for (int32_t j = r.begin; j < r.end; ++j) rows.push_back(j);
      }
    }
    for (int32_t j : rows) {
      if (layer >= 1) {
        EXPECT_TRUE(Selected(positions[j])) << "layer " << layer << " position " << positions[j];
      }
    }
    attended[layer] = static_cast<int64_t>(rows.size());
    cached[layer] = static_cast<int64_t>(positions.size());
  }
  std::map<int, int64_t> attended, cached;
};

TEST_F(PruningModelTest, LazyLlmAttendsOnlyToTheSelectedTokens) {
  const ModelConfig& c = model_->config();
  AttendedLazyLlm lazy(LazyLlmParams{.layers = {1, 3}, .keep = {0.5f, 0.25f}}, c);
  Transformer t(*model_, backend_);
  std::unique_ptr<KvCache> kv = testing::KvFor(*model_, backend_, c.n_ctx);
  std::vector<int32_t> tokens = Prompt(80), positions(80);
  std::iota(positions.begin(), positions.end(), 0);
  ForwardOutput out;
  bool restricted = false;
  for (int step = 0; step < 6; ++step) {
    SeqInput in{.seq_id = 1, .tokens = tokens, .positions = positions, .strategy = &lazy};
    ASSERT_TRUE(t.Forward(std::span<const SeqInput>(&in, 1), *kv, &out).ok() && out.status[0].ok());
    const int32_t context = out.next_position[0];
    EXPECT_EQ(lazy.attended[0], context) << "layer 0 attends to the whole context";
    for (int l = 1; l < c.n_layers; ++l) {
      // Selections: half the context from layer 1, a quarter from layer 3 (+1: the newest token).
      EXPECT_LE(lazy.attended[l], (l < 3 ? context / 2 : context / 4) + 1) << "step " << step << " layer " << l;
      restricted = restricted || lazy.attended[l] < lazy.cached[l];
    }
    tokens.assign(1, 300 + step);
    positions.assign(1, context);
  }
  EXPECT_TRUE(restricted) << "decode steps find tokens cached at a layer but no longer selected there";
}

}  // namespace
}  // namespace ps
