// Hugging Face folders (config.json + safetensors + tokenizer.json): a tiny model
// written here loads, tokenises, and computes the same logits as the same weights
// in GGUF layout (q/k rows permuted as llama.cpp's converter does, normal RoPE).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "base/fp16.h"
#include "engine/forward.h"
#include "engine/generator.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tokenizer/byte_level.h"

namespace ps {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// More embedding rows than the tokenizer has tokens: start-up packs the BF16 table in parts.
constexpr int kVocab = 1100, kEmbd = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kFf = 48, kLayers = 2;

struct HfTensor {
  std::string dtype;           // F32 | F16 | BF16
  std::vector<int64_t> shape;  // HF order [out, in]
  std::vector<float> values;   // exactly representable in dtype
};

void WriteSafetensors(const std::string& path, const std::map<std::string, HfTensor>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == "F32") {
        data.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        const uint16_t h = t.dtype == "F16" ? Fp32ToFp16(v) : Fp32ToBf16(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data 8-byte aligned, as safetensors writes it
  const uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h << data;
}

std::string TinyTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[BytesToUnicodeString(std::string(1, static_cast<char>(b)))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "l l", "he ll"}}}},
            {"added_tokens", {{{"id", 259}, {"content", "<|end|>"}, {"special", true}}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}}}};
  return j.dump();
}

class HfLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test and process: ctest runs the tests of this file in parallel.
    dir_ = fs::path(::testing::TempDir()) /
           ("tiny_hf_model_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    auto make = [&](const std::string& dtype, std::vector<int64_t> shape, float offset = 0) {
      HfTensor t{dtype, shape, {}};
      size_t n = 1;
      for (int64_t d : shape) n *= d;
      for (size_t i = 0; i < n; ++i) {
        float v = offset + u(rng);
        v = dtype == "F16" ? Fp16ToFp32(Fp32ToFp16(v)) : dtype == "BF16" ? Bf16ToFp32(Fp32ToBf16(v)) : v;
        t.values.push_back(v);
      }
      return t;
    };
    hf_["model.embed_tokens.weight"] = make("BF16", {kVocab, kEmbd});
    hf_["model.norm.weight"] = make("F32", {kEmbd}, 1.0f);
    hf_["lm_head.weight"] = make("F16", {kVocab, kEmbd});
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      hf_[p + "input_layernorm.weight"] = make("F32", {kEmbd}, 1.0f);
      hf_[p + "post_attention_layernorm.weight"] = make("F32", {kEmbd}, 1.0f);
      hf_[p + "self_attn.q_proj.weight"] = make("F16", {kHeads * kHeadDim, kEmbd});
      hf_[p + "self_attn.k_proj.weight"] = make("BF16", {kKvHeads * kHeadDim, kEmbd});
      hf_[p + "self_attn.v_proj.weight"] = make("F32", {kKvHeads * kHeadDim, kEmbd});
      hf_[p + "self_attn.o_proj.weight"] = make("F32", {kEmbd, kHeads * kHeadDim});
      hf_[p + "mlp.gate_proj.weight"] = make("F16", {kFf, kEmbd});
      hf_[p + "mlp.up_proj.weight"] = make("F32", {kFf, kEmbd});
      hf_[p + "mlp.down_proj.weight"] = make("BF16", {kEmbd, kFf});
    }
    hf_["model.layers.0.self_attn.rotary_emb.inv_freq"] = make("F32", {kHeadDim / 2});  // ignored buffer
    WriteSafetensors((dir_ / "model.safetensors").string(), hf_);
    json config = {{"model_type", "llama"},        {"vocab_size", kVocab},           {"hidden_size", kEmbd},
                   {"num_hidden_layers", kLayers}, {"num_attention_heads", kHeads},  {"num_key_value_heads", kKvHeads},
                   {"intermediate_size", kFf},     {"max_position_embeddings", 128}, {"rms_norm_eps", 1e-5},
                   {"rope_theta", 10000.0}};
    std::ofstream(dir_ / "config.json") << config.dump();
    std::ofstream(dir_ / "tokenizer.json") << TinyTokenizerJson();
  }

  // GGUF layout of the same weights: llama.cpp's converter permutes q/k rows per
  // head from (half, pair) to (pair, half) so that adjacent-pair RoPE applies.
  std::vector<float> Permuted(const std::vector<float>& w, int heads) {
    std::vector<float> out(w.size());
    const int half = kHeadDim / 2;
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i)
        for (int j = 0; j < 2; ++j)
          std::copy_n(&w[(h * kHeadDim + j * half + i) * kEmbd], kEmbd, &out[(h * kHeadDim + 2 * i + j) * kEmbd]);
    return out;
  }

  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::map<std::string, HfTensor> hf_;
  std::map<std::string, std::vector<float>> gguf_data_;
};

