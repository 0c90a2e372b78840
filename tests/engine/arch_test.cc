// Architecture coverage on tiny random models built in memory: the engine's logits
// against a plain double-precision reference written here, and batch vs
// token-by-token equality.
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "engine/forward.h"
#include "gtest/gtest.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/test_util.h"
#include "tests/engine/tiny_model.h"

namespace ps {
namespace {

using testing::BaseConfig;
using testing::MakeTiny;
using testing::Prompt;
using testing::TinyModel;

// Double-precision reference forward over the whole prompt: logits [T, vocab].
std::vector<std::vector<double>> Reference(const TinyModel& t, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = t.config;
  const int T = static_cast<int>(tokens.size());
  const int d = c.n_embd, hd = c.head_dim;
  auto W = [&](const std::string& n) -> const std::vector<float>& { return t.data.at(n); };
  auto matvec = [](const std::vector<float>& w, const std::vector<double>& x, int rows) {
    const int cols = static_cast<int>(x.size());
    std::vector<double> y(rows, 0.0);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < cols; ++k) y[r] += static_cast<double>(w[static_cast<size_t>(r) * cols + k]) * x[k];
    return y;
  };
  auto rmsnorm = [&](const std::vector<double>& x, const std::vector<float>& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / x.size() + c.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int n_heads, int pos) {
    const int nd = c.rope.n_dims, half = nd / 2;
    for (int h = 0; h < n_heads; ++h) {
      for (int i = 0; i < half; ++i) {
        double theta = pos * std::pow(static_cast<double>(c.rope.freq_base), -2.0 * i / nd);
        if (!c.rope.freq_factors.empty()) theta /= c.rope.freq_factors[i];
        theta *= c.rope.freq_scale;
        const int a = h * hd + (c.rope.neox ? i : 2 * i), b = h * hd + (c.rope.neox ? i + half : 2 * i + 1);
        const double x0 = v[a], x1 = v[b];
        v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
        v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
      }
    }
  };
  std::vector<std::vector<double>> x(T, std::vector<double>(d));
  for (int i = 0; i < T; ++i)
    for (int k = 0; k < d; ++k) x[i][k] = W("token_embd.weight")[static_cast<size_t>(tokens[i]) * d + k];
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int i = 0; i < T; ++i) {
      const auto xn = rmsnorm(x[i], W(p + "attn_norm.weight"));
      q[i] = matvec(W(p + "attn_q.weight"), xn, c.q_dim());
      k[i] = matvec(W(p + "attn_k.weight"), xn, c.kv_dim());
      v[i] = matvec(W(p + "attn_v.weight"), xn, c.kv_dim());
      if (c.qkv_bias) {
        for (int j = 0; j < c.q_dim(); ++j) q[i][j] += W(p + "attn_q.bias")[j];
        for (int j = 0; j < c.kv_dim(); ++j) k[i][j] += W(p + "attn_k.bias")[j], v[i][j] += W(p + "attn_v.bias")[j];
      }
      rope(q[i], c.n_heads, i);
      rope(k[i], c.n_kv_heads, i);
    }
    for (int i = 0; i < T; ++i) {
      std::vector<double> att(c.q_dim(), 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int kvh = h / (c.n_heads / c.n_kv_heads);
        std::vector<double> s(i + 1);
        double m = -1e300;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += q[i][h * hd + e] * k[j][kvh * hd + e];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < hd; ++e) att[h * hd + e] += s[j] / sum * v[j][kvh * hd + e];
      }
      const auto o = matvec(W(p + "attn_output.weight"), att, d);
      for (int e = 0; e < d; ++e) x[i][e] += o[e];
      const auto xn = rmsnorm(x[i], W(p + "ffn_norm.weight"));
      auto g = matvec(W(p + "ffn_gate.weight"), xn, c.n_ff);
      const auto u = matvec(W(p + "ffn_up.weight"), xn, c.n_ff);
      for (int e = 0; e < c.n_ff; ++e) g[e] = g[e] / (1 + std::exp(-g[e])) * u[e];
      const auto down = matvec(W(p + "ffn_down.weight"), g, d);
      for (int e = 0; e < d; ++e) x[i][e] += down[e];
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int i = 0; i < T; ++i) logits[i] = matvec(W("output.weight"), rmsnorm(x[i], W("output_norm.weight")), c.n_vocab);
  return logits;
}

