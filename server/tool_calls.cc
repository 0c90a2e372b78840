#include "server/tool_calls.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grammar/json_schema.h"
#include "nlohmann/json.hpp"

namespace ps::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kMistralId = "[CALL_ID]";

// A call from a JSON object {"name": ..., "<args_key>": {...}}; false if it is not one.
bool CallFromJson(const Json& j, ToolCall* call) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  Json args = Json::object();
  for (const char* key : {"arguments", "parameters"}) {
    if (!j.contains(key)) continue;
    args = j[key];
    if (args.is_string()) args = Json::parse(args.get<std::string>(), nullptr, false);
    break;
  }
  if (!args.is_object()) return false;
  call->name = j["name"].get<std::string>();
  call->arguments = args.dump();
  return true;
}

std::string_view Trim(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size()));
  return std::string_view(t.data(), t.size());
}

// Streaming: the text before `tag` is content, and so is all of it unless it ends with
// the start of `tag`, or (untagged calls) the answer starts with `untagged`.
size_t BeforeTag(std::string_view text, std::string_view tag, char untagged) {
  if (const size_t at = text.find(tag); at != std::string_view::npos) return at;
  if (Trim(text).starts_with(untagged)) return 0;
  for (size_t keep = std::min(text.size(), tag.size() - 1); keep > 0; --keep) {
    if (tag.starts_with(text.substr(text.size() - keep))) return text.size() - keep;
  }
  return text.size();
}

// Mistral's calls after [TOOL_CALLS] (`rest`): a JSON list, or `name[ARGS]{...}` each.
bool MistralCalls(std::string_view rest, std::vector<ToolCall>* calls) {
  rest = Trim(rest);
  if (rest.starts_with("[")) {
    const Json list = Json::parse(rest, nullptr, false);
    if (!list.is_array() || list.empty()) return false;
    for (const Json& j : list) {
      if (!CallFromJson(j, &calls->emplace_back())) return false;
    }
    return true;
  }
  while (true) {
    const size_t args = rest.find(kMistralArgs);
    if (args == std::string_view::npos) return false;
    std::string_view name = rest.substr(0, args);
    name = Trim(name.substr(0, name.find(kMistralId)));
    const std::string_view body = rest.substr(args + kMistralArgs.size());
    const size_t next = body.find(kMistralCalls);
    const Json j = Json::parse(Trim(body.substr(0, next)), nullptr, false);
    if (name.empty() || !j.is_object()) return false;
    calls->push_back({.name = std::string(name), .arguments = j.dump()});
    if (next == std::string_view::npos) return true;
    rest = Trim(body.substr(next + kMistralCalls.size()));
  }
}

}  // namespace

ToolFormat DetectToolFormat(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::kHermes;
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolFormat::kMistral;
  if (source.find("<|start_header_id|>") != std::string_view::npos &&
      source.find("parameters") != std::string_view::npos && source.find("tools") != std::string_view::npos) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kNone;
}

std::string ToolCallId(ToolFormat format, std::string_view request_id, int choice, size_t i) {
  std::string id = absl::StrCat("call_", i, "_", std::string(request_id));
  if (choice > 0) absl::StrAppend(&id, "_", choice);
  if (format != ToolFormat::kMistral) return id;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ULL;
  constexpr std::string_view kAlphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out(9, '0');
  for (char& c : out) {
    c = kAlphabet[h % kAlphabet.size()];
    h /= kAlphabet.size();
  }
  return out;
}

