// What the request fuzzers validate against: stories260K from the shared test data,
// loaded once, with the server's default request settings and a ChatML template.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "engine/pruning/registry.h"
#include "model/model.h"
#include "server/convert.h"

namespace ps::fuzz {

struct Served {
  std::unique_ptr<Model> model;
  server::RequestDefaults defaults;
};

inline const Served& StoriesModel() {
  static const Served* served = [] {
    auto* s = new Served();
    auto model = Model::Load(PS_TESTDATA "/stories260K/stories260K.gguf");
    if (!model.ok()) {
      std::fprintf(stderr, "fuzz: cannot load stories260K: %s\n", std::string(model.status().message()).c_str());
      std::abort();
    }
    s->model = *std::move(model);
    s->defaults.strategies = std::make_shared<const StrategyDefaults>(*StrategyDefaults::ForModel(s->model->config()));
    // stories260K carries no chat template: messages are formatted as ChatML.
    s->defaults.chat = ChatTemplate::Create(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        *s->model->tokenizer());
    return s;
  }();
  return *served;
}

}  // namespace ps::fuzz
