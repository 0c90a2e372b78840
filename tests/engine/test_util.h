// Helpers shared by the model tests: paths to shared test data, TSV parsing and a
// one-call greedy generation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/pruning/registry.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model.h"

namespace ps::testing {

std::string TestData(const std::string& rel);  // <TestDataDir()>/<rel> (tests/test_env.h)
std::string StoriesGguf();
std::string DefaultModelPath();  // models/SmolLM2-135M-Instruct.Q4_1.gguf ("" if not fetched)
std::string EvalModelPath();     // models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ("" if not fetched)

std::vector<int32_t> ParseIds(const std::string& space_separated);
std::vector<float> ParseFloats(const std::string& space_separated);
// Data rows of a tab-separated file (lines starting with '#' and the header row skipped).
std::vector<std::vector<std::string>> ReadTsv(const std::string& path);

// Loads a model as the server serves it: weights prepared for the CPU backend (repacked
// for the int8 kernels; backends with F32 activations read the originals).
std::unique_ptr<Model> LoadOrDie(const std::string& path);

// Undoes the escaping of the golden files: \n, \t and \\.
std::string Unescape(const std::string& escaped);

// Checks greedy generation against a llama.cpp golden (tools/record_llamacpp_golden.py):
// each prompt tokenises to the recorded ids, and the tokens are equal up to the first
// step where both engines see a top-1/top-2 logit margin below near_tie (printed).
void ExpectGreedyMatchesGolden(const Model& m, Backend& backend, const std::string& tsv_path, float near_tie);

// Greedy continuation of `prompt` for n tokens, ignoring end-of-sequence, on an F32 KV
// cache (the goldens' and references' numerics).
std::vector<int32_t> Greedy(const Model& m, Backend& backend, const std::vector<int32_t>& prompt, int n);

// `name` with the model's defaults and `args` (key=value) applied, validated.
PruningParams Strategy(const ModelConfig& config, const std::string& name, const std::vector<std::string>& args = {});

// An offline F32 KV cache for up to max_tokens tokens of each of a few sequences.
std::unique_ptr<KvCache> KvFor(const Model& m, Backend& backend, int64_t max_tokens);

}  // namespace ps::testing
