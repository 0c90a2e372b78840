#include "tests/server/server_test_util.h"

#include "engine/generator.h"
#include "engine/pruning/registry.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/engine/test_calibration.h"

namespace ps::testing {

const std::string kStories = std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf";
const std::string kDefaultModel = std::string(PS_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

std::vector<int32_t> Offline(const std::vector<int32_t>& prompt, int n, const std::string& strategy,
                             const std::vector<std::string>& args) {
  static auto* model = Model::Load(kStories)->release();
  const absl::StatusOr<PruningParams> params =
      StrategyDefaults::ForModel(model->config(), {}, TestCalibration(model->config()))
          ->WithArgs(strategy, args, "pruning");
  EXPECT_TRUE(params.ok()) << params.status();
  const std::unique_ptr<PruningStrategy> pruner = params->Make(model->config());
  ThreadPool pool(1);
  CpuBackend backend(pool);
  Generator gen(*model, backend, DType::kF32);
  auto r = gen.Generate(prompt, SamplingParams{.temperature = 0}, StopCriteria{.max_new_tokens = n, .ignore_eos = true},
                        nullptr, pruner.get());
  EXPECT_TRUE(r.ok()) << r.status();
  return r->tokens;
}

// Flags of a stories260K server on an F32 KV cache, for the tests of tokens. These tests compare streamed tokens
// with Offline's, computed in batches of another make-up: products of one row and of
// many take different paths (a dot product, an sgemm) that may differ in the last bit,
// and a 16-bit KV rounds such a difference up to 2^-8, enough to flip a near-tie of
// this tiny model (as BF16 did in a CI run of the scheduler's mixed-strategy test).
std::vector<std::string> StoriesOnF32Kv(std::vector<std::string> flags) {
  flags.insert(flags.begin(), {"--model", kStories, "--kv-dtype", "f32"});
  return flags;
}

std::vector<int32_t> PromptOf(int i) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 4 + i; ++k) p.push_back(300 + (i * 37 + k * 11) % 180);
  return p;
}

bool Drained(ServerProcess& s) {
  auto stub = s.Stub();
  return WaitFor(
      [&] {
        grpc::ClientContext ctx;
        pb::LoadInfo load;
        if (!stub->GetLoad(&ctx, {}, &load).ok()) return false;
        // Idle: the blocks still in use are the prefix cache's.
        return load.running() == 0 && load.waiting() == 0 && load.kv(0).used_tokens() == load.kv(0).cached_tokens();
      },
      std::chrono::seconds(20));
}

}  // namespace ps::testing
