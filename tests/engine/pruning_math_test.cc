// Token pruning on hand-built inputs: the selection math (top-k, pooling), CritiPrefill's
// representatives, criticality, mask and layer fusion, PoD's gate, SlimInfer's unit
// scores, and the strategies' parameters: parsing, defaults and validation naming the
// field. No model needed (pruning_model_test.cc runs the strategies on stories260K).
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/pruning/auto.h"
#include "engine/pruning/critiprefill.h"
#include "engine/pruning/gemfilter.h"
#include "engine/pruning/pod.h"
#include "engine/pruning/registry.h"
#include "engine/pruning/selection.h"
#include "engine/pruning/sliminfer.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/shared_math.h"
#include "proto/field_args.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Selection, KeepCountRoundsUpAndKeepsOne) {
  EXPECT_EQ(KeepCount(0.5, 10), 5);
  EXPECT_EQ(KeepCount(0.5, 11), 6);
  EXPECT_EQ(KeepCount(0.3, 10), 3);  // 0.3 * 10 is 3.0000000000000004 in doubles
  EXPECT_EQ(KeepCount(0.2f, 5), 1);  // 0.2f is 0.2000000030
  EXPECT_EQ(KeepCount(0.1f, 100000), 10000);
  EXPECT_EQ(KeepCount(0.01, 10), 1);
  EXPECT_EQ(KeepCount(1.0, 7), 7);
  EXPECT_EQ(KeepCount(0.5, 0), 0);
}

TEST(Selection, TopKRestoresOriginalOrderAndBreaksTiesByIndex) {
  const std::vector<float> s = {0.1f, 0.9f, 0.3f, 0.9f, 0.5f, 0.0f};
  EXPECT_THAT(TopKInOrder(s, 3), ElementsAre(1, 3, 4));
  EXPECT_THAT(TopKInOrder(s, 1), ElementsAre(1));  // tie 1 vs 3: the lower index
  EXPECT_THAT(TopKInOrder(s, 0), ElementsAre());
  EXPECT_THAT(TopKInOrder(s, 99), ElementsAre(0, 1, 2, 3, 4, 5));
  const std::vector<float> flat(5, 1.0f);
  EXPECT_THAT(TopKInOrder(flat, 2), ElementsAre(0, 1));
}

TEST(Selection, AvgPoolZeroPadsAndDividesByTheKernel) {
  const std::vector<float> x = {5, 0, 0, 0, 0, 0, 10};
  // Kernel 5: out[i] = (x[i-2] + ... + x[i+2]) / 5 with zeros outside.
  EXPECT_THAT(AvgPool1d(x, 5), ElementsAre(1, 1, 1, 0, 2, 2, 2));
  EXPECT_THAT(AvgPool1d(x, 1), ElementsAre(5, 0, 0, 0, 0, 0, 10));
  EXPECT_THAT(AvgPool1d(std::vector<float>{3, 6}, 3), ElementsAre(3, 3));
  // Pooling turns an isolated spike into a span: GemFilter then keeps neighbours.
  const std::vector<float> spike = {0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 1, 1, 1};
  EXPECT_THAT(TopKInOrder(AvgPool1d(spike, 5), 5), ElementsAre(2, 3, 4, 5, 6));
}

TEST(CritiPrefill, RepresentativesAndCriticalityOnHandBuiltRows) {
  // Runs of rows reduced where they live (the CPU's activations are host memory), read
  // through a view that counts the bytes a device would copy.
  ThreadPool pool(1);
  CpuBackend backend(pool);
  const std::vector<float> x = {7, 7, 1, -2, 3, 0, -1, 5, 4, 4};  // 5 rows of 2
  HostReads reads;
  ActivationRows rows(backend);
  rows.View(x.data(), 5, 2, &reads);
  const std::vector<int32_t> bounds = {1, 4, 5};  // rows 1-3, then row 4
  const float* max_min = rows.Reduce(bounds, RowReduction::kMaxMin);
  EXPECT_THAT(std::vector<float>(max_min, max_min + 8), ElementsAre(3, 5, -1, -2, /**/ 4, 4, 4, 4));
  const float* sum = rows.Reduce(bounds, RowReduction::kSum);
  EXPECT_THAT(std::vector<float>(sum, sum + 4), ElementsAre(3, 3, 4, 4));
  const float* one = rows.Host(2, 1);
  EXPECT_THAT(std::vector<float>(one, one + 2), ElementsAre(3, 0));
  EXPECT_EQ(reads.bytes, (8 + 4 + 2) * 4) << "the reductions and one row";
  // Query representatives of two heads (max, min each): their mean is (0.5, 0.5).
  const std::vector<float> q_rep = {1, 0, 0, 1, 2, 2, -1, -1};
  // Per block its max row then its min row; the score is the larger of the two dots
  // with the mean query (the min row wins for the last block).
  const std::vector<float> k_rep = {2, 0, 0, -4, /**/ 0, 4, -1, -1, /**/ 1, -3, 3, 3};
  EXPECT_THAT(BlockCriticality(q_rep, k_rep, 2), ElementsAre(1, 2, 3));
}

