// A loaded model: configuration, weight views and the tokenizer. Weights stay in
// the memory-mapped file where possible; small vectors (norms, biases) are copied
// to F32.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/large_buffer.h"
#include "base/mapped_file.h"
#include "kernels/types.h"
#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace ps {

class Backend;

enum class Arch { kLlama, kQwen2 };

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;  // as in the file: "llama", "qwen2"
  std::string name;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_ctx = 0;  // trained context length
  float rms_eps = 1e-5f;
  bool qkv_bias = false;
  RopeParams rope;

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [n_embd]
  std::vector<float> bq, bk, bv;           // [q_dim], [kv_dim], [kv_dim]; empty without bias
  // [kv_dim], empty without a k bias: added to k after RoPE, minus the mean of the rotated k
  // bias over the trained context's positions. Every query's scores over its keys drop by
  // q . mean alike, so attention is unchanged; but the keys lose most of a large constant
  // (Qwen2.5's k bias reaches +-210 in its slowest pairs, against a spread of 1-2) that a
  // BF16 or 8-bit KV cache would otherwise spend its precision on.
  std::vector<float> bk_shift;
  MatrixView wq, wk, wv, wo;        // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim]
  MatrixView w_gate, w_up, w_down;  // [n_ff, n_embd] x2, [n_embd, n_ff]
};

// A named tensor handed to the model builder: GGUF naming and dims (ne[0] first).
struct TensorRef {
  DType type = DType::kF32;
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};
using TensorMap = std::map<std::string, TensorRef>;

class Model {
 public:
  // Loads a GGUF file, or a Hugging Face folder (config.json, *.safetensors, tokenizer.json).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path);
  // Builds a model over tensors that the caller keeps alive through `keep_alive`
  // (used by the loaders and by tests that construct models in memory).
  // `mapped`: the files (kept alive too) the tensors are mapped from, whose pages
  // ReleaseFilePages lets go.
  static absl::StatusOr<std::unique_ptr<Model>> Build(ModelConfig config, const TensorMap& tensors,
                                                      std::unique_ptr<Tokenizer> tokenizer,
                                                      std::shared_ptr<void> keep_alive,
                                                      std::vector<const MappedFile*> mapped = {});

  const ModelConfig& config() const { return config_; }
  // Unique among the models of this process, never reused (Backend::UseWeightsOf).
  uint64_t id() const { return id_; }
  // May be null for models built without a vocabulary.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

  MatrixView tok_embd;             // [n_vocab, n_embd]
  MatrixView output;               // [n_vocab, n_embd] (== tok_embd when tied)
  std::vector<float> output_norm;  // [n_embd]
  std::vector<LayerWeights> layers;

  // Every weight matrix of the forward pass (output, then each layer's q, k, v, o, gate,
  // up, down); tok_embd, read only by row lookups, is not among them.
  std::vector<MatrixView*> Matrices();
  // Storage of `bytes` for a backend's layout of the weights, freed with the model; null
  // when the memory is not there.
  uint8_t* AllocateWeightLayout(size_t bytes);
  // Lets the pages of w's mapped file go once another layout serves w (they come back
  // if read); nothing for weights not mapped from a file.
  void ReleaseFilePages(const MatrixView& w) const;

 private:
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<void> keep_alive_;
  std::vector<const MappedFile*> mapped_;  // the files the weights are mapped from
  uint64_t id_ = 0;
  std::vector<LargeBuffer> weight_layouts_;
};

// Readies the weights for `backend` once, at start-up: each matrix the backend keeps in
// a layout of its own (the CPU's int8 and BF16 kernels: kernels/cpu/packed.h, sgemm.h) is
// repacked into storage owned by the model, a part at a time, each part's pages of the
// file let go once it is packed; a GPU's copies are made and waited for, so that start-up
// holds the weights before sizing the KV tiers. Returns the bytes repacked.
absl::StatusOr<size_t> PrepareWeights(Model& model, Backend& backend);

// Reads the model configuration from GGUF metadata (and the rope_freqs tensor).
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& file);
// Reads config.json of a Hugging Face model.
absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& json_text);
// Checks that a configuration's sizes are positive, consistent and plausible (the
// loaders' results go through it before any buffer is sized from them).
absl::Status ValidateConfig(const ModelConfig& config);
// The largest head_dim ValidateConfig accepts (the CPU backend's rope keeps a head's
// angles on the stack: kernels/cpu/cpu_backend.cc's kMaxRopeDims).
inline constexpr int kMaxHeadDim = 1024;

// LLaMA-3 rope scaling: per-pair divisors of the rotation frequencies.
std::vector<float> Llama3FreqFactors(int n_dims, float base, float factor, float low_freq_factor,
                                     float high_freq_factor, int original_ctx);

// Loads a Hugging Face folder: config.json, model*.safetensors, tokenizer.json.
absl::StatusOr<std::unique_ptr<Model>> LoadHfModel(const std::string& dir);

}  // namespace ps