std::vector<float> Logits(const Model& m, const std::vector<int32_t>& tokens) {
  ThreadPool pool(2);
  CpuBackend backend(pool);
  Transformer tf(m, backend);
  std::unique_ptr<KvCache> kv = *OfflineKvCache(m, backend, 128);
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  SeqInput in{.seq_id = 1, .tokens = tokens, .positions = pos, .all_logits = true};
  ForwardOutput out;
  EXPECT_TRUE(tf.Forward({&in, 1}, *kv, &out).ok());
  EXPECT_TRUE(out.status[0].ok()) << out.status[0];
  return out.logits;
}

TEST_F(HfLoaderTest, ReadsTheChatTemplateFileOfTransformers5) {
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}";
  std::ofstream(dir_ / "chat_template.jinja") << chatml;
  auto hf = Model::Load(dir_.string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->tokenizer()->chat_template(), chatml);
}

TEST_F(HfLoaderTest, LoadsAndMatchesGgufLayout) {
  // F32 products on both sides (not BF16 dot products for the folder's BF16 weights), so
  // that the logits agree to float rounding and only a layout error shows.
  ScopedCpuIsa level(std::min(ActiveCpuIsa(), CpuIsa::kAvx512));
  auto hf = Model::Load(dir_.string());
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ((*hf)->config().n_kv_heads, kKvHeads);
  EXPECT_TRUE((*hf)->config().rope.neox);
  const Tokenizer* tok = (*hf)->tokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("hello<|end|>", false, true), (std::vector<int32_t>{258, 'o', 259}));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{258, 'o'}), "hello");

  // The same weights in GGUF naming and layout.
  const std::map<std::string, std::string> names = {{"model.embed_tokens.weight", "token_embd.weight"},
                                                    {"model.norm.weight", "output_norm.weight"},
                                                    {"lm_head.weight", "output.weight"}};
  TensorMap tensors;
  for (const auto& [name, t] : hf_) {
    std::string g;
    if (names.count(name)) {
      g = names.at(name);
    } else if (name.find("rotary") != std::string::npos) {
      continue;
    } else {
      const std::string l = name.substr(13, name.find('.', 13) - 13);
      const std::string rest = name.substr(name.find('.', 13) + 1);
      static const std::map<std::string, std::string> kMap = {
          {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
          {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.o_proj.weight", "attn_output.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
      g = "blk." + l + "." + kMap.at(rest);
    }
    std::vector<float> v = t.values;
    if (g.find("attn_q.weight") != std::string::npos) v = Permuted(v, kHeads);
    if (g.find("attn_k.weight") != std::string::npos) v = Permuted(v, kKvHeads);
    gguf_data_[g] = std::move(v);
    const auto& stored = gguf_data_[g];
    tensors[g] = TensorRef{.type = DType::kF32,
                           .dims = std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()),
                           .data = reinterpret_cast<const uint8_t*>(stored.data()),
                           .nbytes = stored.size() * 4};
  }
  ModelConfig c = (*hf)->config();
  c.rope.neox = false;
  auto gguf = Model::Build(c, tensors, nullptr, nullptr);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const std::vector<int32_t> prompt = {5, 258, 100, 7, 259, 42, 3, 200, 17, 9};
  const auto a = Logits(**hf, prompt), b = Logits(**gguf, prompt);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4f * (1 + std::fabs(b[i])));
}

