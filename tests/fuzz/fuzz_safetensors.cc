// libFuzzer target: a safetensors image (8-byte header length, JSON header, data)
// must parse into tensors whose byte ranges lie inside the image, or be rejected.
#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = ps::SafetensorsFile::Parse(data, size, "fuzz.safetensors");
  if (!file.ok()) return 0;
  for (const auto& [name, t] : (*file)->tensors()) {
    PS_CHECK(t.data >= data && t.data + t.nbytes <= data + size) << name << " lies outside the image";
  }
  return 0;
}