ParsedAnswer ParseToolCalls(ToolFormat format, std::string_view text) {
  ParsedAnswer out{.content = std::string(text)};
  std::vector<ToolCall> calls;
  if (format == ToolFormat::kHermes) {
    size_t at = text.find(kHermesOpen);
    if (at == std::string_view::npos) {
      // Small models often write the call's object without its tags: an answer that is
      // nothing but one is a call.
      ToolCall call;
      if (!Trim(text).starts_with("{") || !CallFromJson(Json::parse(Trim(text), nullptr, false), &call)) return out;
      return {.content = "", .calls = {std::move(call)}};
    }
    const std::string content(Trim(text.substr(0, at)));
    while (at != std::string_view::npos) {
      const size_t body = at + kHermesOpen.size();
      const size_t close = text.find(kHermesClose, body);
      const std::string_view inner =
          Trim(text.substr(body, close == std::string_view::npos ? text.npos : close - body));
      ToolCall call;
      if (!CallFromJson(Json::parse(inner, nullptr, false), &call)) return out;
      calls.push_back(std::move(call));
      if (close == std::string_view::npos) break;
      const size_t next = text.find(kHermesOpen, close);
      if (next == std::string_view::npos && !Trim(text.substr(close + kHermesClose.size())).empty()) return out;
      at = next;
    }
    return {.content = content, .calls = std::move(calls)};
  }
  if (format == ToolFormat::kLlama3Json) {
    std::string_view t = Trim(text);
    if (t.starts_with("<|python_tag|>")) t = Trim(t.substr(14));
    if (!t.starts_with("{")) return out;
    // One object, or several separated by ';' (each piece must parse whole).
    size_t start = 0;
    while (start < t.size()) {
      size_t end = start;
      ToolCall call;
      bool found = false;
      while (!found) {
        end = t.find(';', end);
        const std::string_view piece = t.substr(start, end == std::string_view::npos ? t.npos : end - start);
        found = CallFromJson(Json::parse(piece, nullptr, false), &call);
        if (end == std::string_view::npos) break;
        if (!found) ++end;
      }
      if (!found) return out;
      calls.push_back(std::move(call));
      if (end == std::string_view::npos) break;
      start = end + 1;
      while (start < t.size() && absl::ascii_isspace(static_cast<unsigned char>(t[start]))) ++start;
    }
    return {.content = "", .calls = std::move(calls)};
  }
  if (format == ToolFormat::kMistral) {
    const size_t at = text.find(kMistralCalls);
    // No [TOOL_CALLS]: a constrained answer (a required call) is the bare JSON list.
    if (at == std::string_view::npos && !Trim(text).starts_with("[")) return out;
    if (!MistralCalls(at == std::string_view::npos ? text : text.substr(at + kMistralCalls.size()), &calls)) {
      return out;
    }
    return {.content = at == std::string_view::npos ? "" : std::string(Trim(text.substr(0, at))),
            .calls = std::move(calls)};
  }
  return out;
}

size_t SureContent(ToolFormat format, std::string_view text) {
  if (format == ToolFormat::kHermes) return BeforeTag(text, kHermesOpen, '{');     // '{': an untagged call, perhaps
  if (format == ToolFormat::kMistral) return BeforeTag(text, kMistralCalls, '[');  // '[': a bare list, perhaps
  if (format == ToolFormat::kLlama3Json) {
    const std::string_view t = Trim(text), tag = "<|python_tag|>";
    const bool may_be_call = t.empty() || t.starts_with("{") || tag.starts_with(t) || t.starts_with(tag);
    return may_be_call ? 0 : text.size();  // a call waits for the answer's end
  }
  return text.size();
}

absl::StatusOr<std::string> ToolCallGbnf(ToolFormat format,
                                         const google::protobuf::RepeatedPtrField<pruneserve::v1::Tool>& tools,
                                         const std::string& function, bool parallel) {
  if (format == ToolFormat::kNone) {
    return absl::FailedPreconditionError(
        "tool_choice: the model's chat template has no tool-call format this server reads (Hermes <tool_call>, "
        "LLaMA 3.x JSON, Mistral [TOOL_CALLS])");
  }
  const char* args_key = format == ToolFormat::kLlama3Json ? "parameters" : "arguments";
  Json alternatives = Json::array();
  for (const auto& tool : tools) {
    if (!function.empty() && tool.name() != function) continue;
    Json parameters =
        tool.parameters().empty() ? Json{{"type", "object"}} : Json::parse(tool.parameters(), nullptr, false);
    if (parameters.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat("tools: the parameters of '", tool.name(), "' are not JSON"));
    }
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"const", tool.name()}}}, {args_key, std::move(parameters)}}},
                            {"required", {"name", args_key}},
                            {"additionalProperties", false}});
  }
  if (alternatives.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tool_choice: no tool named '", function, "'"));
  }
  absl::StatusOr<std::string> schema = grammar::JsonSchemaToGbnf(Json{{"anyOf", std::move(alternatives)}});
  if (!schema.ok()) return absl::InvalidArgumentError(absl::StrCat("tools: ", schema.status().message()));
  // The schema's start rule becomes `call`, inside the format's markup.
  std::string rules = *std::move(schema);
  rules.replace(0, 4, "call");
  std::string root;
  switch (format) {
    case ToolFormat::kHermes:
      root = absl::StrCat("root ::= block", parallel ? " (\"\\n\" block)*" : "",
                          "\nblock ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
      break;
    case ToolFormat::kMistral:  // the JSON list without its control token
      root = absl::StrCat("root ::= \"[\" call", parallel ? " (\",\" ws call)*" : "", " \"]\"\n");
      break;
    default: root = absl::StrCat("root ::= call", parallel ? " (\";\" ws call)*" : "", "\n"); break;
  }
  return root + rules;
}

}  // namespace ps::server
