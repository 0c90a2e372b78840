#include "engine/pruning/params.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "engine/pruning/gemfilter.h"
#include "engine/pruning/lazyllm.h"

namespace ps {

std::string_view StrategyName(StrategyKind k) {
  switch (k) {
    case StrategyKind::kFull: return "full";
    case StrategyKind::kLazyLlm: return "lazyllm";
    case StrategyKind::kGemFilter: return "gemfilter";
  }
  return "unknown";
}

absl::StatusOr<StrategyKind> ParseStrategyName(std::string_view name) {
  for (StrategyKind k : kAllStrategies) {
    if (StrategyName(k) == name) return k;
  }
  std::vector<std::string> names;
  for (StrategyKind k : kAllStrategies) names.emplace_back(StrategyName(k));
  return absl::InvalidArgumentError(
      absl::StrCat("unknown strategy '", std::string(name), "' (known: ", absl::StrJoin(names, ", "), ")"));
}

PruningParams DefaultPruningParams(const ModelConfig& config) {
  const int n = config.n_layers;
  PruningParams p;
  // LazyLLM: chosen on SmolLM2-135M with pruneserve-eval (README "Pruning
  // strategies"): pruning before ~60% of the depth cost that model its retrieval.
  for (auto [depth, keep] : {std::pair{0.6, 0.3f}, {0.8, 0.1f}}) {
    const int layer = std::clamp(static_cast<int>(std::lround(depth * n)), 1, std::max(1, n - 1));
    if (n < 2 || (!p.lazyllm.layers.empty() && layer <= p.lazyllm.layers.back())) continue;
    p.lazyllm.layers.push_back(layer);
    p.lazyllm.keep.push_back(keep);
  }
  // GemFilter: the paper's 13 of 32 layers for LLaMA-3.1-8B, about 40% of the depth.
  p.gemfilter.filter_layer = std::clamp(static_cast<int>(std::lround(0.4 * n)), 0, std::max(0, n - 1));
  return p;
}

namespace {

absl::Status BadValue(std::string_view key, std::string_view value, std::string_view want) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(key), ": '", std::string(value), "' is not ", std::string(want)));
}

template <typename T>
absl::Status ParseList(std::string_view key, std::string_view value, std::vector<T>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(absl::string_view(value.data(), value.size()), ',', absl::SkipWhitespace())) {
    T x{};
    bool ok = false;
    if constexpr (std::is_same_v<T, float>) {
      ok = absl::SimpleAtof(part, &x);
    } else {
      ok = absl::SimpleAtoi(part, &x);
    }
    if (!ok) return BadValue(key, value, "a comma-separated list of numbers");
    out->push_back(x);
  }
  return absl::OkStatus();
}

absl::Status ParseInt(std::string_view key, std::string_view value, int* out) {
  if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), out)) return BadValue(key, value, "an integer");
  return absl::OkStatus();
}

}  // namespace

absl::Status SetStrategyArg(StrategyKind kind, std::string_view key, std::string_view value, PruningParams* p) {
  const absl::string_view v(value.data(), value.size());
  switch (kind) {
    case StrategyKind::kFull:
      break;
    case StrategyKind::kLazyLlm:
      if (key == "layers") return ParseList(key, value, &p->lazyllm.layers);
      if (key == "keep") return ParseList(key, value, &p->lazyllm.keep);
      break;
    case StrategyKind::kGemFilter:
      if (key == "filter_layer") return ParseInt(key, value, &p->gemfilter.filter_layer);
      if (key == "top_k") return ParseInt(key, value, &p->gemfilter.top_k);
      if (key == "pool_kernel") return ParseInt(key, value, &p->gemfilter.pool_kernel);
      if (key == "original_positions") {
        if (!absl::SimpleAtob(v, &p->gemfilter.original_positions)) return BadValue(key, value, "true or false");
        return absl::OkStatus();
      }
      break;
  }
  std::vector<std::string> known;
  for (const auto& [k, unused] : StrategyArgs(kind, *p)) known.push_back(k);
  return absl::InvalidArgumentError(absl::StrCat("strategy ", std::string(StrategyName(kind)), " has no parameter '",
                                                 std::string(key), "'",
                                                 known.empty() ? "" : absl::StrCat(" (known: ", absl::StrJoin(known, ", "), ")")));
}