void CheckAgainstReference(const ModelConfig& c) {
  auto t = MakeTiny(c);
  ASSERT_NE(t->model, nullptr);
  const auto prompt = Prompt(40, c.n_vocab);  // > one attention query tile
  const auto ref = Reference(*t, prompt);
  ThreadPool pool(2);
  CpuBackend backend(pool);
  Transformer tf(*t->model, backend);
  std::vector<int32_t> pos(prompt.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);

  // (a) whole prompt in one batch, logits at every position
  std::unique_ptr<KvCache> kv = *OfflineKvCache(*t->model, backend, c.n_ctx, 16, DType::kF32);
  SeqInput in{.seq_id = 1, .tokens = prompt, .positions = pos, .all_logits = true};
  ForwardOutput batch;
  ASSERT_TRUE(tf.Forward({&in, 1}, *kv, &batch).ok());
  ASSERT_TRUE(batch.status[0].ok()) << batch.status[0];
  double worst = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    double scale = 1e-6;
    for (double v : ref[i]) scale = std::max(scale, std::fabs(v));
    const auto got = batch.Row(0, static_cast<int64_t>(i), c.n_vocab);
    for (int v = 0; v < c.n_vocab; ++v) worst = std::max(worst, std::fabs(got[v] - ref[i][v]) / scale);
  }
  EXPECT_LT(worst, 1e-4) << "relative logit error vs the double reference";

  // (b) one token at a time
  std::unique_ptr<KvCache> kv2 = *OfflineKvCache(*t->model, backend, c.n_ctx, 16, DType::kF32);
  ForwardOutput step;
  for (size_t i = 0; i < prompt.size(); ++i) {
    SeqInput s{.seq_id = 2, .tokens = {&prompt[i], 1}, .positions = {&pos[i], 1}};
    ASSERT_TRUE(tf.Forward({&s, 1}, *kv2, &step).ok());
    ASSERT_TRUE(step.status[0].ok()) << step.status[0];
    const auto a = step.Row(0, 0, c.n_vocab);
    const auto b = batch.Row(0, static_cast<int64_t>(i), c.n_vocab);
    for (int v = 0; v < c.n_vocab; ++v) EXPECT_NEAR(a[v], b[v], 1e-4 * (1 + std::fabs(b[v]))) << "pos " << i;
  }
}

TEST(ArchTest, LlamaWithGqa) { CheckAgainstReference(BaseConfig()); }

TEST(ArchTest, Llama3RopeScaling) {
  ModelConfig c = BaseConfig();
  c.rope.freq_base = 500000.0f;
  c.rope.freq_factors = Llama3FreqFactors(c.rope.n_dims, c.rope.freq_base, 8.0f, 1.0f, 4.0f, 64);
  ASSERT_EQ(c.rope.freq_factors.size(), 8u);
  EXPECT_FLOAT_EQ(c.rope.freq_factors.front(), 1.0f);  // high frequency: unscaled
  EXPECT_FLOAT_EQ(c.rope.freq_factors.back(), 8.0f);   // low frequency: scaled by the factor
  CheckAgainstReference(c);
}

TEST(ArchTest, LinearRopeScalingAndPartialRope) {
  ModelConfig c = BaseConfig();
  c.rope.freq_scale = 0.25f;
  c.rope.n_dims = 8;  // rotate half of each head
  CheckAgainstReference(c);
}

TEST(ArchTest, Qwen2WithBiasAndNeoxRope) { CheckAgainstReference(testing::Qwen2Config(6, 2, 8)); }

// model.h's bk_shift: minus the k bias's rotations averaged over the trained context's
// positions (here in doubles, pair by pair); none without a k bias.
TEST(ArchTest, KeyShiftIsMinusTheMeanRotationOfTheKeyBias) {
  const ModelConfig c = testing::Qwen2Config(4, 2, 32);
  auto t = MakeTiny(c);
  ASSERT_NE(t->model, nullptr);
  const int half = c.rope.n_dims / 2;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::vector<float>& bias = t->data.at("blk." + std::to_string(l) + ".attn_k.bias");
    const std::vector<float>& shift = t->model->layers[l].bk_shift;
    ASSERT_EQ(shift.size(), bias.size());
    for (int h = 0; h < c.n_kv_heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const int a = h * c.head_dim + i, b = a + half;  // NeoX pairs
        double mean_a = 0, mean_b = 0;
        for (int p = 0; p < c.n_ctx; ++p) {
          const double angle = p * std::pow(static_cast<double>(c.rope.freq_base), -2.0 * i / c.rope.n_dims);
          mean_a += (bias[a] * std::cos(angle) - bias[b] * std::sin(angle)) / c.n_ctx;
          mean_b += (bias[a] * std::sin(angle) + bias[b] * std::cos(angle)) / c.n_ctx;
        }
        EXPECT_NEAR(shift[a], -mean_a, 1e-5) << "layer " << l << " head " << h << " pair " << i;
        EXPECT_NEAR(shift[b], -mean_b, 1e-5) << "layer " << l << " head " << h << " pair " << i;
      }
    }
  }
  auto llama = MakeTiny(BaseConfig());
  ASSERT_NE(llama->model, nullptr);
  for (const LayerWeights& w : llama->model->layers) EXPECT_TRUE(w.bk_shift.empty());
}