// A SeqContext whose KV at every layer holds n rows (what SelectKv reads of it).
class RowsOnlyContext final : public SeqContext {
 public:
  explicit RowsOnlyContext(int n) {
    table_.positions.resize(n);
    std::iota(table_.positions.begin(), table_.positions.end(), 0);
  }
  absl::Status RunPrefix(std::span<const int32_t>, std::span<const int32_t>, int) override {
    return absl::UnimplementedError("no prefix passes here");
  }
  bool AuxPut(int32_t, const float*) override { return false; }
  bool AuxTake(int32_t, float*) override { return false; }
  const LayerTable& Kv(int) const override { return table_; }
  int KvBlockTokens() const override { return 16; }
  absl::Status MovePages(int, std::span<const int32_t>, Tier) override {
    return absl::UnimplementedError("no moves here");
  }
  absl::Status DropHeadPages(int, int, std::span<const int32_t>) override {
    return absl::UnimplementedError("no drops here");
  }

 private:
  LayerTable table_;
};

// 16 prompt rows, segments of 4, blocks of 2, a budget of one block, nothing dense
// by position: segments 1 and 2 are sparse (0 has no more blocks before it than the
// budget, 3 is the last). Two KV heads with two query heads each, head size 2. Key
// head 0 has one loud block (1 at layer 1: (5, 0); 3: (0, 5)), head 1 block 0 (5, 0).
TEST(CritiPrefill, SelectsTheMostCriticalBlockPerSegmentAndHeadAndFusesLayers) {
  constexpr int kN = 16, kHd = 2, kKvd = 4, kQd = 8;
  const AttentionShape shape{.n_heads = 4, .n_kv_heads = 2, .head_dim = kHd, .scale = 1};
  std::vector<int32_t> pos(kN);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> q(kN * kQd, 0.0f), k(kN * kKvd, 0.0f);
  for (int i = 0; i < kN; ++i) {
    for (int h = 0; h < 4; ++h) q[i * kQd + h * kHd + (i < 8 ? 0 : 1)] = 1;  // rows 0-7 ask (1, 0), 8-15 (0, 1)
  }
  auto set_key = [&](int block, int head, float a, float b) {
    for (int r = 2 * block; r < 2 * block + 2; ++r) k[r * kKvd + head * kHd] = a, k[r * kKvd + head * kHd + 1] = b;
  };
  set_key(1, 0, 5, 0);
  set_key(3, 0, 0, 5);
  set_key(0, 1, 5, 0);
  ThreadPool pool(1);
  CpuBackend backend(pool);
  HostReads reads;
  ActivationRows q_rows(backend), k_rows(backend);
  q_rows.View(q.data(), kN, kQd, &reads);
  k_rows.View(k.data(), kN, kKvd, &reads);
  const LayerAttention att{.q_positions = pos, .q = &q_rows, .new_positions = pos, .k = &k_rows, .shape = shape};
  RowsOnlyContext ctx(kN);
  auto select = [&](CritiPrefill& c, int layer, const LayerAttention& a) {
    KvSelection sel;
    c.SelectKv(layer, a, ctx, &sel);
    EXPECT_TRUE(sel.Validate(kN, kN, 2).ok()) << sel.Validate(kN, kN, 2);
    std::vector<std::string> out;
    for (const KvSelection::Segment& s : sel.segments) {
      std::string ranges;
      for (const KvRange& r : s.ranges) absl::StrAppend(&ranges, "[", r.begin, ",", r.end, ")");
      out.push_back(absl::StrCat(s.q_begin, "-", s.q_end, " h", s.kv_head, " ", ranges));
    }
    return absl::StrJoin(out, " | ");
  };
  CritiPrefillParams p{.segment_size = 4, .block_size = 2, .budget = 2, .dense_prefix = 0};
  CritiPrefill c(p);
  EXPECT_EQ(select(c, 0, att), "") << "layer 0 is dense";
  // Segment 1 (queries (1, 0)): head 0 takes block 1, head 1 block 0, each with its own rows 4-7.
  // Segment 2 (queries (0, 1)): head 0 block 3; head 1 sees only zeros and takes the first block.
  EXPECT_EQ(
      select(c, 1, att),
      "0-4 h-1 [0,4) | 4-8 h0 [2,8) | 4-8 h1 [0,2)[4,8) | 8-12 h0 [6,12) | 8-12 h1 [0,2)[8,12) | 12-16 h-1 [0,16)");
  // Layer 2: head 0's block 0 becomes (3, 0). Segment 1 now scores (3, 0) for blocks 0, 1:
  // softmax (0.95, 0.05) fused with layer 1's (0.007, 0.993): 0.25 * prev + 0.75 * cur
  // favours block 0; with the paper's weighting (0.75 on prev) block 1 stays.
  const std::vector<float> k1 = k;  // layer 1's keys; `att` reads k, layer 2's from here on
  ActivationRows k1_rows(backend);
  k1_rows.View(k1.data(), kN, kKvd, &reads);
  set_key(1, 0, 0, 0);
  set_key(0, 0, 3, 0);
  EXPECT_THAT(select(c, 2, att), HasSubstr("4-8 h0 [0,2)[4,8) |"));
  p.fusion_prev_weight = 0.75f;
  CritiPrefill paper(p);
  LayerAttention att1 = att;
  att1.k = &k1_rows;
  EXPECT_THAT(select(paper, 1, att1), HasSubstr("4-8 h0 [2,8) |"));
  EXPECT_THAT(select(paper, 2, att), HasSubstr("4-8 h0 [2,8) |"));
  EXPECT_THAT(select(paper, 1, att), HasSubstr("4-8 h0 [0,2)[4,8) |")) << "layer 1 starts the fusion afresh";
  // Not the prompt's step (fewer new rows than cached ones, or one query row): dense.
  ActivationRows q_last(backend), k_last(backend);
  q_last.View(q.data() + (kN - 1) * kQd, 1, kQd, &reads);
  k_last.View(k.data() + (kN - 1) * kKvd, 1, kKvd, &reads);
  const LayerAttention decode{.q_positions = std::span<const int32_t>(pos).last(1),
                              .q = &q_last,
                              .new_positions = std::span<const int32_t>(pos).last(1),
                              .k = &k_last,
                              .shape = shape};
  EXPECT_EQ(select(c, 2, decode), "");
  // A budget covering every block before each segment: dense throughout.
  CritiPrefill roomy(CritiPrefillParams{.segment_size = 4, .block_size = 2, .budget = 16, .dense_prefix = 0});
  EXPECT_EQ(select(roomy, 1, att), "");
}

