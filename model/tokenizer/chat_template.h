// The model's chat template: its tokenizer.chat_template (GGUF metadata or
// tokenizer_config.json), or an operator's file, rendered by jinja/ in the context
// Hugging Face transformers' apply_chat_template gives it: `messages`, `tools` (None
// when absent), `documents` (None), `add_generation_prompt` and the special tokens'
// texts (`bos_token`, `eos_token`). The rendering writes special tokens as text, BOS
// included where the template writes it, so it is tokenised as transformers does:
// no special tokens added, special tokens in the text parsed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "jinja/template.h"

namespace ps {

class Tokenizer;

// A function call in an assistant's turn, as OpenAI's API carries it.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool (the template decides what it accepts)
  std::string content;
  std::vector<ToolCall> tool_calls;  // an assistant's calls
  std::string tool_call_id;          // a tool's result: the call it answers
  std::string name;                  // a tool's result: the function's name
};

class ChatTemplate {
 public:
  // `source` with `tok`'s special tokens (`tok` must outlive the template).
  // InvalidArgument naming the line when the interpreter cannot parse it.
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Create(std::string_view source, const Tokenizer& tok);
  // The template `path` names, else the model's own. FailedPrecondition when the
  // model carries none and no file is given; NotFound for a file that cannot be read.
  static absl::StatusOr<std::shared_ptr<const ChatTemplate>> Load(const Tokenizer& tok, const std::string& path);

  // The conversation as text, with `tools` (OpenAI's list of {"type": "function",
  // "function": {name, description, parameters}}; null: none) for the template to
  // offer. A call's arguments reach the template as an object when they are JSON text
  // of one (as vLLM passes them). A conversation the template refuses (its
  // raise_exception) or fails on is InvalidArgument with the template's message.
  absl::StatusOr<std::string> Apply(std::span<const ChatMessage> messages, bool add_generation_prompt = true,
                                    const nlohmann::ordered_json& tools = nullptr) const;
  // Apply, tokenised.
  absl::StatusOr<std::vector<int32_t>> Encode(std::span<const ChatMessage> messages, bool add_generation_prompt = true,
                                              const nlohmann::ordered_json& tools = nullptr) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string_view source, jinja::Template t, const Tokenizer& tok)
      : source_(source), template_(std::move(t)), tok_(tok) {}
  std::string source_;
  jinja::Template template_;
  const Tokenizer& tok_;
};

using ChatTemplatePtr = std::shared_ptr<const ChatTemplate>;

}  // namespace ps
