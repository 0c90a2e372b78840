// Tiny random models built in memory (GGUF tensor names), for the architecture tests
// and the CUDA backend's parity tests.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace ps::testing {

struct TinyModel {
  ModelConfig config;
  std::map<std::string, std::vector<float>> data;     // GGUF names, F32 (as stored, BF16-rounded where so)
  std::map<std::string, std::vector<uint16_t>> bf16;  // the matrices' BF16 words, with BF16 weights
  std::unique_ptr<Model> model;
};

// A model of config `c` with uniform random tensors seeded per name, changed by `edit`
// (if given) before the model is built; its matrices are stored as `weights` (F32 or
// BF16), norms and biases as F32.
std::unique_ptr<TinyModel> MakeTiny(const ModelConfig& c, DType weights = DType::kF32,
                                    const std::function<void(std::map<std::string, std::vector<float>>&)>& edit = {});

// LLaMA with GQA: 2 layers, width 64, 4 query and 2 KV heads of 16, FFN 96, vocabulary 97.
ModelConfig BaseConfig();

// Qwen2 on BaseConfig's sizes: QKV biases, NeoX RoPE (base 1e6) over whole heads.
ModelConfig Qwen2Config(int n_heads, int n_kv_heads, int head_dim);

// n token ids below `vocab`, a fixed pattern.
std::vector<int32_t> Prompt(int n, int vocab);

}  // namespace ps::testing
