// libFuzzer target: operation sequences on the KV owner (three bytes each: allocate,
// share, move, free, cancel, ...) checked against the reference model of the counts
// (tests/memory/kv_owner_ops.h), then everything let go: every block must be free.
#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "tests/memory/kv_owner_ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ps::testing::KvOwnerOps ops;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    const absl::Status st = ops.Apply(data[i], data[i + 1], data[i + 2]);
    PS_CHECK(st.ok()) << "operation " << i / 3 << ": " << st;
  }
  const absl::Status drained = ops.Drain();
  PS_CHECK(drained.ok()) << drained;
  return 0;
}
