#include "model/tokenizer/chat_template.h"

#include "absl/strings/str_cat.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "model/tokenizer/tokenizer.h"

namespace ps {

absl::StatusOr<ChatTemplatePtr> ChatTemplate::Create(std::string_view source, const Tokenizer& tok) {
  PS_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source));
  return std::shared_ptr<const ChatTemplate>(new ChatTemplate(source, std::move(t), tok));
}

absl::StatusOr<ChatTemplatePtr> ChatTemplate::Load(const Tokenizer& tok, const std::string& path) {
  if (!path.empty()) {
    absl::StatusOr<std::string> source = ReadFileToString(path);
    if (!source.ok()) return absl::NotFoundError(absl::StrCat("chat template ", path, ": ", source.status().message()));
    absl::StatusOr<ChatTemplatePtr> t = Create(*source, tok);
    if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template ", path, ": ", t.status().message()));
    return t;
  }
  if (tok.chat_template().empty()) {
    return absl::FailedPreconditionError(
        "the model carries no chat template (tokenizer.chat_template): give one with --chat-template FILE, or send "
        "text");
  }
  absl::StatusOr<ChatTemplatePtr> t = Create(tok.chat_template(), tok);
  if (!t.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("the model's chat template cannot be used (",
                                                      t.status().message(),
                                                      "): give one with --chat-template FILE, or send text"));
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Apply(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                                const nlohmann::ordered_json& tools) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty conversation");
  jinja::List list;
  for (const ChatMessage& m : messages) {
    jinja::Dict message{.items = {{"role", m.role}, {"content", m.content}}};
    if (!m.tool_calls.empty()) {
      jinja::List calls;
      for (const ToolCall& call : m.tool_calls) {
        const nlohmann::ordered_json args = nlohmann::ordered_json::parse(call.arguments, nullptr, false);
        const jinja::Value arguments = args.is_object() ? jinja::Value::FromJson(args) : jinja::Value(call.arguments);
        calls.push_back(jinja::Dict{
            .items = {{"id", call.id},
                      {"type", "function"},
                      {"function", jinja::Dict{.items = {{"name", call.name}, {"arguments", arguments}}}}}});
      }
      message.Set("tool_calls", std::move(calls));
    }
    if (!m.tool_call_id.empty()) message.Set("tool_call_id", m.tool_call_id);
    if (!m.name.empty()) message.Set("name", m.name);
    list.push_back(std::move(message));
  }
  jinja::Dict context{.items = {{"messages", std::move(list)},
                                {"tools", tools.is_null() ? jinja::Value::MakeNone() : jinja::Value::FromJson(tools)},
                                {"documents", jinja::Value::MakeNone()},
                                {"add_generation_prompt", add_generation_prompt}}};
  // transformers passes the special tokens the tokenizer has; one it lacks is undefined.
  if (tok_.bos_id() >= 0) context.Set("bos_token", tok_.token_text(tok_.bos_id()));
  if (tok_.eos_id() >= 0) context.Set("eos_token", tok_.token_text(tok_.eos_id()));
  absl::StatusOr<std::string> text = template_.Render(context);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("messages: the chat template ",
                                                   absl::IsFailedPrecondition(text.status()) ? "refused" : "failed on",
                                                   " the conversation: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::vector<int32_t>> ChatTemplate::Encode(std::span<const ChatMessage> messages,
                                                          bool add_generation_prompt,
                                                          const nlohmann::ordered_json& tools) const {
  PS_ASSIGN_OR_RETURN(std::string text, Apply(messages, add_generation_prompt, tools));
  return tok_.Encode(text, /*add_special=*/false, /*parse_special=*/true);
}

}  // namespace ps
