#include "tests/engine/tiny_model.h"

#include <functional>
#include <random>

#include "base/fp16.h"
#include "gtest/gtest.h"

namespace ps::testing {
namespace {

std::vector<float> Random(const std::string& name, size_t n, float scale, float offset = 0) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(name)));  // seeded per tensor name
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = offset + u(rng);
  return v;
}

}  // namespace

std::unique_ptr<TinyModel> MakeTiny(const ModelConfig& c, DType weights,
                                    const std::function<void(std::map<std::string, std::vector<float>>&)>& edit) {
  auto t = std::make_unique<TinyModel>();
  t->config = c;
  auto add = [&](const std::string& name, std::vector<int64_t> dims, float scale, float offset = 0) {
    size_t n = 1;
    for (int64_t d : dims) n *= d;
    t->data[name] = Random(name, n, scale, offset);
  };
  add("token_embd.weight", {c.n_embd, c.n_vocab}, 1.0f);
  add("output.weight", {c.n_embd, c.n_vocab}, 0.3f);
  add("output_norm.weight", {c.n_embd}, 0.2f, 1.0f);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {c.n_embd}, 0.2f, 1.0f);
    add(p + "ffn_norm.weight", {c.n_embd}, 0.2f, 1.0f);
    add(p + "attn_q.weight", {c.n_embd, c.q_dim()}, 0.4f);
    add(p + "attn_k.weight", {c.n_embd, c.kv_dim()}, 0.4f);
    add(p + "attn_v.weight", {c.n_embd, c.kv_dim()}, 0.4f);
    add(p + "attn_output.weight", {c.q_dim(), c.n_embd}, 0.3f);
    add(p + "ffn_gate.weight", {c.n_embd, c.n_ff}, 0.3f);
    add(p + "ffn_up.weight", {c.n_embd, c.n_ff}, 0.3f);
    add(p + "ffn_down.weight", {c.n_ff, c.n_embd}, 0.3f);
    if (c.qkv_bias) {
      add(p + "attn_q.bias", {c.q_dim()}, 0.2f);
      add(p + "attn_k.bias", {c.kv_dim()}, 0.2f);
      add(p + "attn_v.bias", {c.kv_dim()}, 0.2f);
    }
  }
  if (edit) edit(t->data);
  TensorMap tensors;
  for (auto& [name, v] : t->data) {
    std::vector<int64_t> dims;
    const bool vector = name.find("norm") != std::string::npos || name.find("bias") != std::string::npos;
    if (vector) {
      dims = {static_cast<int64_t>(v.size())};
    } else {
      const bool down = name.find("ffn_down") != std::string::npos;
      const bool out = name.find("attn_output") != std::string::npos;
      const int64_t cols = down ? c.n_ff : out ? c.q_dim() : c.n_embd;
      dims = {cols, static_cast<int64_t>(v.size()) / cols};
    }
    if (!vector && weights == DType::kBF16) {
      std::vector<uint16_t>& w = t->bf16[name];
      w.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        w[i] = Fp32ToBf16(v[i]);
        v[i] = Bf16ToFp32(w[i]);
      }
      tensors[name] = TensorRef{.type = DType::kBF16,
                                .dims = dims,
                                .data = reinterpret_cast<const uint8_t*>(w.data()),
                                .nbytes = w.size() * 2};
    } else {
      tensors[name] = TensorRef{.type = DType::kF32,
                                .dims = dims,
                                .data = reinterpret_cast<const uint8_t*>(v.data()),
                                .nbytes = v.size() * 4};
    }
  }
  auto m = Model::Build(c, tensors, nullptr, nullptr);
  EXPECT_TRUE(m.ok()) << m.status();
  if (m.ok()) t->model = std::move(*m);
  return t;
}

ModelConfig BaseConfig() {
  ModelConfig c;
  c.arch = Arch::kLlama;
  c.arch_name = "llama";
  c.n_vocab = 97;
  c.n_embd = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // GQA
  c.head_dim = 16;
  c.n_ff = 96;
  c.n_ctx = 256;
  c.rms_eps = 1e-5f;
  c.rope.n_dims = 16;
  c.rope.freq_base = 10000.0f;
  return c;
}

ModelConfig Qwen2Config(int n_heads, int n_kv_heads, int head_dim) {
  ModelConfig c = BaseConfig();
  c.arch = Arch::kQwen2;
  c.arch_name = "qwen2";
  c.qkv_bias = true;
  c.rope.neox = true;
  c.rope.freq_base = 1000000.0f;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.rope.n_dims = head_dim;
  return c;
}

std::vector<int32_t> Prompt(int n, int vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + 11) % vocab;
  return p;
}

}  // namespace ps::testing