ModelConfig Layers(int n) {
  ModelConfig c;
  c.n_layers = n;
  c.n_embd = 8;
  return c;
}

// A strategy's parameters as the API's message.
pruneserve::v1::PruningConfig AsProto(const absl::StatusOr<PruningParams>& p) {
  pruneserve::v1::PruningConfig out;
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) PruningToProto(*p, &out);
  return out;
}

TEST(PruningParams, DefaultsParsingAndValidationNameTheField) {
  const ModelConfig c = Layers(30);
  const absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(c);
  ASSERT_TRUE(d.ok()) << d.status();
  const pruneserve::v1::LazyLLM lazy = AsProto(d->Get("lazyllm")).lazyllm();
  EXPECT_THAT(lazy.layers(), ElementsAre(18, 24));
  EXPECT_THAT(lazy.keep(), ElementsAre(0.3f, 0.1f));
  EXPECT_EQ(lazy.max_revivals(), 0u) << "revival unbounded, as the paper";
  // The schedule SlimInfer's authors ran LazyLLM with: 50% from the layer after each
  // slim layer (10/20/30 of 32 here: 9, 19, 28 of 30).
  const pruneserve::v1::LazyLLM slim_preset =
      AsProto(d->WithArgs("lazyllm", {"preset=sliminfer"}, "pruning")).lazyllm();
  EXPECT_THAT(slim_preset.layers(), ElementsAre(10, 20, 29));
  EXPECT_THAT(slim_preset.keep(), ElementsAre(0.5f, 0.5f, 0.5f));
  EXPECT_THAT(
      AsProto(d->WithArgs("lazyllm", {"preset=sliminfer", "layers=5", "keep=0.2"}, "pruning")).lazyllm().layers(),
      ElementsAre(5))
      << "an explicit schedule wins";
  EXPECT_THAT(AsProto(d->WithArgs("lazyllm", {"preset=default"}, "pruning")).lazyllm().layers(), ElementsAre(18, 24));
  const pruneserve::v1::GemFilter gem = AsProto(d->Get("gemfilter")).gemfilter();
  EXPECT_EQ(gem.filter_layer(), 12u);
  EXPECT_EQ(gem.top_k(), 1024u);
  // The paper's LLaMA-3.1-8B setting.
  EXPECT_EQ(AsProto(StrategyDefaults::ForModel(Layers(32))->Get("gemfilter")).gemfilter().filter_layer(), 13u);
  for (const StrategyInfo* s : Strategies()) {
    const absl::StatusOr<PruningParams> p = d->Get(s->name);
    ASSERT_TRUE(p.ok()) << s->name;
    EXPECT_EQ(p->name(), s->name);
    if (p->params == nullptr) continue;
    const absl::Status valid = p->params->Validate(c, "pruning");
    if (s->name == "pod" || s->name == "auto") {  // no calibration or table: unavailable, saying what it needs
      EXPECT_EQ(valid.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(std::string(valid.message()), HasSubstr(s->name == "pod" ? "--pod-groups" : "--auto-table"));
    } else {
      EXPECT_TRUE(valid.ok()) << s->name << ": " << valid;
    }
  }

  const absl::StatusOr<PruningParams> pod = d->WithArgs("pod", {}, "--strategy-arg");
  EXPECT_EQ(pod.status().code(), absl::StatusCode::kFailedPrecondition) << "defaults are validated too";
  EXPECT_THAT(std::string(pod.status().message()), HasSubstr("--strategy-arg.pod: PoD needs"));
  EXPECT_TRUE(d->WithArgs("full", {}, "--strategy-arg").ok());

  const absl::StatusOr<PruningParams> g = d->WithArgs("gemfilter", {"top_k=64", "original_positions=true"}, "pruning");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "gemfilter");
  EXPECT_EQ(AsProto(g).gemfilter().top_k(), 64u);
  EXPECT_TRUE(AsProto(g).gemfilter().original_positions());
  EXPECT_EQ(AsProto(g).gemfilter().filter_layer(), 12u) << "unset parameters keep their defaults";
  EXPECT_THAT(std::string(d->WithArgs("gemfilter", {"topk=3"}, "pruning").status().message()),
              HasSubstr("no parameter 'topk' (known: filter_layer, top_k"));
  EXPECT_THAT(std::string(d->WithArgs("lazyllm", {"keep=a,b"}, "pruning").status().message()), HasSubstr("keep"));

  auto error = [&](const std::string& name, std::vector<std::string> args) {
    return std::string(d->WithArgs(name, args, "pruning").status().message());
  };
  EXPECT_THAT(error("lazyllm", {"layers=4,8", "keep=0.5"}), HasSubstr("pruning.lazyllm.keep: has 1 entries for 2"));
  EXPECT_THAT(error("lazyllm", {"layers=4,30", "keep=0.5,0.4"}), HasSubstr("pruning.lazyllm.layers[1]"));
  EXPECT_THAT(error("lazyllm", {"layers=8,4", "keep=0.5,0.4"}), HasSubstr("ascending"));
  EXPECT_THAT(error("lazyllm", {"layers=4,8", "keep=0.4,0.5"}), HasSubstr("pruning.lazyllm.keep[1]"));
  EXPECT_THAT(error("lazyllm", {"layers=4", "keep=0"}), HasSubstr("pruning.lazyllm.keep[0]"));
  EXPECT_THAT(error("lazyllm", {"max_revivals=3000000000"}), HasSubstr("pruning.lazyllm.max_revivals"));
  EXPECT_THAT(error("lazyllm", {"preset=mild"}),
              HasSubstr("pruning.lazyllm.preset: unknown 'mild' (known: default, sliminfer)"));
  const absl::StatusOr<PruningParams> capped = d->WithArgs("lazyllm", {"max_revivals=0"}, "pruning");
  EXPECT_EQ(AsProto(capped).lazyllm().max_revivals(), 0u);
  EXPECT_THAT(AsProto(capped).lazyllm().layers(), ElementsAre(18, 24)) << "the schedule keeps its defaults";
  EXPECT_THAT(error("gemfilter", {"filter_layer=30"}), HasSubstr("pruning.gemfilter.filter_layer"));
  EXPECT_THAT(error("gemfilter", {"top_k=0"}), HasSubstr("pruning.gemfilter.top_k"));
  EXPECT_THAT(error("gemfilter", {"pool_kernel=4"}), HasSubstr("pruning.gemfilter.pool_kernel"));
  EXPECT_THAT(error("critiprefill", {"segment_size=500"}), HasSubstr("pruning.critiprefill.segment_size"));
  EXPECT_THAT(error("critiprefill", {"block_size=0"}), HasSubstr("pruning.critiprefill.block_size"));
  EXPECT_THAT(error("critiprefill", {"budget=0"}), HasSubstr("pruning.critiprefill.budget"));
  EXPECT_THAT(error("critiprefill", {"fusion_prev_weight=1"}), HasSubstr("pruning.critiprefill.fusion_prev_weight"));
  const pruneserve::v1::CritiPrefill criti = AsProto(d->Get("critiprefill")).critiprefill();
  EXPECT_EQ(criti.segment_size(), 512u);
  EXPECT_EQ(criti.block_size(), 32u);
  EXPECT_EQ(criti.budget(), 1024u);
  EXPECT_EQ(criti.dense_prefix(), 4096u);
  EXPECT_EQ(criti.fusion_prev_weight(), 0.25f);
  EXPECT_THAT(error("sliminfer", {"layers=4,29", "budgets=64,32"}), HasSubstr("pruning.sliminfer.layers[1]"));
  EXPECT_THAT(error("sliminfer", {"layers=4", "budgets=64,32"}), HasSubstr("pruning.sliminfer.budgets: has 2"));
  EXPECT_THAT(error("sliminfer", {"budgets=64"}), HasSubstr("pruning.sliminfer.layers: required with budgets"));
  EXPECT_THAT(error("sliminfer", {"layers=4,8", "budgets=32,64"}), HasSubstr("pruning.sliminfer.budgets[1]"));
  EXPECT_THAT(error("sliminfer", {"block_size=60"}), HasSubstr("pruning.sliminfer.block_size"));
  EXPECT_THAT(error("sliminfer", {"gamma=1.5"}), HasSubstr("pruning.sliminfer.gamma"));
  EXPECT_THAT(error("sliminfer", {"window=0"}), HasSubstr("pruning.sliminfer.window"));
  // The paper's LLaMA-3.1-8B schedule for a 32-layer model with a 128k context:
  // absolute budgets, not a share of the trained context.
  ModelConfig c32 = Layers(32);
  c32.n_ctx = 131072;
  const pruneserve::v1::SlimInfer slim = AsProto(StrategyDefaults::ForModel(c32)->Get("sliminfer")).sliminfer();
  EXPECT_THAT(slim.layers(), ElementsAre(10, 20, 30));
  EXPECT_THAT(slim.budgets(), ElementsAre(8192, 4096, 2048));
  // Its Qwen2.5-7B schedule for Qwen2 models, placed by depth (24 layers: 9/28, 18/28, 26/28).
  ModelConfig qwen = Layers(24);
  qwen.arch = Arch::kQwen2;
  qwen.n_ctx = 32768;
  const pruneserve::v1::SlimInfer slim_qwen = AsProto(StrategyDefaults::ForModel(qwen)->Get("sliminfer")).sliminfer();
  EXPECT_THAT(slim_qwen.layers(), ElementsAre(8, 15, 22));
  EXPECT_THAT(slim_qwen.budgets(), ElementsAre(12288, 6144, 4096));
  EXPECT_EQ(slim.block_size(), 64u);
  EXPECT_EQ(slim.unit_size(), 8u);
  EXPECT_EQ(slim.window(), 4u);
  EXPECT_FLOAT_EQ(slim.gamma(), 0.9f);
  EXPECT_THAT(error("full", {"top_k=4"}), HasSubstr("full has no parameters"));
  EXPECT_FALSE(FindStrategy("h2o").ok());
}