// Qwen2 with a large k bias in its slowest pairs, as Qwen2.5's (up to +-210 against a
// spread of 1-2), and the logits of a 40-token prompt over a `kv_type` cache.
class LargeKeyBiasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int half = c_.rope.n_dims / 2;
    t_ = MakeTiny(c_, DType::kF32, [&](std::map<std::string, std::vector<float>>& data) {
      for (int l = 0; l < c_.n_layers; ++l) {
        std::vector<float>& bias = data.at("blk." + std::to_string(l) + ".attn_k.bias");
        for (int h = 0; h < c_.n_kv_heads; ++h) {
          for (int i = half - 4; i < half; ++i) {  // angles below 0.01 rad over the context
            bias[h * c_.head_dim + i] = (i % 2 == 0 ? 100.0f : -80.0f) * (l + 1);
            bias[h * c_.head_dim + i + half] = (h == 0 ? 90.0f : -120.0f);
          }
        }
      }
    });
    ASSERT_NE(t_->model, nullptr);
  }
  std::vector<float> Logits(DType kv_type, PruningStrategy* strategy = nullptr) {
    const auto prompt = Prompt(40, c_.n_vocab);
    std::vector<int32_t> pos(prompt.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    Transformer tf(*t_->model, backend_);
    std::unique_ptr<KvCache> kv = *OfflineKvCache(*t_->model, backend_, c_.n_ctx, 16, kv_type);
    SeqInput in{.seq_id = 1, .tokens = prompt, .positions = pos, .all_logits = true, .strategy = strategy};
    ForwardOutput out;
    EXPECT_TRUE(tf.Forward({&in, 1}, *kv, &out).ok());
    EXPECT_TRUE(out.status[0].ok()) << out.status[0];
    return out.logits;
  }
  void ClearShifts() {
    for (LayerWeights& w : t_->model->layers) w.bk_shift.clear();
  }
  static double Worst(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double w = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) w = std::max(w, std::fabs(double{a[i]} - b[i]));
    return w;
  }

  const ModelConfig c_ = testing::Qwen2Config(4, 2, 32);
  std::unique_ptr<TinyModel> t_;
  ThreadPool pool_{2};
  CpuBackend backend_{pool_};
};

// The shift leaves an F32 cache's logits as they were (every query's scores move alike)
// and keeps an 8-bit cache's near them, which the bias alone would not.
TEST_F(LargeKeyBiasTest, KeyShiftKeepsTheBiasOutOfAnEightBitCache) {
  const std::vector<float> f32 = Logits(DType::kF32);
  const double shifted = Worst(Logits(DType::kQ8_0), f32);
  ClearShifts();
  const std::vector<float> f32_unshifted = Logits(DType::kF32);
  EXPECT_LT(Worst(f32_unshifted, f32), 1e-3);
  const double unshifted = Worst(Logits(DType::kQ8_0), f32_unshifted);
  EXPECT_LT(shifted * 4, unshifted) << "Q8_0 against F32, largest logit error: " << shifted << " with the shift, "
                                    << unshifted << " without";
  std::printf("Q8_0 cache against F32, largest logit error: %.4f with the shift, %.4f without\n", shifted, unshifted);
}

// PoD's gate weighs log-sum-exps of two layers, whose keys' shifts differ: taken back
// off (engine/shared_attention.h), they leave PoD's logits as without the shift.
TEST_F(LargeKeyBiasTest, KeyShiftLeavesPodsGateAsItWas) {
  const PruningParams pod = testing::Strategy(c_, "pod", {"sinks=4", "recent=8"});
  const std::vector<float> shifted = Logits(DType::kF32, pod.Make(c_).get());
  const std::vector<float> dense = Logits(DType::kF32);
  EXPECT_GT(Worst(shifted, dense), 1e-2) << "layer 1 scores its distant keys with layer 0's";
  ClearShifts();
  EXPECT_LT(Worst(Logits(DType::kF32, pod.Make(c_).get()), shifted), 1e-3);
}

// A backend that records the models whose weights it was told it gets.
class ModelRecordingBackend final : public testing::GuardedBackend {
 public:
  using GuardedBackend::GuardedBackend;
  void UseWeightsOf(uint64_t model_id) override {
    models.push_back(model_id);
    GuardedBackend::UseWeightsOf(model_id);
  }
  std::vector<uint64_t> models;
};

// Two models built alike, one freed before the other is built (so it may take the same
// addresses), are told apart by the backend: a GPU's weight copies are not reused.
TEST(ArchTest, EachModelHasItsOwnIdentityForTheBackend) {
  ThreadPool pool(1);
  CpuBackend cpu(pool);
  ModelRecordingBackend backend(cpu);
  uint64_t first_id = 0;
  {
    auto first = MakeTiny(BaseConfig());
    first_id = first->model->id();
    Transformer tf(*first->model, backend);
  }
  auto second = MakeTiny(BaseConfig());
  EXPECT_NE(second->model->id(), first_id);
  ASSERT_TRUE(PrepareWeights(*second->model, backend).ok());
  Transformer tf(*second->model, backend);
  EXPECT_EQ(backend.models, (std::vector<uint64_t>{first_id, second->model->id(), second->model->id()}));
}

}  // namespace
}  // namespace ps
