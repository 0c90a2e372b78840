// libFuzzer target: a chat template text and a message list (the input split at NUL
// bytes: template, then role and content alternately) must format or be rejected.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      parts.emplace_back();
    } else {
      parts.back() += static_cast<char>(data[i]);
    }
  }
  const ps::ChatTemplate t = ps::DetectChatTemplate(parts[0]);
  std::vector<ps::ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  for (bool prompt : {true, false}) (void)ps::ApplyChatTemplate(t, messages, prompt);
  return 0;
}