// Every field of every strategy's message is bound to its parameters, both ways: a
// message with each field set (LazyLLM's `preset` aside: it names a schedule, it is
// not one) comes back whole from the parameters; values too large for an int are
// errors naming the field.
TEST(PruningParams, EveryMessageFieldIsReadAndWrittenBack) {
  using google::protobuf::FieldDescriptor;
  const absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(Layers(30));
  ASSERT_TRUE(d.ok()) << d.status();
  for (const StrategyInfo* s : Strategies()) {
    SCOPED_TRACE(s->name);
    const absl::StatusOr<PruningParams> p = d->Get(s->name);
    ASSERT_TRUE(p.ok());
    if (p->params == nullptr) continue;
    pruneserve::v1::PruningConfig in;
    absl::StatusOr<google::protobuf::Message*> msg = SelectStrategy(s->name, &in);
    ASSERT_TRUE(msg.ok()) << msg.status();
    const google::protobuf::Descriptor& desc = *(*msg)->GetDescriptor();
    const google::protobuf::Reflection& r = *(*msg)->GetReflection();
    for (int i = 0; i < desc.field_count(); ++i) {
      const FieldDescriptor* f = desc.field(i);
      if (f->name() == "preset") continue;
      for (int k = 0; k < (f->is_repeated() ? 2 : 1); ++k) {  // distinct values: 7 and 8, 0.25 and 0.5
        switch (f->cpp_type()) {
          case FieldDescriptor::CPPTYPE_UINT32:
            f->is_repeated() ? r.AddUInt32(*msg, f, 7 + k) : r.SetUInt32(*msg, f, 7 + i);
            break;
          case FieldDescriptor::CPPTYPE_FLOAT:
            f->is_repeated() ? r.AddFloat(*msg, f, 0.25f * (k + 1)) : r.SetFloat(*msg, f, 0.125f * (i + 1));
            break;
          case FieldDescriptor::CPPTYPE_BOOL: r.SetBool(*msg, f, true); break;
          default: ADD_FAILURE() << f->full_name() << ": a type the parameters do not bind";
        }
      }
    }
    std::unique_ptr<StrategyParams> merged = p->params->Clone();
    ASSERT_TRUE(merged->Merge(**msg, "pruning").ok());
    pruneserve::v1::PruningConfig out;
    absl::StatusOr<google::protobuf::Message*> back = SelectStrategy(s->name, &out);
    ASSERT_TRUE(back.ok());
    merged->ToProto(*back);
    EXPECT_EQ(out.DebugString(), in.DebugString());
    // A uint32 beyond an int, in each integer field: an error naming it.
    for (int i = 0; i < desc.field_count(); ++i) {
      const FieldDescriptor* f = desc.field(i);
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_UINT32) continue;
      pruneserve::v1::PruningConfig big;
      google::protobuf::Message* m = *SelectStrategy(s->name, &big);
      f->is_repeated() ? m->GetReflection()->AddUInt32(m, f, 3000000000u)
                       : m->GetReflection()->SetUInt32(m, f, 3000000000u);
      if (s->name == "sliminfer" && f->name() == "budgets") {  // given with its layers
        m->GetReflection()->AddUInt32(m, desc.FindFieldByName("layers"), 3);
      }
      const absl::Status st = p->params->Clone()->Merge(*m, "pruning");
      EXPECT_THAT(
          std::string(st.message()),
          HasSubstr(absl::StrCat("pruning.", f->name(), f->is_repeated() ? "[0]" : "", ": 3000000000 is too large")))
          << st;
    }
  }
}

