// Added latency of the gRPC path: time to first token and time per output token
// for the same prompt, offline (Generator in this process) and through a running
// server (measured by this client). Start the server first, e.g. with
// bench/server_latency.sh, which does everything.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <grpcpp/grpcpp.h>

#include "base/flags.h"
#include "engine/generator.h"
#include "kernels/cpu/cpu_backend.h"
#include "memory/kv_geometry.h"
#include "pruneserve/v1/generation.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Timing {
  double ttft_ms = 1e30, tpot_ms = 1e30;  // best of the repeats
  void Add(double ttft, double tpot) {
    ttft_ms = std::min(ttft_ms, ttft);
    tpot_ms = std::min(tpot_ms, tpot);
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", addr = "127.0.0.1:50051",
              kv_dtype = kDefaultKvDTypeName;
  int64_t prompt_tokens = 128, new_tokens = 64, repeats = 5, threads = 2;
  FlagParser f("ps_bench_server_latency", "TTFT and time per token: offline engine vs through the gRPC server.");
  f.AddString("model", &model_path, "model file (the server must serve the same one)");
  f.AddString("addr", &addr, "server address");
  f.AddInt("prompt-tokens", &prompt_tokens, "prompt length");
  f.AddInt("new-tokens", &new_tokens, "tokens generated per request");
  f.AddInt("repeats", &repeats, "best of this many runs");
  f.AddInt("threads", &threads, "compute threads of the offline engine (use the server's)");
  f.AddString("kv-dtype", &kv_dtype, "f32 | f16 | bf16 | q8_0: the offline engine's KV cache (use the server's)");
  if (auto s = f.Parse(argc, argv); !s.ok() || f.help_requested()) {
    std::printf("%s%s\n", f.Help().c_str(), s.ok() ? "" : std::string(s.message()).c_str());
    return s.ok() ? 0 : 1;
  }
  const absl::StatusOr<DType> kv = ParseKvDType(kv_dtype);
  if (!kv.ok()) {
    std::fprintf(stderr, "%s\n", std::string(kv.status().message()).c_str());
    return 1;
  }
  auto model = Model::Load(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < prompt_tokens; ++i) prompt.push_back(500 + (i * 7919) % 20000);

  Timing offline, served;
  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool);
  Generator gen(**model, backend, *kv);
  const SamplingParams greedy{.temperature = 0};
  const StopCriteria stop{.max_new_tokens = static_cast<int>(new_tokens), .ignore_eos = true};
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    Clock::time_point first{};
    int n = 0;
    auto res = gen.Generate(prompt, greedy, stop, [&](const SampledToken&, std::string_view) {
      if (n++ == 0) first = Clock::now();
      return true;
    });
    const auto t1 = Clock::now();
    if (!res.ok()) return 1;
    offline.Add(Ms(first - t0), Ms(t1 - first) / (n - 1));
  }

  auto stub = pruneserve::v1::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  pruneserve::v1::GenerateRequest req;
  for (int32_t t : prompt) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(new_tokens));
  req.mutable_stopping()->set_ignore_eos(true);
  for (int r = 0; r < repeats; ++r) {
    grpc::ClientContext ctx;
    const auto t0 = Clock::now();
    auto reader = stub->Generate(&ctx, req);
    pruneserve::v1::GenerateResponse resp;
    Clock::time_point first{};
    int n = 0;
    while (reader->Read(&resp)) {
      if (!resp.has_chunk()) continue;
      if (n == 0) first = Clock::now();
      n += resp.chunk().token_ids_size();
    }
    const auto t1 = Clock::now();
    if (grpc::Status s = reader->Finish(); !s.ok() || n != new_tokens) {
      std::fprintf(stderr, "server: %s (%d tokens)\n", s.error_message().c_str(), n);
      return 1;
    }
    served.Add(Ms(first - t0), Ms(t1 - first) / (n - 1));
  }
  std::printf("prompt %lld tokens, %lld new tokens, best of %lld\n", static_cast<long long>(prompt_tokens),
              static_cast<long long>(new_tokens), static_cast<long long>(repeats));
  std::printf("offline  ttft_ms %.2f  per_token_ms %.3f\n", offline.ttft_ms, offline.tpot_ms);
  std::printf("server   ttft_ms %.2f  per_token_ms %.3f\n", served.ttft_ms, served.tpot_ms);
  std::printf("added    ttft_ms %.2f  per_token_ms %.3f\n", served.ttft_ms - offline.ttft_ms,
              served.tpot_ms - offline.tpot_ms);
  return 0;
}
