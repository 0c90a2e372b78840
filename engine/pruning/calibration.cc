#include "engine/pruning/calibration.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "model/json_numbers.h"

namespace ps {

double JsDivergence(std::span<const float> p, std::span<const float> q) {
  PS_CHECK(p.size() == q.size()) << "JS divergence of distributions of different lengths";
  double sp = 0, sq = 0;
  for (size_t i = 0; i < p.size(); ++i) sp += p[i], sq += q[i];
  if (sp <= 0 || sq <= 0) return 0;
  double js = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double a = p[i] / sp, b = q[i] / sq, m = 0.5 * (a + b);
    if (a > 0) js += 0.5 * a * std::log2(a / m);
    if (b > 0) js += 0.5 * b * std::log2(b / m);
  }
  return std::clamp(js, 0.0, 1.0);
}

std::vector<std::vector<int>> GreedyLayerGroups(const std::vector<std::vector<double>>& sim, double delta) {
  std::vector<std::vector<int>> groups;
  for (int l = 0; l < static_cast<int>(sim.size()); ++l) {
    bool joins = !groups.empty();
    for (size_t i = 0; joins && i < groups.back().size(); ++i) joins = 1.0 - sim[l][groups.back()[i]] < delta;
    if (joins) {
      groups.back().push_back(l);
    } else {
      groups.push_back({l});
    }
  }
  return groups;
}

void Calibration::Regroup(double new_delta) {
  delta = new_delta;
  groups.clear();
  for (const auto& s : similarity) groups.push_back(GreedyLayerGroups(s, delta));
}

std::vector<std::vector<int>> Calibration::BaseLayers() const {
  std::vector<std::vector<int>> base(groups.size(), std::vector<int>(n_layers, 0));
  for (size_t h = 0; h < groups.size(); ++h) {
    for (const std::vector<int>& g : groups[h]) {
      for (int l : g) base[h][l] = g.front();
    }
  }
  return base;
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j = {{"model", c.model},
                      {"n_layers", c.n_layers},
                      {"n_kv_heads", c.n_kv_heads},
                      {"samples", c.samples},
                      {"queries", c.queries},
                      {"pod", {{"delta", c.delta}, {"groups", c.groups}, {"similarity", c.similarity}}},
                      {"needle_layer", c.needle_layer},
                      {"lazyllm_layers", c.lazyllm_layers}};
  return j.dump(1);
}

absl::StatusOr<Calibration> CalibrationFromJson(std::string_view json, const ModelConfig& config) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  PS_RETURN_IF_ERROR(CheckJsonNumbers(j, "calibration"));
  Calibration c;
  try {
    c.model = j.value("model", "");
    c.n_layers = j.at("n_layers").get<int>();
    c.n_kv_heads = j.at("n_kv_heads").get<int>();
    c.samples = j.value("samples", 0);
    c.queries = j.value("queries", 0);
    const nlohmann::json& pod = j.at("pod");
    c.delta = pod.at("delta").get<double>();
    c.groups = pod.at("groups").get<std::vector<std::vector<std::vector<int>>>>();
    c.similarity = pod.value("similarity", std::vector<std::vector<std::vector<double>>>{});
    c.needle_layer = j.value("needle_layer", -1);
    c.lazyllm_layers = j.value("lazyllm_layers", std::vector<int>{});
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad calibration: ", e.what()));
  }
  if (c.n_layers != config.n_layers || c.n_kv_heads != config.n_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat("calibrated for ", c.n_layers, " layers and ", c.n_kv_heads,
                                                   " KV heads (", c.model, "), the model has ", config.n_layers,
                                                   " and ", config.n_kv_heads));
  }
  if (static_cast<int>(c.groups.size()) != c.n_kv_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod.groups has ", c.groups.size(), " KV heads, the model ", c.n_kv_heads));
  }
  for (size_t h = 0; h < c.groups.size(); ++h) {
    int next = 0;
    for (const std::vector<int>& g : c.groups[h]) {
      for (int l : g) {
        if (l != next) {
          return absl::InvalidArgumentError(
              absl::StrCat("pod.groups[", h, "]: groups must list layers 0..", c.n_layers - 1, " in order"));
        }
        ++next;
      }
    }
    if (next != c.n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("pod.groups[", h, "] covers ", next, " of ", c.n_layers, " layers"));
    }
  }
  if (c.needle_layer < -1 || c.needle_layer >= c.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("needle_layer ", c.needle_layer, " is outside the model"));
  }
  return c;
}

absl::StatusOr<AutoTable> AutoTableFromJson(std::string_view json) {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  AutoTable t;
  try {
    t.model = j.value("model", "");
    for (const nlohmann::json& l : j.at("lengths")) {
      AutoTable::Length length{.length = l.at("length").get<int>()};
      length.from_tokens = l.value("from_tokens", length.length);
      for (const nlohmann::json& s : l.at("strategies")) {
        length.strategies.push_back({.name = s.at("name").get<std::string>(),
                                     .score = s.at("score").get<double>(),
                                     .lo = s.at("lo").get<double>(),
                                     .hi = s.at("hi").get<double>(),
                                     .speedup = s.at("speedup").get<double>(),
                                     .n = s.value("n", 0),
                                     .loses = s.value("loses", std::vector<std::string>{})});
      }
      t.lengths.push_back(std::move(length));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad auto table: ", e.what()));
  }
  for (size_t i = 0; i < t.lengths.size(); ++i) {
    if (t.lengths[i].length < 1 || (i > 0 && t.lengths[i].length <= t.lengths[i - 1].length)) {
      return absl::InvalidArgumentError("auto table: lengths must be positive and ascending");
    }
    if (t.lengths[i].from_tokens < 1 || (i > 0 && t.lengths[i].from_tokens <= t.lengths[i - 1].from_tokens)) {
      return absl::InvalidArgumentError("auto table: from_tokens must be positive and ascending");
    }
  }
  return t;
}

absl::StatusOr<AutoTable> LoadAutoTable(const std::string& path) {
  PS_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  absl::StatusOr<AutoTable> t = AutoTableFromJson(text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<Calibration> LoadCalibration(const std::string& path, const ModelConfig& config) {
  PS_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  absl::StatusOr<Calibration> c = CalibrationFromJson(text, config);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", c.status().message()));
  return c;
}

}  // namespace ps