// auto's pick: at the longest measured length whose shortest prompt is not above the
// prompt, the fastest strategy (at least min_speedup) whose score is inside full's interval
// and which lost no task.
TEST(Auto, PicksTheFastestStrategyInsideFullsInterval) {
  const AutoTable table{
      .lengths = {{.length = 4096,
                   .from_tokens = 4000,
                   .strategies = {{.name = "full", .score = 0.9, .lo = 0.8, .hi = 0.97, .speedup = 1},
                                  {.name = "lazyllm", .score = 0.85, .lo = 0.7, .hi = 0.9, .speedup = 1.5},
                                  {.name = "gemfilter", .score = 0.5, .lo = 0.3, .hi = 0.7, .speedup = 2.5}}},
                  {.length = 16384,
                   .from_tokens = 16290,
                   .strategies = {{.name = "full", .score = 0.8, .lo = 0.6, .hi = 0.9, .speedup = 1},
                                  {.name = "lazyllm", .score = 0.7, .lo = 0.5, .hi = 0.8, .speedup = 1.6},
                                  {.name = "gemfilter", .score = 0.65, .lo = 0.4, .hi = 0.8, .speedup = 2.4},
                                  {.name = "critiprefill", .score = 0.75, .lo = 0.5, .hi = 0.9, .speedup = 1.05}}}}};
  auto all = [](const std::string&) { return true; };
  EXPECT_EQ(AutoChoice(table, 1000, 1.1f, all), "full") << "shorter than every measured length";
  EXPECT_EQ(AutoChoice(table, 8000, 1.1f, all), "lazyllm") << "gemfilter is faster but lost the answer";
  EXPECT_EQ(AutoChoice(table, 3999, 1.1f, all), "full") << "shorter than the 4k row's shortest prompt";
  EXPECT_EQ(AutoChoice(table, 4005, 1.1f, all), "lazyllm") << "a 4k prompt a little short of 4096 takes the 4k row";
  EXPECT_EQ(AutoChoice(table, 16293, 1.1f, all), "gemfilter") << "the 16k row from its shortest prompt";
  EXPECT_EQ(AutoChoice(table, 40000, 1.1f, all), "gemfilter") << "the 16k row: both inside full's interval";
  EXPECT_EQ(AutoChoice(table, 40000, 2.5f, all), "full") << "none fast enough";
  EXPECT_EQ(AutoChoice(table, 40000, 1.1f, [](const std::string& s) { return s != "gemfilter"; }), "lazyllm")
      << "a strategy the server cannot serve is passed over";
  EXPECT_EQ(AutoChoice(AutoTable{}, 40000, 1.1f, all), "full");
  AutoTable lost = table;
  lost.lengths[1].strategies[2].loses = {"niah_multikey"};
  EXPECT_EQ(AutoChoice(lost, 40000, 1.1f, all), "lazyllm") << "gemfilter's pooled score is inside, but it lost a task";
  const absl::StatusOr<AutoTable> parsed = AutoTableFromJson(
      R"({"model": "m", "lengths": [{"length": 4096, "strategies": [{"name": "full", "score": 0.9, "lo": 0.8,)"
      R"( "hi": 0.97, "speedup": 1.0, "n": 140}, {"name": "gemfilter", "score": 0.9, "lo": 0.8, "hi": 0.97,)"
      R"( "speedup": 2.0, "n": 140, "loses": ["qa", "vt"]}]}]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->lengths[0].strategies[0].n, 140);
  EXPECT_TRUE(parsed->lengths[0].strategies[0].loses.empty()) << "without loses: none";
  EXPECT_THAT(parsed->lengths[0].strategies[1].loses, ::testing::ElementsAre("qa", "vt"));
  EXPECT_EQ(AutoChoice(*parsed, 5000, 1.1f, all), "full") << "the file's loses honoured";
  EXPECT_EQ(parsed->lengths[0].from_tokens, 4096) << "without from_tokens: the length";
  EXPECT_FALSE(AutoTableFromJson(R"({"lengths": [{"length": 4, "from_tokens": 3, "strategies": []},)"
                                 R"( {"length": 8, "from_tokens": 3, "strategies": []}]})")
                   .ok())
      << "from_tokens ascending";
  EXPECT_FALSE(
      AutoTableFromJson(R"({"lengths": [{"length": 8, "strategies": []}, {"length": 4, "strategies": []}]})").ok())
      << "lengths ascending";
  // Without a table auto is unavailable, saying what it needs.
  const absl::StatusOr<PruningParams> p = StrategyDefaults::ForModel(Layers(30))->Get("auto");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->params->Validate(Layers(30), "pruning.auto").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Pod, GateAndMergeOnHandBuiltNumbers) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_FLOAT_EQ(ProximalGate(std::log(3.0f), 0.0f), 0.75f);
  EXPECT_FLOAT_EQ(ProximalGate(0.0f, -inf), 1.0f) << "no distant keys";
  EXPECT_FLOAT_EQ(ProximalGate(2.0f, 2.0f), 0.5f);
  // Two rows of two heads of two values; row 1's log-sum-exps in the middle of a wider array.
  std::vector<float> o_p = {1, 1, 2, 2, /**/ 0, 0, 4, 4};
  const std::vector<float> o_d = {3, 3, 0, 0, /**/ 8, 8, 4, 4};
  const std::vector<float> lse_p = {std::log(3.0f), 0, 9, 0, 5, 9}, lse_d = {0, -inf, 9, std::log(3.0f), 5, 9};
  ThreadPool pool(1);
  CpuBackend(pool).MergeByGate(2, 2, 2, o_p.data(), 4, o_d.data(), 4, lse_p.data(), lse_d.data(), 3);
  // g = 0.75, 1, 0.25, 0.5.
  EXPECT_THAT(o_p, ::testing::Pointwise(::testing::FloatNear(1e-6f), std::vector<float>{1.5f, 1.5f, 2, 2, 6, 6, 4, 4}));
}

