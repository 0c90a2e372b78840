// The pruneserve.v1.Generation service on gRPC's callback API. Reactors never
// block: Generate hands the request to the scheduler and streams the events the
// engine thread pushes back.
#pragma once

#include <atomic>
#include <memory>

#include "pruneserve/v1/generation.grpc.pb.h"
#include "scheduler/scheduler.h"
#include "server/convert.h"
#include "server/metrics.h"

namespace ps::server {

// What the service needs once the model is loaded.
struct Backend {
  const Model* model = nullptr;
  Scheduler* scheduler = nullptr;
  Metrics* metrics = nullptr;
  RequestDefaults defaults;
};

class GenerationService final : public pb::Generation::CallbackService {
 public:
  // Until SetBackend, every call answers UNAVAILABLE ("loading").
  void SetBackend(const Backend* backend) { backend_.store(backend); }
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

 private:
  const Backend* backend_or_null() const { return backend_.load(); }
  std::atomic<const Backend*> backend_{nullptr};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace ps::server
