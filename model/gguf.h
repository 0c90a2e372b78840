// GGUF (v2, v3) reader over a memory-mapped file: metadata key/values and tensor
// descriptors whose data points into the mapping. Every offset and size is
// validated against the file so a corrupt file yields an error, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mapped_file.h"
#include "kernels/dtype.h"

namespace ps {

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Scalars use the member matching their type class; arrays of
// scalars keep their elements in the typed vectors; arrays of arrays in `array`.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  GgufValueType elem_type = GgufValueType::kU8;  // arrays only
  int64_t i = 0;                                 // every integer type and bool
  double f = 0;                                  // F32 / F64
  std::string s;                                 // string
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> array;

  bool IsInteger() const;
  bool IsFloat() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
};

struct GgufTensor {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> dims;  // ne[0] (contiguous, row length) first
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t num_elements() const;
};

class GgufFile {
 public:
  // Maps and parses `path`. Errors name the problem (bad magic, truncation, ...).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (used by the fuzzer and tests); `data` must outlive the result.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size, std::string source_name);

  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(const std::string& name) const;
  const std::string& source() const { return source_; }
  // The mapped file; null for a file parsed from memory.
  const MappedFile* mapping() const { return file_.get(); }

  const GgufValue* Find(const std::string& key) const;
  // Typed look-ups; a present key of the wrong type is an error, an absent one nullopt.
  absl::StatusOr<std::optional<int64_t>> GetInt(const std::string& key) const;
  absl::StatusOr<std::optional<double>> GetFloat(const std::string& key) const;
  absl::StatusOr<std::optional<bool>> GetBool(const std::string& key) const;
  absl::StatusOr<std::optional<std::string>> GetString(const std::string& key) const;

 private:
  std::unique_ptr<MappedFile> file_;
  std::string source_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace ps
