// Per-model calibration of the strategies, measured by tools/pruneserve-calibrate
// and loaded by the server: PoD's layer groups (per KV head, consecutive layers
// whose attention distributions are alike), GemFilter's filter layer and LazyLLM's
// schedule (from the first layer whose last-query attention locates a planted
// needle). Stored as JSON next to the model file.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace ps {

// Jensen–Shannon divergence of two distributions of equal length, log base 2 (so
// in [0, 1]). Each is normalised to sum 1 first.
double JsDivergence(std::span<const float> p, std::span<const float> q);

// PoD's Algorithm 1 for one KV head: layers 0..L-1 in order, each joins the current
// group when its divergence from every layer already in the group, 1 - sim, is
// below `delta`, else starts a new one (sim is L x L). So delta = 0 shares nothing
// (every layer alone: `full`) and delta = 1 joins every layer not wholly unlike the
// group. (The paper writes "similar when sim >= delta" with sim the divergence
// itself; this reading keeps delta's direction: more sharing as it grows.)
std::vector<std::vector<int>> GreedyLayerGroups(const std::vector<std::vector<double>>& sim, double delta);

// The evaluation's table (pruneserve-eval --auto-table), which the `auto` strategy
// picks from: per prompt length, each strategy's accuracy pooled over the tasks with
// its 95% interval, and its TTFT speedup over `full`.
struct AutoTable {
  struct Entry {
    std::string name;
    double score = 0, lo = 0, hi = 0, speedup = 0;
    int n = 0;                       // prompts scored
    std::vector<std::string> loses;  // tasks whose score fell below full's interval for that task
  };
  struct Length {
    int length = 0;                 // the prompt length asked for
    int from_tokens = 0;            // the shortest prompt its figures include (prompts fall a little short of `length`)
    std::vector<Entry> strategies;  // `full` among them
  };
  std::string model;
  std::vector<Length> lengths;  // ascending
};
absl::StatusOr<AutoTable> AutoTableFromJson(std::string_view json);
absl::StatusOr<AutoTable> LoadAutoTable(const std::string& path);

struct Calibration {
  std::string model;  // the model's name, as GetModelInfo gives it
  int n_layers = 0;
  int n_kv_heads = 0;
  int samples = 0;     // haystack texts run
  int queries = 0;     // last queries of each whose distributions were compared
  double delta = 0.5;  // PoD's divergence threshold (GreedyLayerGroups)
  // [kv_head][layer][layer]: 1 - mean JS divergence of the attention distributions.
  std::vector<std::vector<std::vector<double>>> similarity;
  // [kv_head]: the layer groups (consecutive layers, in order, covering 0..L-1).
  std::vector<std::vector<std::vector<int>>> groups;
  // The first layer whose last-query attention located the planted needle in most
  // samples (-1: none did), and the LazyLLM pruning layers derived from it.
  int needle_layer = -1;
  std::vector<int> lazyllm_layers;
  // The evaluation's table for `auto` (a file of its own, attached by the server);
  // null: none. A calibration may hold only this (no groups: PoD stays unavailable).
  std::shared_ptr<const AutoTable> auto_table;

  // groups regrouped at another threshold (same similarities).
  void Regroup(double new_delta);
  // [kv_head][layer]: the lowest layer of the layer's group.
  std::vector<std::vector<int>> BaseLayers() const;
};

// Shared by the strategies' parameters that read it.
using CalibrationPtr = std::shared_ptr<const Calibration>;

std::string CalibrationToJson(const Calibration& c);
// Parses and checks the file against the model it is used with (layer and head
// counts, groups covering every layer consecutively); errors name the problem.
absl::StatusOr<Calibration> CalibrationFromJson(std::string_view json, const ModelConfig& config);
absl::StatusOr<Calibration> LoadCalibration(const std::string& path, const ModelConfig& config);

}  // namespace ps