// Resident kB of this process's mappings of `path` (/proc/self/smaps).
int64_t MappedRssKb(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  int64_t kb = 0;
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    const std::string first = line.substr(0, line.find(' '));
    if (first.empty()) continue;
    if (first.back() != ':') {  // a mapping's first line: its addresses ... its file
      in = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    } else if (in && first == "Rss:") {
      kb += std::stoll(line.substr(first.size()));
    }
  }
  return kb;
}

// On a CPU with BF16 dot products, start-up repacks the BF16 matrices for oneDNN's kernels
// (the F16 and F32 ones stay as they are) and lets their pages of the mapped file go: here
// the tied output matrix, which is the BF16 embedding table (69 KiB, packed in two parts of
// its rows). The logits stay those of the weights read in place, and the embedding's look-ups
// still read the file.
TEST_F(HfLoaderTest, Bf16MatricesAreRepackedAndTheirFilePagesLetGo) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 dot products";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  hf_.erase("lm_head.weight");
  const std::string file = fs::canonical(dir_ / "model.safetensors").string();
  WriteSafetensors(file, hf_);
  auto m = Model::Load(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->output.data, (*m)->tok_embd.data);
  const std::vector<int32_t> prompt = {5, 258, 100, 7, 259, 42, 3, 200, 17, 9};
  const std::vector<float> in_place = Logits(**m, prompt);  // reads every page
  const int64_t before = MappedRssKb(file);

  ThreadPool pool(2);
  CpuBackend backend(pool);
  const absl::StatusOr<size_t> packed = PrepareWeights(**m, backend);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_GT(*packed, 0u);
  EXPECT_NE((*m)->output.packed, nullptr);
  for (const LayerWeights& l : (*m)->layers) {
    EXPECT_NE(l.wk.packed, nullptr);      // BF16
    EXPECT_NE(l.w_down.packed, nullptr);  // BF16
    EXPECT_EQ(l.wq.packed, nullptr);      // F16
    EXPECT_EQ(l.wv.packed, nullptr);      // F32
  }
  const int64_t page_kb = ::sysconf(_SC_PAGESIZE) / 1024;
  EXPECT_LE(MappedRssKb(file), before - 3 * page_kb) << "resident before: " << before << " kB";

  const std::vector<float> repacked = Logits(**m, prompt);
  ASSERT_EQ(repacked.size(), in_place.size());
  for (size_t i = 0; i < repacked.size(); ++i) {
    EXPECT_NEAR(repacked[i], in_place[i], 1e-4f * (1 + std::fabs(in_place[i]))) << i;
  }
}

TEST_F(HfLoaderTest, BrokenFoldersGiveErrors) {
  fs::remove(dir_ / "tokenizer.json");
  EXPECT_FALSE(Model::Load(dir_.string()).ok());
  std::ofstream(dir_ / "tokenizer.json") << TinyTokenizerJson();
  // header length beyond the end of the file
  std::string bytes(16, '\0');
  bytes[0] = static_cast<char>(0xff);
  bytes[1] = static_cast<char>(0xff);
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << bytes;
  auto m = Model::Load(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("header"), std::string::npos) << m.status();
  std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt_neox"})";
  EXPECT_NE(Model::Load(dir_.string()).status().message().find("unsupported architecture"), std::string::npos);
}

