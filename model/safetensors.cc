#include "model/safetensors.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  PS_ASSIGN_OR_RETURN(auto file, Parse(mapped->data(), mapped->size(), path));
  file->file_ = std::move(mapped);
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(const uint8_t* data, size_t size,
                                                                        const std::string& src) {
  if (size < 8) return absl::DataLossError(absl::StrCat(src, ": truncated safetensors header"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8 || header_len > (uint64_t{100} << 20)) {
    return absl::DataLossError(absl::StrCat(src, ": safetensors header length ", header_len, " exceeds the file"));
  }
  nlohmann::json h = nlohmann::json::parse(data + 8, data + 8 + header_len, nullptr, false);
  if (h.is_discarded() || !h.is_object())
    return absl::InvalidArgumentError(absl::StrCat(src, ": bad safetensors header"));
  const uint8_t* base = data + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  try {
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const auto& v = it.value();
      const std::string dt = v.at("dtype").get<std::string>();
      SafetensorsTensor t;
      size_t elem = 0;
      if (dt == "F32") {
        t.type = DType::kF32;
        elem = 4;
      } else if (dt == "F16") {
        t.type = DType::kF16;
        elem = 2;
      } else if (dt == "BF16") {
        t.type = DType::kBF16;
        elem = 2;
      } else
        return absl::UnimplementedError(absl::StrCat(src, ": tensor ", it.key(), " has unsupported dtype ", dt));
      size_t n = 1;
      for (const auto& d : v.at("shape")) {
        if (!d.is_number_integer())  // a float would convert with undefined behaviour
          return absl::InvalidArgumentError(absl::StrCat(src, ": bad shape for ", it.key()));
        const int64_t x = d.get<int64_t>();
        if (x <= 0 || x > (int64_t{1} << 40))
          return absl::InvalidArgumentError(absl::StrCat(src, ": bad shape for ", it.key()));
        t.shape.push_back(x);
        n *= static_cast<size_t>(x);
        if (n > (size_t{1} << 42))
          return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", it.key(), " too large"));
      }
      const auto& off = v.at("data_offsets");
      if (!off.at(0).is_number_unsigned() || !off.at(1).is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", it.key(), " has bad data_offsets"));
      }
      const uint64_t b = off.at(0).get<uint64_t>(), e = off.at(1).get<uint64_t>();
      if (b > e || e > data_size || e - b != n * elem) {
        return absl::DataLossError(absl::StrCat(src, ": tensor ", it.key(), " byte range [", b, ", ", e,
                                                ") does not fit its shape or the file"));
      }
      t.data = base + b;
      t.nbytes = e - b;
      file->tensors_.emplace(it.key(), std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": safetensors header: ", e.what()));
  }
  return file;
}

}  // namespace ps
