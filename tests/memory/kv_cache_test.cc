// The paged KV cache gives the same logits as one contiguous block per layer on
// stories260K (whole prompt, token by token, two interleaved sequences), reports a
// full device tier as that one sequence's ResourceExhausted (the others go on),
// and returns every block; a prompt prefilled in chunks gives the logits of one pass.
#include <algorithm>
#include <cmath>

#include "engine/forward.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "memory/kv_cache.h"

namespace ps {
namespace {

const std::string kStories = std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf";

// stories260K with the forward pass on the CPU backend.
class KvCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::Load(kStories)->release(); }
  static void TearDownTestSuite() { delete model_; }

  // Blocks per page of the model's KV (K and V of each KV head).
  static int64_t PerPage() { return 2 * model_->config().n_kv_heads; }
  // A KV cache of `pages` pages of `block_tokens` tokens for the model, no host tier.
  std::unique_ptr<KvCache> Cache(int64_t pages, int block_tokens = 16, DType dtype = DType::kF32) {
    const ModelConfig& c = model_->config();
    auto kv = KvCache::Create(KvCacheOptions{.geometry = {.n_layers = c.n_layers,
                                                          .block_tokens = block_tokens,
                                                          .kv_dim = c.kv_dim(),
                                                          .n_kv_heads = c.n_kv_heads,
                                                          .dtype = dtype},
                                             .device_blocks = pages * PerPage()},
                              backend_);
    EXPECT_TRUE(kv.ok()) << kv.status();
    return std::move(*kv);
  }
  // n prompt tokens (BOS first) and their positions.
  static void Prompt(int n, std::vector<int32_t>* tokens, std::vector<int32_t>* positions) {
    tokens->assign(1, 1);
    positions->assign(1, 0);
    for (int i = 1; i < n; ++i) {
      tokens->push_back(260 + (i * 37) % 250);
      positions->push_back(i);
    }
  }

  static inline Model* model_ = nullptr;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
  Transformer tf_{*model_, backend_};
};

TEST_F(KvCacheTest, SameLogitsAsContiguous) {
  const ModelConfig& c = model_->config();
  std::unique_ptr<KvCache> cache = Cache(64);
  KvCache& paged = *cache;
  KvCacheManager& manager = paged.manager();
  std::unique_ptr<KvCache> flat = Cache(c.n_layers, c.n_ctx);  // one page per layer: contiguous
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 40; ++i) prompt.push_back(300 + (i * 17) % 150);  // 41 tokens: 3 pages per layer
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);

  ForwardOutput a, b;
  SeqInput whole{.seq_id = 1, .tokens = prompt, .positions = pos, .all_logits = true};
  ASSERT_TRUE(tf_.Forward({&whole, 1}, *flat, &a).ok() && a.status[0].ok());
  ASSERT_TRUE(tf_.Forward({&whole, 1}, paged, &b).ok() && b.status[0].ok());
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t i = 0; i < a.logits.size(); ++i) ASSERT_NEAR(a.logits[i], b.logits[i], 1e-4f) << i;
  EXPECT_EQ(manager.UsedBlocks(Tier::kDevice), 3 * c.n_layers * PerPage());

  // Token by token, sequence 2 interleaved with sequence 3 in the same batches.
  for (size_t i = 0; i < prompt.size(); ++i) {
    SeqInput s2{.seq_id = 2, .tokens = {&prompt[i], 1}, .positions = {&pos[i], 1}};
    SeqInput s3{.seq_id = 3, .tokens = {&prompt[i], 1}, .positions = {&pos[i], 1}};
    SeqInput both[2] = {s2, s3};
    ASSERT_TRUE(tf_.Forward(both, paged, &b).ok() && b.status[0].ok() && b.status[1].ok());
    for (int v = 0; v < c.n_vocab; ++v) {
      ASSERT_NEAR(b.Row(0, 0, c.n_vocab)[v], a.Row(0, static_cast<int64_t>(i), c.n_vocab)[v], 1e-4f) << i;
      ASSERT_NEAR(b.Row(1, 0, c.n_vocab)[v], a.Row(0, static_cast<int64_t>(i), c.n_vocab)[v], 1e-4f) << i;
    }
  }
  EXPECT_TRUE(manager.VerifyIntegrity().ok()) << manager.VerifyIntegrity();
  EXPECT_EQ(manager.UsedBlocks(Tier::kDevice), 9 * c.n_layers * PerPage());

  // A fourth sequence does not fit: its value, and the sequence beside it in the
  // batch, and the other sequences, are intact.
  std::vector<int32_t> long_prompt(16 * 20, 300), long_pos(16 * 20);
  for (size_t i = 0; i < long_pos.size(); ++i) long_pos[i] = static_cast<int32_t>(i);
  SeqInput big{.seq_id = 4, .tokens = long_prompt, .positions = long_pos};
  const int32_t next = 41;
  SeqInput small{.seq_id = 1, .tokens = {&prompt[1], 1}, .positions = {&next, 1}};
  SeqInput pair[2] = {big, small};
  ASSERT_TRUE(tf_.Forward(pair, paged, &b).ok());
  EXPECT_EQ(b.status[0].code(), absl::StatusCode::kResourceExhausted) << b.status[0];
  EXPECT_TRUE(b.status[1].ok()) << b.status[1];
  EXPECT_EQ(b.row_count[1], 1);
  EXPECT_EQ(manager.Table(1, c.n_layers - 1).positions.size(), prompt.size() + 1) << "the small sequence ran through";
  paged.Free(4);
  for (int64_t seq : {1, 2, 3}) paged.Free(seq);
  EXPECT_EQ(manager.UsedBlocks(Tier::kDevice), 0);
  EXPECT_TRUE(manager.VerifyIntegrity().ok()) << manager.VerifyIntegrity();
}

