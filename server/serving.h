// The serving core of one model, assembled over a Backend: the Engine on it, the
// Scheduler over the engine's KV accounting, and the EngineLoop that drives them.
// What main() builds once the model is loaded, and what the scheduler's
// integration tests build around stories260K.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "scheduler/engine_loop.h"

namespace ps::server {

struct ServingOptions {
  EngineOptions engine;
  SchedulerOptions scheduler;
};

class Serving {
 public:
  // `model` and `backend` must outlive the result.
  static absl::StatusOr<std::unique_ptr<Serving>> Create(const Model& model, Backend& backend,
                                                         const ServingOptions& options,
                                                         SchedulerObserver* observer = nullptr);
  ~Serving();  // stops the loop first

  EngineLoop& loop() { return *loop_; }

 private:
  Serving() = default;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<EngineLoop> loop_;
};

}  // namespace ps::server
