// Chat formatting for the common instruct formats, recognised from the model's
// template text (we do not run Jinja): ChatML (SmolLM2, Qwen2), LLaMA-3 and
// LLaMA-2 / Mistral [INST].
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ps {

enum class ChatFormat { kUnknown, kChatML, kLlama3, kLlama2, kMistral };
std::string_view ChatFormatName(ChatFormat f);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::kUnknown;
  std::string default_system;  // inserted when the conversation has no system message
};

// Recognises the template; kUnknown if it matches none of the supported formats.
ChatTemplate DetectChatTemplate(std::string_view template_text);

// Formats messages (special tokens written as text: tokenise with parse_special).
// The beginning-of-sequence token is not included: the tokenizer adds it.
absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                              bool add_generation_prompt = true);

}  // namespace ps
