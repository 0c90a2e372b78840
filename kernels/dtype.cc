#include "kernels/dtype.h"

namespace ps {

const DTypeTraits* FindDType(uint32_t gguf_type) {
  static constexpr DTypeTraits kF32{"F32", 1, 4};
  static constexpr DTypeTraits kF16{"F16", 1, 2};
  static constexpr DTypeTraits kBF16{"BF16", 1, 2};
  static constexpr DTypeTraits kQ4_0{"Q4_0", 32, 2 + 16};
  static constexpr DTypeTraits kQ4_1{"Q4_1", 32, 2 + 2 + 16};
  static constexpr DTypeTraits kQ8_0{"Q8_0", 32, 2 + 32};
  static constexpr DTypeTraits kQ4_K{"Q4_K", 256, 2 + 2 + 12 + 128};
  static constexpr DTypeTraits kQ6_K{"Q6_K", 256, 128 + 64 + 16 + 2};
  static constexpr DTypeTraits kQ5_0{"Q5_0", 32, 2 + 4 + 16};
  static constexpr DTypeTraits kQ5_1{"Q5_1", 32, 2 + 2 + 4 + 16};
  static constexpr DTypeTraits kQ2_K{"Q2_K", 256, 16 + 64 + 2 + 2};
  static constexpr DTypeTraits kQ3_K{"Q3_K", 256, 32 + 64 + 12 + 2};
  static constexpr DTypeTraits kQ5_K{"Q5_K", 256, 2 + 2 + 12 + 32 + 128};
  switch (static_cast<DType>(gguf_type)) {
    case DType::kF32: return &kF32;
    case DType::kF16: return &kF16;
    case DType::kBF16: return &kBF16;
    case DType::kQ4_0: return &kQ4_0;
    case DType::kQ4_1: return &kQ4_1;
    case DType::kQ8_0: return &kQ8_0;
    case DType::kQ4_K: return &kQ4_K;
    case DType::kQ6_K: return &kQ6_K;
    case DType::kQ5_0: return &kQ5_0;
    case DType::kQ5_1: return &kQ5_1;
    case DType::kQ2_K: return &kQ2_K;
    case DType::kQ3_K: return &kQ3_K;
    case DType::kQ5_K: return &kQ5_K;
  }
  return nullptr;
}

}  // namespace ps
