// Fault injection for tests: named points in the engine and scheduler that fail on
// purpose when armed (pruneserve --inject-fault POINT=N: the next N hits fail).
// Unarmed, a point costs one relaxed atomic load.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ps::fault {

enum class Point : int {
  kSwapCopy,      // a copy between the KV tiers fails (KvCache::Finish)
  kHostTierFull,  // the host tier reports no room when a request is preempted
  kKvAppend,      // a KV block allocation fails mid-step (KvCache::Append)
  kStrategy,      // a pruning strategy returns an error (its BeginStep)
  kCount,
};

// "swap_copy=2" (also host_tier_full, kv_append, strategy): arms the point for its
// next 2 hits. InvalidArgument for an unknown point or a count < 1.
absl::Status Arm(const std::string& spec);
// Disarms every point.
void Reset();
// True when `p` is armed; consumes one of its hits.
bool Hit(Point p);

}  // namespace ps::fault
