// libFuzzer target: a Hugging Face config.json must give a model configuration or
// an error, and one that passes ValidateConfig has usable shapes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = ps::ConfigFromHfJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!config.ok() || !ps::ValidateConfig(*config).ok()) return 0;
  PS_CHECK(config->n_layers > 0 && config->n_embd > 0 && config->n_heads > 0 && config->n_kv_heads > 0)
      << "accepted a config without shapes";
  return 0;
}
