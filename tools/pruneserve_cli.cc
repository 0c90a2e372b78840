// pruneserve-cli: a command-line client of the pruneserve gRPC API. The exit code
// is the gRPC status code of the call (0 = OK).
#include <chrono>
#include <cstdio>
#include <iostream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/flags.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/client_channel.h"
#include "proto/field_args.h"
#include "pruneserve/v1/generation.grpc.pb.h"

namespace {

namespace pb = ::pruneserve::v1;

constexpr char kUsage[] =
    "Usage: pruneserve-cli [--addr host:port] COMMAND [flags]\n"
    "Commands:\n"
    "  generate --prompt TEXT   stream a completion of TEXT to stdout\n"
    "  chat --prompt TEXT       stream an answer to a user message (model's chat template)\n"
    "  tokenize --prompt TEXT   print token ids\n"
    "  info                     print model information\n"
    "  health                   print SERVING / NOT_SERVING\n"
    "  abort --request-id ID    cancel a running request\n"
    "  load                     print the running and waiting requests and the KV tiers' use\n"
    "  flush-cache              drop every cached prompt prefix no request holds\n"
    "Run `pruneserve-cli COMMAND --help` for the flags. The exit code is the gRPC status code.\n";

int Report(const grpc::Status& s) {
  if (!s.ok())
    std::fprintf(stderr, "pruneserve-cli: %d %s\n", static_cast<int>(s.error_code()), s.error_message().c_str());
  return static_cast<int>(s.error_code());
}

const char* ReasonName(pb::FinishReason r) {
  switch (r) {
    case pb::FINISH_REASON_STOP: return "stop";
    case pb::FINISH_REASON_LENGTH: return "length";
    case pb::FINISH_REASON_STOP_SEQUENCE: return "stop_sequence";
    case pb::FINISH_REASON_CANCELLED: return "cancelled";
    case pb::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr = "127.0.0.1:50051";
  // The command is the first argument that does not start with "--" (after --addr's value).
  int cmd_at = 1;
  while (cmd_at < argc) {
    const std::string a = argv[cmd_at];
    if (a == "--addr" && cmd_at + 1 < argc) {
      addr = argv[cmd_at + 1];
      cmd_at += 2;
    } else if (a.rfind("--addr=", 0) == 0) {
      addr = a.substr(7);
      ++cmd_at;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else {
      break;
    }
  }
  if (cmd_at >= argc) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  const std::string cmd = argv[cmd_at];
  std::string prompt, system, request_id, cache_salt;
  std::vector<std::string> stops, strategy_args;
  std::string strategy = "full";
  bool report = false;
  int64_t max_new = -1, top_k = -1, seed = -1, logprobs = 0, priority = 0;
  double temperature = -1, top_p = -1, timeout = 0;
  bool stats = false, ids = false;
  ps::ClientChannelOptions channel_options;
  ps::FlagParser f("pruneserve-cli " + cmd, kUsage);
  f.AddString("prompt", &prompt, "input text (generate, chat, tokenize)");
  f.AddString("system", &system, "system message (chat)");
  f.AddString("request-id", &request_id, "request id (generate, chat, abort)");
  f.AddString("cache-salt", &cache_salt,
              "keeps the request's prompt prefixes apart in the server's prefix cache (generate, chat)");
  f.AddInt("max-new-tokens", &max_new, "tokens to generate at most (-1 = server default)");
  f.AddFloat("temperature", &temperature, "0 = greedy (-1 = server default)");
  f.AddFloat("top-p", &top_p, "nucleus mass (-1 = server default)");
  f.AddInt("top-k", &top_k, "top-k (-1 = server default)");
  f.AddInt("seed", &seed, "random seed (-1 = none)");
  f.AddStringList("stop", &stops, "stop string");
  f.AddInt("logprobs", &logprobs, "print top-N log-probabilities per token to stderr");
  f.AddInt("priority", &priority, "scheduling priority (higher first)");
  f.AddFloat("timeout", &timeout, "deadline in seconds (0 = none)");
  f.AddBool("stats", &stats, "print usage and timings to stderr");
  f.AddBool("ids", &ids, "print token ids instead of text (generate, chat)");
  f.AddString("strategy", &strategy,
              absl::StrCat("token pruning strategy: ", absl::StrJoin(ps::StrategyMessageNames(), " | "),
                           " (`info` lists the defaults)"));
  f.AddStringList("strategy-arg", &strategy_args,
                  "strategy parameter key=value, lists comma-separated (e.g. top_k=512, keep=0.5,0.3)");
  f.AddBool("report", &report, "print the prompt spans the model kept to stderr (return_pruning_report)");
  ps::AddClientChannelFlags(f, &channel_options);
  std::vector<std::string> positional;
  if (absl::Status s = f.Parse(argc - cmd_at, argv + cmd_at, &positional); !s.ok()) {
    std::fprintf(stderr, "pruneserve-cli: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return 0;
  }
  if (prompt.empty() && !positional.empty()) prompt = absl::StrJoin(positional, " ");

  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ps::CreateClientChannel(addr, channel_options);
  if (!channel.ok()) {
    std::fprintf(stderr, "pruneserve-cli: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = pb::Generation::NewStub(*channel);
  grpc::ClientContext ctx;
  if (timeout > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  }

  if (cmd == "generate" || cmd == "chat") {
    pb::GenerateRequest req;
    req.set_request_id(request_id);
    if (cmd == "chat") {
      if (!system.empty()) {
        auto* m = req.mutable_messages()->add_messages();
        m->set_role("system");
        m->set_content(system);
      }
      auto* m = req.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(prompt);
    } else {
      req.set_text(prompt);
    }
    if (max_new >= 0) req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_new));
    for (const auto& s : stops) req.mutable_stopping()->add_stop(s);
    if (temperature >= 0) req.mutable_sampling()->set_temperature(static_cast<float>(temperature));
    if (top_p >= 0) req.mutable_sampling()->set_top_p(static_cast<float>(top_p));
    if (top_k >= 0) req.mutable_sampling()->set_top_k(static_cast<int32_t>(top_k));
    if (seed >= 0) req.mutable_sampling()->set_seed(static_cast<uint64_t>(seed));
    req.set_top_logprobs(static_cast<uint32_t>(logprobs));
    req.set_priority(static_cast<int32_t>(priority));
    if (absl::Status s = ps::SetStrategyArgs(strategy, strategy_args, req.mutable_pruning()); !s.ok()) {
      std::fprintf(stderr, "pruneserve-cli: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    req.set_return_pruning_report(report);
    req.set_cache_salt(cache_salt);
    auto reader = stub->Generate(&ctx, req);
    pb::GenerateResponse resp;
    std::vector<int32_t> all_ids;
    while (reader->Read(&resp)) {
      if (resp.has_prompt_info() && stats) {
        std::fprintf(stderr, "request %s: %u prompt tokens, strategy %s\n", resp.prompt_info().request_id().c_str(),
                     resp.prompt_info().prompt_tokens(), resp.prompt_info().strategy().c_str());
      } else if (resp.has_chunk()) {
        all_ids.insert(all_ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
        if (!ids) std::cout << resp.chunk().text() << std::flush;
        for (const auto& lp : resp.chunk().logprobs()) {
          std::string line = absl::StrCat("token ", lp.token_id(), " logprob ", lp.logprob(), " top:");
          for (const auto& a : lp.top()) absl::StrAppend(&line, " ", a.token_id(), "=", a.logprob());
          std::fprintf(stderr, "%s\n", line.c_str());
        }
      } else if (resp.has_finished()) {
        const auto& fin = resp.finished();
        if (ids) std::cout << absl::StrJoin(all_ids, " ");
        std::cout << std::endl;
        if (stats) {
          const auto& u = fin.usage();
          std::fprintf(
              stderr,
              "finish %s%s; prompt %u tokens (computed %.1f, cached %u), completion %u tokens; queue %.3f s, "
              "ttft %.3f s, total %.3f s (%.1f tok/s)\n",
              ReasonName(fin.reason()), fin.matched_stop().empty() ? "" : (" '" + fin.matched_stop() + "'").c_str(),
              u.prompt_tokens(), u.prompt_tokens_computed(), u.cached_tokens(), u.completion_tokens(),
              u.queue_time_seconds(), u.time_to_first_token_seconds(), u.total_time_seconds(),
              u.completion_tokens() > 1 ? (u.completion_tokens() - 1) /
                                              std::max(1e-9, u.total_time_seconds() - u.time_to_first_token_seconds())
                                        : 0.0);
          std::string layers;
          for (const auto& lt : u.kept_per_layer()) absl::StrAppend(&layers, " ", lt.layer(), ":", lt.tokens());
          std::fprintf(stderr, "prompt tokens entering layers (layer:tokens):%s\n", layers.c_str());
        }
        if (fin.has_pruning_report()) {
          std::fprintf(stderr, "kept %u prompt tokens in %d spans:\n", fin.pruning_report().kept_tokens(),
                       fin.pruning_report().kept_size());
          for (const auto& span : fin.pruning_report().kept()) {
            std::fprintf(stderr, "  [%u, %u) %s\n", span.begin(), span.end(), span.text().c_str());
          }
        }
      }
    }
    return Report(reader->Finish());
  }
  if (cmd == "tokenize") {
    pb::TokenizeRequest req;
    req.set_text(prompt);
    pb::TokenizeResponse resp;
    grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (s.ok()) std::cout << absl::StrJoin(resp.token_ids(), " ") << "\n";
    return Report(s);
  }
  if (cmd == "info") {
    pb::ModelInfo resp;
    grpc::Status s = stub->GetModelInfo(&ctx, pb::GetModelInfoRequest(), &resp);
    if (s.ok()) std::cout << resp.DebugString();
    return Report(s);
  }
  if (cmd == "health") {
    auto health = grpc::health::v1::Health::NewStub(*channel);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    if (s.ok()) std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
    return Report(s);
  }
  if (cmd == "abort") {
    pb::AbortRequest req;
    req.set_request_id(request_id);
    pb::AbortResponse resp;
    grpc::Status s = stub->Abort(&ctx, req, &resp);
    if (s.ok()) std::cout << (resp.found() ? "aborted" : "not found") << "\n";
    return Report(s);
  }
  if (cmd == "load") {
    pb::LoadInfo resp;
    grpc::Status s = stub->GetLoad(&ctx, pb::GetLoadRequest(), &resp);
    if (s.ok()) std::cout << resp.DebugString();
    return Report(s);
  }
  if (cmd == "flush-cache") {
    pb::FlushCacheResponse resp;
    grpc::Status s = stub->FlushCache(&ctx, pb::FlushCacheRequest(), &resp);
    if (s.ok()) std::cout << "dropped " << resp.dropped_blocks() << " blocks\n";
    return Report(s);
  }
  std::fprintf(stderr, "pruneserve-cli: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
