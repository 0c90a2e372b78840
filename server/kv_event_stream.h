// The SubscribeKvEvents call: the prefix cache's page events from the engine loop
// (EngineLoop::SubscribeKvEvents) as KvEventBatch messages, for prefix-aware routers.
#pragma once

#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "memory/prefix_index.h"
#include "pruneserve/v1/generation.pb.h"
#include "scheduler/engine_loop.h"

namespace ps::server {

namespace pb = ::pruneserve::v1;

// Batches not yet written beyond which a subscriber is ended with RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxKvEventBacklog = 1024;

// One batch: consecutive stored pages of one chain in one tier as one KvBlockStored,
// consecutive removals from one tier as one KvBlockRemoved; token ids only with
// `with_tokens` (a server with API keys sends none: they are other tenants' prompts).
pb::KvEventBatch KvEventsToProto(const std::vector<PrefixEvent>& events, int block_tokens, bool with_tokens);

// Starts the call's stream: subscribed to `loop` until the call ends. With a
// non-OK `rejected`, the call ends with it at once (`loop` unused).
grpc::ServerWriteReactor<pb::KvEventBatch>* StartKvEventStream(EngineLoop* loop, int block_tokens, bool with_tokens,
                                                               const absl::Status& rejected);

}  // namespace ps::server
