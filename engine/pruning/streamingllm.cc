#include "engine/pruning/streamingllm.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

class Params final : public BoundParams<Params, StreamingLlmParams> {
 public:
  static constexpr StructField<StreamingLlmParams> kFields[] = {{"sinks", &StreamingLlmParams::sinks},
                                                                {"recent", &StreamingLlmParams::recent}};
  using BoundParams::BoundParams;

  absl::Status Validate(const ModelConfig& config, std::string_view field) const override {
    (void)config;
    if (p_.recent < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), ".recent: ", p_.recent, " must be at least 1"));
    }
    return absl::OkStatus();
  }

  bool WholePrompt() const override { return true; }
  // The prompt pass is dense: its KV is `full`'s, evicted by position only after it.
  std::optional<std::string> PrefixCacheKey() const override { return std::string(); }
  std::unique_ptr<PruningStrategy> Make(const ModelConfig& config) const override {
    return std::make_unique<StreamingLlm>(p_, config);
  }
};

}  // namespace

std::unique_ptr<StrategyParams> StreamingLlmDefaults(const ModelConfig& config, const CalibrationPtr& calibration) {
  (void)config, (void)calibration;
  return std::make_unique<Params>(StreamingLlmParams{});
}

void StreamingLlm::KeepPages(int layer, int32_t full_pages, int block_tokens, std::vector<std::vector<int32_t>>* keep) {
  (void)layer;
  const int64_t prompt = prompt_tokens();
  std::vector<int32_t> pages;
  for (int32_t p = 0; p < full_pages; ++p) {
    const int64_t first = static_cast<int64_t>(p) * block_tokens, end = first + block_tokens;
    if (first < params_.sinks || end > prompt - params_.recent) pages.push_back(p);
  }
  keep->assign(n_kv_heads(), pages);
}

}  // namespace ps
