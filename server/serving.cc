#include "server/serving.h"

#include "base/status.h"

namespace ps::server {

absl::StatusOr<std::unique_ptr<Serving>> Serving::Create(const Model& model, Backend& backend, const ServingOptions& o,
                                                         SchedulerObserver* observer) {
  std::unique_ptr<Serving> s(new Serving());
  PS_ASSIGN_OR_RETURN(s->engine_, Engine::Create(model, backend, o.engine));
  s->scheduler_ = std::make_unique<Scheduler>(o.scheduler, s->engine_->kv(), observer);
  s->loop_ = std::make_unique<EngineLoop>(*s->scheduler_, *s->engine_, observer);
  return s;
}

Serving::~Serving() {
  if (loop_ != nullptr) loop_->Stop();
}

}  // namespace ps::server