TEST(SlimInfer, UnitMeansBlockScoresAndOverlapOnHandBuiltInputs) {
  // Keys (1, 3) (3, 5) | (0, 0) (4, 4) | (7, -1) summed per unit of 2 (the third has
  // one row), and a unit no row reached.
  const std::vector<float> sums = {4, 8, 4, 4, 7, -1, 0, 0};
  const std::vector<int32_t> counts = {2, 2, 1, 0};
  std::vector<float> means = {9};  // overwritten, not appended to
  UnitMeans(sums, counts, 2, &means);
  EXPECT_THAT(means, ElementsAre(2, 4, 2, 2, 7, -1, 0, 0));
  // Two KV heads of size 2, two query heads each; three units, two per block.
  const AttentionShape shape{.n_heads = 4, .n_kv_heads = 2, .head_dim = 2, .scale = 1};
  const std::vector<float> q = {1, 0, 1, 0, /**/ 0, 1, 0, -1};  // heads 0-1 ask (1, 0); 2 (0, 1), 3 (0, -1)
  const std::vector<float> units = {4, 0, 8, 8, /**/ 2, 0, 0, 6, /**/ -4, 0, 0, 0};
  // Unit 0: heads 0-1 give 4 each, heads 2-3 cancel: mean 2. Unit 1: 2, 2, 6, -6: 1.
  // Unit 2: -4, -4, 0, 0: -2. Block 0 = max(2, 1), block 1 = -2 (its only unit).
  EXPECT_THAT(BlockScores(q, units, 2, shape), ElementsAre(2, -2));
  const std::vector<char> active = {1, 0, 1, 1, 0, 0};
  EXPECT_DOUBLE_EQ(ActiveOverlap(std::vector<int32_t>{0, 2, 3, 5}, active), 0.75);
  EXPECT_DOUBLE_EQ(ActiveOverlap(std::vector<int32_t>{1, 4}, active), 0.0);
  EXPECT_DOUBLE_EQ(ActiveOverlap(std::vector<int32_t>{}, active), 1.0);
}

}  // namespace
}  // namespace ps
