// libFuzzer target: tokenizer.json (+ a tokenizer_config.json after a NUL byte)
// must give a tokenizer that encodes and decodes without crashing, or an error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/status.h"
#include "model/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view json = in.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  auto tok = ps::Tokenizer::FromHfJson(json, config);
  if (!tok.ok()) return 0;
  for (std::string_view text :
       {std::string_view("Hello, world! 123 \xe2\x82\xac\n\t<|im_start|>"), json.substr(0, 64)}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = (*tok)->Encode(text, special, special);
      for (int32_t id : ids) PS_CHECK(id >= 0 && id < (*tok)->vocab_size()) << "id " << id;
      (void)(*tok)->Decode(ids, special);
    }
  }
  return 0;
}
