// libFuzzer target: a calibration file (PoD's layer groups, GemFilter's and
// LazyLLM's layers) checked against stories260K: accepted groups cover the model.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "engine/pruning/calibration.h"
#include "tests/fuzz/fuzz_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ps::ModelConfig& c = ps::fuzz::StoriesModel().model->config();
  auto cal = ps::CalibrationFromJson(std::string_view(reinterpret_cast<const char*>(data), size), c);
  if (!cal.ok()) return 0;
  PS_CHECK(static_cast<int>(cal->groups.size()) == c.n_kv_heads) << cal->groups.size() << " heads";
  for (const std::vector<int>& bases : cal->BaseLayers()) {
    PS_CHECK(static_cast<int>(bases.size()) == c.n_layers) << bases.size() << " layers";
    for (int l = 0; l < c.n_layers; ++l) PS_CHECK(bases[l] >= 0 && bases[l] <= l) << "base " << bases[l];
  }
  return 0;
}