// AppendAll (a layer's appends for a whole batch) stores each sequence's rows where
// Append would: consecutive sequences' rows in one store, and around a sequence that
// does not fit (its status says so; the others' are OK and their rows intact).
TEST_F(KvCacheTest, AppendAllStoresEachSequencesRowsAroundOneThatDoesNotFit) {
  const ModelConfig& c = model_->config();
  std::unique_ptr<KvCache> kv = Cache(4);
  const int64_t kvd = c.kv_dim(), hd = c.head_dim;
  const int64_t counts[] = {3, 16 * 20, 2, 1};  // the second needs 20 pages
  std::vector<std::vector<int32_t>> positions;
  std::vector<KvCache::Rows> rows;
  int64_t total = 0;
  for (int s = 0; s < 4; ++s) {
    positions.emplace_back(counts[s]);
    for (int64_t i = 0; i < counts[s]; ++i) positions[s][i] = static_cast<int32_t>(i);
    rows.push_back({.seq = 10 + s, .positions = positions[s], .row = total});
    total += counts[s];
  }
  std::vector<float> k(total * kvd), v(total * kvd);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  std::vector<absl::Status> status(4);
  kv->AppendAll(/*layer=*/1, rows, k.data(), v.data(), status);
  EXPECT_EQ(status[1].code(), absl::StatusCode::kResourceExhausted) << status[1];
  for (int s : {0, 2, 3}) {
    ASSERT_TRUE(status[s].ok()) << status[s];
    absl::StatusOr<KvRows> view = kv->View(10 + s, 1, nullptr);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_EQ(view->n, counts[s]);
    for (int64_t j = 0; j < counts[s]; ++j) {
      for (int64_t col = 0; col < kvd; col += hd / 2) {
        const int64_t at = (rows[s].row + j) * kvd + col;
        EXPECT_EQ(*static_cast<const float*>(view->k(j, col)), k[at]) << "sequence " << s << " row " << j;
        EXPECT_EQ(*static_cast<const float*>(view->v(j, col)), v[at]) << "sequence " << s << " row " << j;
      }
    }
  }
  for (int s = 0; s < 4; ++s) kv->Free(10 + s);
  EXPECT_EQ(kv->manager().UsedBlocks(Tier::kDevice), 0);
}

