// libFuzzer target: the GGUF reader and everything built from its metadata
// (model config, tokenizer) must reject any input without crashing.
#include <cstddef>
#include <cstdint>

#include "model/gguf.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = ps::GgufFile::Parse(data, size, "fuzz.gguf");
  if (!file.ok()) return 0;
  (void)ps::ConfigFromGguf(**file);
  auto tok = ps::Tokenizer::FromGguf(**file);
  if (tok.ok()) (void)(*tok)->Encode("Hello, world! 123", true, true);
  return 0;
}
