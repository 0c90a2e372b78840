// Bytes of one KV tier, from a backend, and how to give them back. C++17 (CUDA
// sources include it).
#pragma once

#include <cstdint>
#include <functional>

namespace ps {

struct MemoryRegion {
  uint8_t* base = nullptr;
  std::function<void(uint8_t*)> release;
};

}  // namespace ps
