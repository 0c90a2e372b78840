#include "base/large_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace ps {

void LargeBufferFree::operator()(uint8_t* p) const { std::free(p); }

LargeBuffer AllocateLargeBuffer(size_t bytes) {
  const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
  const size_t n = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(align, n));
  // The advice only widens what the kernel may back the range with: its failure (THP
  // compiled out) leaves ordinary pages, which work the same.
  if (p != nullptr && align == kHugePageBytes) ::madvise(p, n, MADV_HUGEPAGE);
  return LargeBuffer(p);
}

}  // namespace ps
