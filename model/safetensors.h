// Hugging Face safetensors files: an 8-byte header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the data. Memory-mapped.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mapped_file.h"
#include "kernels/dtype.h"

namespace ps {

struct SafetensorsTensor {
  DType type = DType::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first (HF order)
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses an in-memory image (fuzzer, tests); `data` must outlive the result.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const uint8_t* data, size_t size,
                                                                const std::string& source);
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  // The mapped file; null for a file parsed from memory.
  const MappedFile* mapping() const { return file_.get(); }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, SafetensorsTensor> tensors_;
};

}  // namespace ps
