// libFuzzer target: OpenAI API bodies (the first byte picks completions or chat)
// through the HTTP front's parser and then the server's validation.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "server/openai_api.h"
#include "tests/fuzz/fuzz_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ps::fuzz::Served& s = ps::fuzz::StoriesModel();
  namespace oa = ps::server::openai;
  const oa::Api api = data[0] & 1 ? oa::Api::kChat : oa::Api::kCompletions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = oa::ParseRequest(api, body, {"stories260K"});
  if (!parsed.ok()) {
    auto [http, error] = oa::ErrorResponse(api, parsed.status());
    PS_CHECK(http == 400 || http == 404) << http << " for " << parsed.status();
    return 0;
  }
  (void)ps::server::RequestFromProto(parsed->request, *s.model, s.defaults);
  return 0;
}
