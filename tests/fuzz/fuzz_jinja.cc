// libFuzzer target: a template (the input up to its first NUL byte) and a JSON context
// (the rest; a conversation with tools when it is not a JSON object) must parse and
// render, or fail with a status: no crash, no runaway time or memory (jinja/template.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "jinja/template.h"

namespace {

constexpr const char* kConversation = R"({
  "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  nlohmann::ordered_json context;
  if (nul != std::string_view::npos) context = nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, false);
  if (!context.is_object()) context = nlohmann::ordered_json::parse(kConversation);
  const absl::StatusOr<ps::jinja::Template> t = ps::jinja::Template::Parse(source);
  if (!t.ok()) return 0;
  (void)t->Render(ps::jinja::Value::FromJson(context).dict());
  return 0;
}
