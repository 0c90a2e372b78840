// Memory for the repacked weights, on transparent huge pages where the system offers them:
// a decode step streams all of them, and on 4 KiB pages every 4 KiB is another TLB entry
// to walk for (Zen 5: SmolLM2's decode at 7,800 keys +3%, Qwen's single stream +2.5%).
// Not for the KV tiers or the activations: physically contiguous 2 MiB pages map their
// power-of-two strides onto fewer cache sets, and on huge pages Qwen's 8k-token prefill
// ran 3% (KV) and 5% (activations) slower, for no measurable gain in decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ps {

struct LargeBufferFree {
  void operator()(uint8_t* p) const;
};
using LargeBuffer = std::unique_ptr<uint8_t[], LargeBufferFree>;

// From this size up a buffer is aligned to it and offered to the kernel's transparent huge
// pages (madvise(MADV_HUGEPAGE): honoured when THP is "always" or "madvise", a no-op
// otherwise); its size is rounded up to a whole number of them.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` bytes (at least 1), 64-byte aligned; null when the memory is not there.
LargeBuffer AllocateLargeBuffer(size_t bytes);

}  // namespace ps
