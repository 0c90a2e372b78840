// Element types of weight and activation tensors, numbered as in GGUF (ggml_type),
// with their block geometry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ps {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for plain floats)
  size_t block_bytes;   // bytes per block
};

// Traits of a GGUF type id; nullptr for ids this project does not support.
const DTypeTraits* FindDType(uint32_t gguf_type);
inline const DTypeTraits& Traits(DType t) { return *FindDType(static_cast<uint32_t>(t)); }
inline std::string_view DTypeName(DType t) { return Traits(t).name; }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t RowBytes(DType t, int64_t n) {
  const DTypeTraits& tr = Traits(t);
  return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace ps