absl::Status ApplyStrategyArgs(StrategyKind kind, const std::vector<std::string>& args, PruningParams* params) {
  params->strategy = kind;
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("strategy argument '", a, "' is not key=value"));
    PS_RETURN_IF_ERROR(SetStrategyArg(kind, std::string_view(a).substr(0, eq), std::string_view(a).substr(eq + 1), params));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::string>> StrategyArgs(StrategyKind kind, const PruningParams& p) {
  switch (kind) {
    case StrategyKind::kFull:
      return {};
    case StrategyKind::kLazyLlm:
      return {{"layers", absl::StrJoin(p.lazyllm.layers, ",")}, {"keep", absl::StrJoin(p.lazyllm.keep, ",")}};
    case StrategyKind::kGemFilter:
      return {{"filter_layer", absl::StrCat(p.gemfilter.filter_layer)},
              {"top_k", absl::StrCat(p.gemfilter.top_k)},
              {"pool_kernel", absl::StrCat(p.gemfilter.pool_kernel)},
              {"original_positions", p.gemfilter.original_positions ? "true" : "false"}};
  }
  return {};
}

absl::Status ValidatePruning(const PruningParams& p, const ModelConfig& config, std::string_view prefix) {
  const std::string field = absl::StrCat(std::string(prefix), ".", std::string(StrategyName(p.strategy)), ".");
  auto bad = [&](std::string_view key, auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(field, std::string(key), ": ", what...));
  };
  const int n = config.n_layers;
  switch (p.strategy) {
    case StrategyKind::kFull:
      return absl::OkStatus();
    case StrategyKind::kLazyLlm: {
      const LazyLlmParams& l = p.lazyllm;
      if (l.layers.size() != l.keep.size()) {
        return bad("keep", "has ", l.keep.size(), " entries for ", l.layers.size(), " layers (one keep fraction per layer)");
      }
      for (size_t i = 0; i < l.layers.size(); ++i) {
        if (l.layers[i] < 1 || l.layers[i] >= n) {
          return bad(absl::StrCat("layers[", i, "]"), l.layers[i], " is outside [1, ", n - 1, "] (the model has ", n, " layers)");
        }
        if (i > 0 && l.layers[i] <= l.layers[i - 1]) return bad(absl::StrCat("layers[", i, "]"), "layers must be ascending");
        if (!(l.keep[i] > 0.0f && l.keep[i] <= 1.0f)) return bad(absl::StrCat("keep[", i, "]"), l.keep[i], " is outside (0, 1]");
        if (i > 0 && l.keep[i] > l.keep[i - 1]) {
          return bad(absl::StrCat("keep[", i, "]"), "keep fractions must not increase (progressive pruning)");
        }
      }
      return absl::OkStatus();
    }
    case StrategyKind::kGemFilter: {
      const GemFilterParams& g = p.gemfilter;
      if (g.filter_layer < 0 || g.filter_layer >= n) {
        return bad("filter_layer", g.filter_layer, " is outside [0, ", n - 1, "] (the model has ", n, " layers)");
      }
      if (g.top_k < 1) return bad("top_k", g.top_k, " must be at least 1");
      if (g.pool_kernel < 1 || g.pool_kernel % 2 == 0 || g.pool_kernel > 1025) {
        return bad("pool_kernel", g.pool_kernel, " must be odd, in [1, 1025]");
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(std::string(prefix), ": unknown strategy"));
}

std::unique_ptr<PruningStrategy> MakeStrategy(const PruningParams& params, const ModelConfig& config) {
  PS_CHECK(ValidatePruning(params, config).ok()) << "MakeStrategy with invalid parameters";
  switch (params.strategy) {
    case StrategyKind::kFull: return nullptr;
    case StrategyKind::kLazyLlm: return std::make_unique<LazyLlm>(params.lazyllm, config);
    case StrategyKind::kGemFilter: return std::make_unique<GemFilter>(params.gemfilter);
  }
  return nullptr;
}

}  // namespace ps