// Found by fuzz_hf_config: a field of the wrong type (here model_type) threw out of
// the parser, and sizes of zero passed it (ValidateConfig rejects them).
TEST(HfConfig, WrongTypesAndZeroSizesAreErrors) {
  const absl::StatusOr<ModelConfig> numeric_type = ConfigFromHfJson(R"({"model_type": 10000.0, "hidden_size": 64})");
  ASSERT_FALSE(numeric_type.ok());
  EXPECT_EQ(numeric_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(numeric_type.status().message().find("config.json"), std::string::npos) << numeric_type.status();
  const absl::StatusOr<ModelConfig> zero_heads = ConfigFromHfJson(
      R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
          "num_attention_heads": 0, "num_key_value_heads": 4, "intermediate_size": 172})");
  ASSERT_TRUE(zero_heads.ok()) << zero_heads.status();
  EXPECT_EQ(ValidateConfig(*zero_heads).message(), "model config: sizes must be positive");
}

// Found by fuzz_hf_config: llama3 rope scaling sized its factors from a negative
// head_dim (a negative hidden_size over the heads) before ValidateConfig ran, and
// std::vector threw length_error out of the parser.
TEST(HfConfig, Llama3ScalingWithABadHeadDimIsAnError) {
  const std::string scaling = R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})";
  for (const char* sizes : {R"("hidden_size": -64, "num_attention_heads": 8)",
                            R"("hidden_size": 64, "num_attention_heads": 8, "head_dim": 4096)"}) {
    const absl::StatusOr<ModelConfig> c = ConfigFromHfJson(
        std::string(
            R"({"model_type": "llama", "vocab_size": 512, "num_hidden_layers": 2, "intermediate_size": 172, )") +
        sizes + ", " + scaling + "}");
    ASSERT_FALSE(c.ok()) << sizes;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << sizes;
    EXPECT_NE(c.status().message().find("head_dim"), std::string::npos) << c.status();
  }
}

// transformers 5 writes rope_theta and the scaling inside rope_parameters
// (SmolLM2's 100000; LLaMA-3.1's llama3 scaling); older files at the top level.
TEST(HfConfig, RopeParametersOfTransformers5) {
  const std::string sizes = R"("model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 8, "intermediate_size": 172, )";
  const absl::StatusOr<ModelConfig> v5 =
      ConfigFromHfJson("{" + sizes + R"("rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})");
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_EQ(v5->rope.freq_base, 100000.0f);
  EXPECT_TRUE(v5->rope.freq_factors.empty());
  const absl::StatusOr<ModelConfig> scaled = ConfigFromHfJson(
      "{" + sizes + R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ(scaled->rope.freq_base, 500000.0f);
  EXPECT_EQ(scaled->rope.freq_factors, Llama3FreqFactors(8, 500000.0f, 8.0f, 1.0f, 4.0f, 8192));
  const absl::StatusOr<ModelConfig> v4 = ConfigFromHfJson("{" + sizes + R"("rope_theta": 250000.0})");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->rope.freq_base, 250000.0f);
}

// Found by fuzz_hf_config and fuzz_pod_groups (UBSan): a float too large for the
// int field it fills (1.5e125 layers) was converted with undefined behaviour; a
// safetensors shape or offset that is a float likewise.
TEST(HfConfig, NumbersOutOfRangeAreErrors) {
  const absl::StatusOr<ModelConfig> c = ConfigFromHfJson(
      R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 1.5e125,
          "num_attention_heads": 8, "intermediate_size": 172})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "config.json: the number 1.5e+125 is out of range");
  for (const char* header : {R"({"a": {"dtype": "F32", "shape": [1e300], "data_offsets": [0, 4]}})",
                             R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-1.5, 4]}})"}) {
    std::string image(8, '\0');
    const size_t n = std::strlen(header);
    for (int b = 0; b < 8; ++b) image[b] = static_cast<char>((n >> (8 * b)) & 0xff);
    image += header;
    image += std::string(4, '\0');
    const auto st = SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x");
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument) << header;
  }
}

}  // namespace
}  // namespace ps
