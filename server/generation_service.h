// The pruneserve.v1.Generation service on gRPC's callback API. Reactors never
// block: Generate hands the request to the engine loop and streams the events the
// loop's thread pushes back.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "pruneserve/v1/generation.grpc.pb.h"
#include "scheduler/engine_loop.h"
#include "server/access.h"
#include "server/convert.h"
#include "server/metrics.h"

namespace ps::server {

// What the service needs once the model is loaded.
struct ServiceState {
  const Model* model = nullptr;
  EngineLoop* loop = nullptr;
  Metrics* metrics = nullptr;
  int kv_block_tokens = 16;     // tokens per KV page
  int64_t kv_token_blocks = 1;  // blocks a page of tokens takes over all layers
  // Tokens a stream may have waiting for a client that does not read; beyond,
  // its request is cancelled (RESOURCE_EXHAUSTED): memory per stream is bounded.
  size_t max_stream_backlog = 4096;
  RequestDefaults defaults;
  // GetModelInfo's device, cpu_isa and activations.
  std::string device, cpu_isa, activations;
};

class GenerationService final : public pb::Generation::CallbackService {
 public:
  // `access` (may be null: everyone is served without limit) must outlive the service.
  explicit GenerationService(AccessControl* access = nullptr) : access_(access) {}
  // Until SetState, every call answers UNAVAILABLE ("loading").
  void SetState(const ServiceState* state) { state_.store(state); }
  // While draining, new Generate calls answer UNAVAILABLE.
  void SetDraining(bool draining) { draining_.store(draining); }

  grpc::ServerWriteReactor<pb::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const pb::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const pb::AbortRequest* request,
                                  pb::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const pb::TokenizeRequest* request,
                                     pb::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const pb::DetokenizeRequest* request,
                                       pb::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const pb::GetModelInfoRequest* request,
                                         pb::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const pb::GetLoadRequest* request,
                                    pb::LoadInfo* response) override;
  grpc::ServerUnaryReactor* FlushCache(grpc::CallbackServerContext* ctx, const pb::FlushCacheRequest* request,
                                       pb::FlushCacheResponse* response) override;
  grpc::ServerWriteReactor<pb::KvEventBatch>* SubscribeKvEvents(grpc::CallbackServerContext* ctx,
                                                                const pb::SubscribeKvEventsRequest* request) override;

 private:
  // The state, once the caller is authenticated (their principal, AccessControl::
  // Authenticate, into `principal` when given) and the model is loaded.
  absl::StatusOr<const ServiceState*> Admit(grpc::CallbackServerContext* ctx, std::string* principal = nullptr) const;

  AccessControl* access_;
  std::atomic<const ServiceState*> state_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace ps::server