// Chunked prefill: a 300-token prompt fed in chunks of 64 (each chunk attending to
// the KV of the chunks before it) gives the logits of one whole-prompt pass.
TEST_F(KvCacheTest, PrefillInChunksOf64GivesTheLogitsOfOneChunk) {
  const ModelConfig& c = model_->config();
  std::unique_ptr<KvCache> cache = Cache(2 * 19 * c.n_layers);
  KvCache& kv = *cache;
  KvCacheManager& manager = kv.manager();
  std::vector<int32_t> prompt, pos;
  Prompt(300, &prompt, &pos);
  ForwardOutput whole, part;
  SeqInput one{.seq_id = 1, .tokens = prompt, .positions = pos, .all_logits = true};
  ASSERT_TRUE(tf_.Forward({&one, 1}, kv, &whole).ok() && whole.status[0].ok());
  float worst = 0;
  for (size_t begin = 0; begin < prompt.size(); begin += 64) {
    const size_t n = std::min<size_t>(64, prompt.size() - begin);
    SeqInput chunk{.seq_id = 2,
                   .tokens = std::span<const int32_t>(prompt).subspan(begin, n),
                   .positions = std::span<const int32_t>(pos).subspan(begin, n),
                   .all_logits = true};
    ASSERT_TRUE(tf_.Forward({&chunk, 1}, kv, &part).ok() && part.status[0].ok());
    ASSERT_EQ(part.row_count[0], static_cast<int64_t>(n));
    for (size_t r = 0; r < n; ++r) {
      for (int v = 0; v < c.n_vocab; ++v) {
        const float d = std::fabs(part.Row(0, static_cast<int64_t>(r), c.n_vocab)[v] -
                                  whole.Row(0, static_cast<int64_t>(begin + r), c.n_vocab)[v]);
        worst = std::max(worst, d);
      }
    }
  }
  EXPECT_LT(worst, 1e-4f);
  EXPECT_EQ(manager.Table(1, 0).positions, manager.Table(2, 0).positions);
  EXPECT_TRUE(manager.VerifyIntegrity().ok()) << manager.VerifyIntegrity();
}

// Half-precision KV: the same prompt and 40 greedy steps with F16 and BF16 blocks
// stay close to the F32 cache (the rounding of K and V is the only difference).
TEST_F(KvCacheTest, HalfPrecisionKvStaysCloseToF32) {
  const ModelConfig& c = model_->config();
  std::vector<int32_t> prompt, pos;
  Prompt(100, &prompt, &pos);
  // Logits of the prompt (all rows) and the greedy continuation, for one KV type.
  auto run = [&](DType dtype, std::vector<int32_t>* tokens) {
    std::unique_ptr<KvCache> cache = Cache(10 * c.n_layers, 16, dtype);
    KvCache& kv = *cache;
    ForwardOutput out;
    SeqInput in{.seq_id = 1, .tokens = prompt, .positions = pos, .all_logits = true};
    EXPECT_TRUE(tf_.Forward({&in, 1}, kv, &out).ok() && out.status[0].ok());
    std::vector<float> logits = out.logits;
    for (int step = 0; step < 40; ++step) {
      const auto row = out.Row(0, out.row_count[0] - 1, c.n_vocab);
      const int32_t next = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      tokens->push_back(next);
      const int32_t p = static_cast<int32_t>(prompt.size()) + step;
      SeqInput d{.seq_id = 1, .tokens = {&next, 1}, .positions = {&p, 1}};
      EXPECT_TRUE(tf_.Forward({&d, 1}, kv, &out).ok() && out.status[0].ok());
    }
    return logits;
  };
  std::vector<int32_t> want_tokens;
  const std::vector<float> want = run(DType::kF32, &want_tokens);
  for (auto [dtype, tolerance] : {std::pair{DType::kF16, 0.05f}, std::pair{DType::kBF16, 0.4f}}) {
    std::vector<int32_t> tokens;
    const std::vector<float> got = run(dtype, &tokens);
    float worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    std::printf("%s KV: max |logit diff| over the prompt %.5f\n", std::string(DTypeName(dtype)).c_str(), worst);
    EXPECT_LT(worst, tolerance) << DTypeName(dtype);
    EXPECT_EQ(tokens, want_tokens) << DTypeName(dtype);
  }
}

// A Q8_0 KV takes whole blocks of 32 values per head: stories260K's heads of 8 are
// refused with the reason; heads of 32 are taken.
TEST_F(KvCacheTest, Q8KvNeedsHeadsOfWholeBlocks) {
  const ModelConfig& c = model_->config();
  auto make = [&](int kv_dim, int n_kv_heads) {
    return KvCache::Create(
        KvCacheOptions{
            .geometry = {.n_layers = c.n_layers, .kv_dim = kv_dim, .n_kv_heads = n_kv_heads, .dtype = DType::kQ8_0},
            .device_blocks = 64},
        backend_);
  };
  const absl::Status refused = make(c.kv_dim(), c.n_kv_heads).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("multiple of 32"), std::string::npos) << refused;
  EXPECT_TRUE(make(64, 2).ok());
}

}  // namespace
}  // namespace ps
