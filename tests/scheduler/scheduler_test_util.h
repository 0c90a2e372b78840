// Shared by the scheduler's integration tests: a sink that records a request's
// events, the serving core (engine, scheduler, engine loop) over stories260K, and
// a fixture with request builders and offline references.
#pragma once

#include <future>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "gtest/gtest.h"
#include "server/serving.h"
#include "tests/engine/guarded_backend.h"
#include "tests/engine/test_calibration.h"
#include "tests/test_env.h"

namespace ps {

inline const std::string kStories = testing::TestDataDir() + "/stories260K/stories260K.gguf";

// Collects a request's events; Wait() blocks until Finished arrives.
class CollectingSink : public RequestSink {
 public:
  void OnEvent(RequestEvent ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ev.kind == RequestEvent::Kind::kTokens) {
      for (const auto& t : ev.tokens) tokens.push_back(t.token);
      text += ev.text;
      if (on_token) on_token(tokens.size());
    } else {
      finished = ev;
      done = true;
      cv_.notify_all();
    }
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(300), [&] { return done; });
  }
  std::vector<int32_t> tokens;
  std::string text;
  RequestEvent finished;
  bool done = false;
  std::function<void(size_t)> on_token;  // called on the engine thread

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// The KV type of these tests: they compare a request's tokens in batches of different
// make-up (and offline). Products of one row and of many take different paths (a dot
// product, an sgemm) that may differ in the last bit; a 16-bit KV rounds such a
// difference up to 2^-8, enough to flip a near-tie of stories260K (as BF16 did in a CI
// run of the mixed-strategy test). F32 keeps it in the last bit.
inline constexpr DType kTestKvDType = DType::kF32;

// The serving core on the test backend ($PS_TEST_DEVICE, tests/test_env.h), with the
// engine loop's thread-safe face, on a kTestKvDType KV cache. With `guarded`, a
// host-addressable backend (the CPU) sits behind a GuardedBackend: as on a GPU, host
// code then reaches activations only through copies.
class Served {
 public:
  Served(const Model& model, ThreadPool& pool, server::ServingOptions options, SchedulerObserver* observer = nullptr,
         bool guarded = false)
      : backend_(testing::TestBackend(pool)), guarded_(*backend_), guarding_(guarded && backend_->host_addressable()) {
    Backend& backend = guarding_ ? static_cast<Backend&>(guarded_) : *backend_;
    options.engine.kv_dtype = kTestKvDType;
    options.scheduler.verify_kv = true;  // the KV owner's invariants after every step
    auto s = server::Serving::Create(model, backend, options, observer);
    EXPECT_TRUE(s.ok()) << s.status();
    serving_ = std::move(*s);
  }
  absl::Status Submit(std::shared_ptr<Request> r) { return serving_->loop().Submit(std::move(r)); }
  bool Abort(const std::string& id) { return serving_->loop().Abort(id); }
  LoadSnapshot Load() const { return serving_->loop().Load(); }
  void Stop() { serving_->loop().Stop(); }
  EngineLoop& loop() { return serving_->loop(); }
  // EngineLoop::FlushPrefixCache, waited for.
  absl::StatusOr<int64_t> FlushPrefixCache() {
    std::promise<absl::StatusOr<int64_t>> done;
    serving_->loop().FlushPrefixCache([&](absl::StatusOr<int64_t> freed) { done.set_value(std::move(freed)); });
    return done.get_future().get();
  }
  const testing::GuardedBackend& guarded() const { return guarded_; }
  bool guarding() const { return guarding_; }  // whether the guard is in use

 private:
  std::unique_ptr<Backend> backend_;
  testing::GuardedBackend guarded_;  // destroyed after serving_ (its activations)
  bool guarding_;
  std::unique_ptr<server::Serving> serving_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::Load(kStories)->release(); }
  static void TearDownTestSuite() { delete model_; }

  std::shared_ptr<Request> Make(const std::string& id, std::vector<int32_t> prompt, int n, int priority = 0) {
    auto r = std::make_shared<Request>();
    r->id = id;
    r->spec.prompt = std::move(prompt);
    r->spec.sampling.temperature = 0;
    r->spec.stop.max_new_tokens = n;
    r->spec.stop.ignore_eos = true;
    r->priority = priority;
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    sinks_[id] = sink;
    return r;
  }
  // Greedy tokens from the offline generator, with a fresh instance of `pruning`'s strategy.
  std::vector<int32_t> Offline(const std::vector<int32_t>& prompt, int n, const PruningParams& pruning = {}) {
    Generator gen(*model_, *backend_, kTestKvDType);
    const std::unique_ptr<PruningStrategy> strategy = pruning.Make(model_->config());
    return gen
        .Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true},
                  nullptr, strategy.get())
        ->tokens;
  }
  // The model's defaults for strategy `name` with `args` applied.
  PruningParams Pruning(const std::string& name, const std::vector<std::string>& args = {}) {
    absl::StatusOr<PruningParams> p =
        StrategyDefaults::ForModel(model_->config(), {}, testing::TestCalibration(model_->config()))
            ->WithArgs(name, args, "pruning");
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : PruningParams{};
  }

  static inline Model* model_ = nullptr;
  ThreadPool pool_{2};
  std::unique_ptr<Backend> backend_ = testing::TestBackend(pool_);
  std::map<std::string, std::shared_ptr<CollectingSink>> sinks_;
};

inline std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 3 + (i * 7) % 20; ++k) p.push_back(300 + (i * 31 + k * 13) % 200);
  return p;
}

}  // namespace ps
