#include "model/tokenizer/chat_template.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace ps {

std::string_view ChatFormatName(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatML: return "chatml";
    case ChatFormat::kLlama3: return "llama3";
    case ChatFormat::kLlama2: return "llama2";
    case ChatFormat::kMistral: return "mistral";
    case ChatFormat::kUnknown: break;
  }
  return "unknown";
}

ChatTemplate DetectChatTemplate(std::string_view t) {
  ChatTemplate out;
  if (t.find("<|im_start|>") != std::string_view::npos) {
    out.format = ChatFormat::kChatML;
    // A literal default system turn used when the conversation has none: SmolLM2's
    // "You are a helpful AI assistant named SmolLM ...", Qwen2.5's "You are Qwen, ...".
    // The newline may be written as a real one or as the Jinja escape "\\n".
    const bool conditional =
        t.find("!= 'system'") != std::string_view::npos || t.find("== 'system'") != std::string_view::npos;
    const std::string_view open = "<|im_start|>system";
    for (size_t a = t.find(open); conditional && a != std::string_view::npos; a = t.find(open, a + 1)) {
      std::string_view rest = t.substr(a + open.size());
      if (rest.starts_with("\n")) {
        rest.remove_prefix(1);
      } else if (rest.starts_with("\\n")) {
        rest.remove_prefix(2);
      } else {
        continue;
      }
      const size_t b = rest.find("<|im_end|>");
      if (b == std::string_view::npos) continue;
      const std::string_view body = rest.substr(0, b);
      if (body.empty() || body.find("{{") != std::string_view::npos || body.find("{%") != std::string_view::npos ||
          body.find('\'') != std::string_view::npos) {
        continue;  // an expression (the caller's system message), not a literal
      }
      out.default_system = absl::StrReplaceAll(absl::string_view(body.data(), body.size()), {{"\\n", "\n"}});
      break;
    }
  } else if (t.find("<|start_header_id|>") != std::string_view::npos) {
    out.format = ChatFormat::kLlama3;
  } else if (t.find("[INST]") != std::string_view::npos) {
    out.format = t.find("<<SYS>>") != std::string_view::npos ? ChatFormat::kLlama2 : ChatFormat::kMistral;
  }
  return out;
}

absl::StatusOr<std::string> ApplyChatTemplate(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                              bool add_generation_prompt) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty conversation");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("messages: unknown role '", m.role, "'"));
    }
  }
  std::string out;
  switch (t.format) {
    case ChatFormat::kChatML:
      if (messages[0].role != "system" && !t.default_system.empty()) {
        absl::StrAppend(&out, "<|im_start|>system\n", t.default_system, "<|im_end|>\n");
      }
      for (const ChatMessage& m : messages)
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFormat::kLlama3:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                        absl::StripAsciiWhitespace(m.content), "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kLlama2:
    case ChatFormat::kMistral: {
      std::string system;
      bool first_user = true;
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        if (m.role == "system") {
          if (t.format == ChatFormat::kMistral) {
            system = m.content + "\n\n";
          } else {
            system = absl::StrCat("<<SYS>>\n", m.content, "\n<</SYS>>\n\n");
          }
          continue;
        }
        if (m.role == "user") {
          if (!first_user) out += "<s>";
          absl::StrAppend(&out, "[INST] ", system, absl::StripAsciiWhitespace(m.content), " [/INST]");
          system.clear();
          first_user = false;
        } else {
          absl::StrAppend(&out, t.format == ChatFormat::kLlama2 ? " " : "", absl::StripAsciiWhitespace(m.content),
                          "</s>");
        }
      }
      return out;
    }
    case ChatFormat::kUnknown: break;
  }
  return absl::FailedPreconditionError(
      "the model's chat template is not one of the supported formats (ChatML, LLaMA-3, LLaMA-2/Mistral [INST])");
}

}  // namespace ps
