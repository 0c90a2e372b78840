#include "server/server_app.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fault.h"
#include "base/thread_pool.h"
#include "engine/pruning/registry.h"
#include "engine/sequence.h"
#include "memory/kv_geometry.h"
#include "server/access.h"
#include "server/generation_service.h"
#include "server/http_front.h"
#include "server/serving.h"
#include "server/tls.h"

namespace ps::server {
namespace {

// MemAvailable of /proc/meminfo, in bytes.
absl::StatusOr<int64_t> AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return absl::UnavailableError("no MemAvailable in /proc/meminfo");
}

absl::Status Error(const std::string& message) { return absl::InvalidArgumentError(message); }

}  // namespace

absl::Status RunServer(ServerOptions o) {
  // SIGINT/SIGTERM are taken by sigwait in this thread; blocked before any thread starts, as
  // every thread inherits the mask: gRPC starts its own as soon as credentials are made, and a
  // thread that left SIGTERM unblocked could take it and die of it (exit -15 once in CI).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a write to a client that went away fails instead

  if (o.model.empty()) return Error("--model is required (see --help)");
  if (o.port < 0 || o.port > 65535 || o.metrics_port < -1 || o.metrics_port > 65535 || o.http_port < -1 ||
      o.http_port > 65535) {
    return Error("bad port");
  }
  if (o.http_threads < 1 || o.max_request_bytes < 1 || o.max_request_bytes > INT32_MAX) {
    return Error("--http-threads must be >= 1 and --max-request-bytes in [1, 2^31)");
  }
  if (o.max_prompt_tokens < 0 || o.max_new_tokens < 0 || o.max_stop_strings < 0 || o.max_stop_string_bytes < 0 ||
      o.max_streams_per_client < 0 || o.max_stream_backlog < 1 || o.max_prompt_tokens > INT32_MAX ||
      o.max_new_tokens > INT32_MAX || o.max_stop_strings > INT32_MAX || o.max_stop_string_bytes > INT32_MAX ||
      o.max_streams_per_client > INT32_MAX) {
    return Error(
        "--max-prompt-tokens, --max-new-tokens, --max-stop-strings, --max-stop-string-bytes and "
        "--max-streams-per-client must be in [0, 2^31)");
  }
  const TlsFiles tls{.cert = o.tls_cert, .key = o.tls_key, .client_ca = o.tls_client_ca};
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = GrpcServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  for (const std::string& spec : o.inject_faults) {
    if (absl::Status s = fault::Arm(spec); !s.ok()) return Error(absl::StrCat("--inject-fault: ", s.message()));
  }
  std::vector<std::string> api_keys;
  if (!o.api_key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> keys = LoadApiKeys(o.api_key_file);
    if (!keys.ok()) return keys.status();
    api_keys = *std::move(keys);
  }
  if (o.served_model_names.empty()) {
    std::filesystem::path p(o.model);
    if (p.filename().empty()) p = p.parent_path();  // a folder given with a trailing slash
    o.served_model_names.push_back(p.extension() == ".gguf" ? p.stem().string() : p.filename().string());
  }
  if (o.max_queue < 1 || o.max_running < 1 || o.max_batch_tokens < 1 || o.prefill_chunk < 1 || o.threads < 0 ||
      o.drain_timeout < 0 || o.default_max_new_tokens < 1 || o.kv_block_size < 1 || o.kv_block_size > 4096 ||
      o.kv_device_bytes < 1 || o.kv_host_bytes < 0 || o.gather_first < 0) {
    return Error(
        "--max-queue, --max-running, --max-batch-tokens, --prefill-chunk, --default-max-new-tokens, "
        "--kv-block-size (<= 4096), --kv-device-bytes must be >= 1; --threads, --drain-timeout, "
        "--kv-host-bytes, --gather-first >= 0");
  }
  const absl::StatusOr<DType> parsed_kv_dtype = ParseKvDType(o.kv_dtype);
  if (!parsed_kv_dtype.ok()) return parsed_kv_dtype.status();
  const DType kv_dtype = *parsed_kv_dtype;
  if (o.kv_device_fraction < 0 || o.kv_host_fraction < 0 || o.kv_device_fraction > 0.9 || o.kv_host_fraction > 0.9) {
    return Error("--kv-device-fraction and --kv-host-fraction must be between 0 and 0.9");
  }
  const absl::StatusOr<bool> int8_activations = ParseActivations(o.activations);
  if (!int8_activations.ok()) return int8_activations.status();
  if (!o.cpu_isa.empty()) {
    if (absl::Status s = CapCpuKernels(o.cpu_isa); !s.ok()) return Error(absl::StrCat("--cpu-isa: ", s.message()));
  }
  if (o.prefix_cache != "on" && o.prefix_cache != "off") {
    return Error("--prefix-cache must be on or off, not '" + o.prefix_cache + "'");
  }
  if (o.preemption != "swap" && o.preemption != "recompute") {
    return Error("--preemption must be swap or recompute, not '" + o.preemption + "'");
  }
  const auto level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off") return Error("unknown --log-level " + o.log_level);
  spdlog::set_level(level);
  if (!o.inject_faults.empty()) {
    spdlog::warn("fault injection armed (testing only): {}", absl::StrJoin(o.inject_faults, ", "));
  }

  // The backend before anything listens: a --device that cannot run is one line and a non-zero exit.
  ThreadPool pool(static_cast<int>(o.threads));
  std::string device_note;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(o.device, pool, CpuBackendOptions{.int8_activations = *int8_activations}, &device_note);
  if (!backend.ok()) return backend.status();
  spdlog::info("device: {}", device_note);
  const bool cpu = (*backend)->kind() == DeviceKind::kCpu;
  if (cpu) spdlog::info("CPU kernels: {}; {} activations", DescribeCpuKernels(), o.activations);
  // The KV tiers from fractions of free memory: the host tier's of host memory; the
  // device tier's of device memory on a GPU (once the weights are there, below), of
  // host memory on the CPU, where the two tiers share it.
  const bool device_memory = (*backend)->kind() == DeviceKind::kCuda;
  if (!device_memory && o.kv_device_fraction + o.kv_host_fraction > 0.9) {
    return Error(
        "on the CPU both KV tiers are host memory: --kv-device-fraction and --kv-host-fraction must add up "
        "to 0.9 at most");
  }
  if (o.kv_host_fraction > 0 || (!device_memory && o.kv_device_fraction > 0)) {
    const absl::StatusOr<int64_t> available = AvailableMemoryBytes();
    if (!available.ok()) return Error(absl::StrCat("KV tier fractions: ", available.status().message()));
    if (!device_memory && o.kv_device_fraction > 0) {
      o.kv_device_bytes = static_cast<int64_t>(*available * o.kv_device_fraction);
    }
    if (o.kv_host_fraction > 0) o.kv_host_bytes = static_cast<int64_t>(*available * o.kv_host_fraction);
    spdlog::info("KV tiers from fractions of {:.0f} MiB of host memory available: {}host {:.0f} MiB",
                 *available / 1048576.0,
                 device_memory ? "" : absl::StrCat("device ", o.kv_device_bytes / 1048576, " MiB, "),
                 o.kv_host_bytes / 1048576.0);
  }

  AccessControl access(std::move(api_keys), static_cast<int>(o.max_streams_per_client));
  GenerationService service(&access);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.port), *credentials, &grpc_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_request_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0) return Error(absl::StrCat("cannot listen on ", o.host, ":", o.port));
  grpc::HealthCheckServiceInterface* health = grpc_server->GetHealthCheckService();
  health->SetServingStatus(false);  // NOT_SERVING while the model loads
  spdlog::info("listening on {}:{} (gRPC{}{}{})", o.host, grpc_port, tls.enabled() ? ", TLS" : "",
               tls.client_ca.empty() ? "" : ", client certificates required",
               access.requires_token() ? ", API key required" : "");

  Metrics metrics;
  {
    std::vector<std::string> names;
    for (const StrategyInfo* s : Strategies()) names.push_back(s->name);
    metrics.AddStrategies(names);
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = -1;
  if (o.metrics_port >= 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(absl::StrCat(o.host, ":", o.metrics_port));
    } catch (const std::exception& e) {
      return Error(absl::StrCat("cannot serve metrics on port ", o.metrics_port, ": ", e.what()));
    }
    exposer->RegisterCollectable(metrics.registry());
    metrics_port = exposer->GetListeningPorts().at(0);
    spdlog::info("metrics on http://{}:{}/metrics", o.host, metrics_port);
  }
  std::unique_ptr<HttpFront> http;
  if (o.http_port >= 0) {
    absl::StatusOr<std::unique_ptr<HttpFront>> front =
        HttpFront::Start({.host = o.host,
                          .port = static_cast<int>(o.http_port),
                          .threads = static_cast<int>(o.http_threads),
                          .max_body_bytes = static_cast<size_t>(o.max_request_bytes),
                          .served_models = o.served_model_names,
                          .tls = tls},
                         metrics.registry(), &access);
    if (!front.ok()) return front.status();
    http = *std::move(front);
    spdlog::info("OpenAI-compatible API on {}://{}:{}/v1 (model {})", tls.enabled() ? "https" : "http", o.host,
                 http->port(), absl::StrJoin(o.served_model_names, ", "));
  }
  if (!o.port_file.empty()) {
    std::ofstream pf(o.port_file + ".tmp");
    pf << "grpc=" << grpc_port << "\nmetrics=" << metrics_port << "\nhttp=" << (http ? http->port() : -1) << "\n";
    pf.close();
    std::rename((o.port_file + ".tmp").c_str(), o.port_file.c_str());
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto model = Model::Load(o.model);
  if (!model.ok()) {
    grpc_server->Shutdown();
    return Error(absl::StrCat("cannot load the model: ", model.status().message()));
  }
  const ModelConfig& c = (*model)->config();
  absl::StatusOr<ChatTemplatePtr> chat = absl::FailedPreconditionError("the model has no tokenizer: send token ids");
  if ((*model)->tokenizer() != nullptr) chat = ChatTemplate::Load(*(*model)->tokenizer(), o.chat_template);
  if (chat.ok()) {
    spdlog::info("chat template: {}", o.chat_template.empty() ? "the model's own" : o.chat_template);
  } else if (!o.chat_template.empty()) {
    grpc_server->Shutdown();
    return Error(absl::StrCat("--chat-template: ", chat.status().message()));
  } else {
    spdlog::warn("chat messages will be refused: {}", std::string(chat.status().message()));
  }
  {  // the weights in the backend's layouts (a GPU's copies), then the device tier from what is left
    const auto w0 = std::chrono::steady_clock::now();
    const absl::StatusOr<size_t> packed = PrepareWeights(**model, **backend);
    const absl::StatusOr<int64_t> free = !packed.ok()    ? packed.status()
                                         : device_memory ? (*backend)->FreeDeviceBytes()
                                                         : int64_t{0};
    if (!free.ok()) {
      grpc_server->Shutdown();
      return Error(absl::StrCat("preparing the weights: ", free.status().message()));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    if (*packed > 0) {
      spdlog::info("weights repacked for the CPU kernels (int8 or BF16) in {:.1f} s ({:.0f} MiB)", seconds, *packed / 1048576.0);
    }
    if (device_memory) {
      spdlog::info("weights on the device in {:.1f} s; {:.0f} MiB of device memory free", seconds, *free / 1048576.0);
      if (o.kv_device_fraction > 0) {
        o.kv_device_bytes = static_cast<int64_t>(*free * o.kv_device_fraction);
        spdlog::info("KV device tier from --kv-device-fraction: {:.0f} MiB", o.kv_device_bytes / 1048576.0);
      }
    }
  }
  const KvGeometry geometry{.n_layers = c.n_layers,
                            .block_tokens = static_cast<int>(o.kv_block_size),
                            .kv_dim = c.kv_dim(),
                            .n_kv_heads = c.n_kv_heads,
                            .dtype = kv_dtype};
  if (const absl::Status valid = geometry.Validate(); !valid.ok()) {
    return Error(absl::StrCat("--kv-dtype ", o.kv_dtype, ": ", valid.message()));
  }
  const int64_t kv_blocks = geometry.BlocksInBytes(o.kv_device_bytes);
  if (kv_blocks < geometry.BlocksForTokens(1)) {
    return Error(absl::StrCat("--kv-device-bytes ", o.kv_device_bytes, " holds ", kv_blocks, " blocks of ",
                              geometry.block_bytes(), " bytes; one token needs ", geometry.BlocksForTokens(1), " (",
                              geometry.blocks_per_page(), " per layer)"));
  }
  const int64_t host_blocks = geometry.BlocksInBytes(o.kv_host_bytes);
  const PreemptionMode preemption = o.preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  ServiceState state{.model = model->get(),
                     .metrics = &metrics,
                     .kv_block_tokens = geometry.block_tokens,
                     .kv_token_blocks = geometry.BlocksForTokens(1),
                     .max_stream_backlog = static_cast<size_t>(o.max_stream_backlog)};
  const absl::StatusOr<CalibrationPtr> calibration = ResolveCalibration(**model, **backend,
                                                                        {.file = o.pod_groups,
                                                                         .model_path = o.model,
                                                                         .text = o.calibrate_text,
                                                                         .cache_dir = o.calibration_cache,
                                                                         .auto_table = o.auto_table});
  if (!calibration.ok()) return calibration.status();
  if (absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(c, o.strategy_args, *calibration); d.ok()) {
    state.defaults.strategies = std::make_shared<const StrategyDefaults>(*std::move(d));
  } else {
    return Error(absl::StrCat("--strategy-arg: ", d.status().message()));
  }
  for (const StrategyInfo* s : Strategies()) {
    const PruningParams p = *state.defaults.strategies->Get(s->name);
    const std::string args = PruningArgsText(p);
    const absl::Status usable = p.params != nullptr ? p.params->Validate(c, s->name) : absl::OkStatus();
    const std::string caveat = p.params != nullptr ? p.params->Caveat() : std::string();
    spdlog::info("strategy {} defaults: {}{}{}", s->name, args.empty() ? "(none)" : args,
                 usable.ok() ? "" : absl::StrCat(" (unavailable: ", usable.message(), ")"),
                 caveat.empty() ? "" : absl::StrCat(" (", caveat, ")"));
  }
  absl::StatusOr<std::unique_ptr<Serving>> serving =
      Serving::Create(**model, **backend,
                      ServingOptions{.engine = {.kv_block_tokens = geometry.block_tokens,
                                                .kv_dtype = kv_dtype,
                                                .kv_device_blocks = kv_blocks,
                                                .kv_host_blocks = host_blocks,
                                                .prefix_cache = o.prefix_cache == "on"},
                                     .scheduler = {.max_running = static_cast<int>(o.max_running),
                                                   .max_queue = static_cast<int>(o.max_queue),
                                                   .max_batch_tokens = static_cast<int>(o.max_batch_tokens),
                                                   .prefill_chunk = static_cast<int>(o.prefill_chunk),
                                                   .preemption = preemption,
                                                   .gather_first = static_cast<int>(o.gather_first)}},
                      &metrics);
  if (!serving.ok()) {
    grpc_server->Shutdown();
    return serving.status();
  }
  metrics.SetCacheConfig(geometry.block_tokens, o.kv_dtype, kv_blocks, host_blocks);
  for (auto [tier, blocks] : {std::pair{"device", kv_blocks}, std::pair{"host", host_blocks}}) {
    spdlog::info("KV cache: {} tier {} blocks of {} tokens of one KV head's K or V, {} ({:.0f} MiB, {} tokens)", tier,
                 blocks, o.kv_block_size, o.kv_dtype, blocks * static_cast<double>(geometry.block_bytes()) / (1 << 20),
                 blocks / geometry.BlocksForTokens(1) * o.kv_block_size);
  }
  spdlog::info("prefix cache: {}", o.prefix_cache);
  spdlog::info("preemption: {}{}", o.preemption,
               preemption == PreemptionMode::kSwap && host_blocks < geometry.BlocksForTokens(1)
                   ? " (no host tier: recompute)"
                   : "");
  EngineLoop& loop = (*serving)->loop();
  state.loop = &loop;
  state.device = std::string((*backend)->name());
  state.cpu_isa = cpu ? CpuKernelLevel() : "";
  state.activations = cpu ? o.activations : "";
  state.defaults.sampling.temperature = static_cast<float>(o.default_temperature);
  state.defaults.sampling.top_p = static_cast<float>(o.default_top_p);
  state.defaults.max_new_tokens = static_cast<int>(o.default_max_new_tokens);
  if (chat.ok()) state.defaults.tool_format = DetectToolFormat((*chat)->source());
  state.defaults.chat = std::move(chat);
  if ((*model)->tokenizer() != nullptr) state.defaults.grammar_vocab = GrammarVocabulary(*(*model)->tokenizer());
  state.defaults.limits = {.max_prompt_tokens = static_cast<int>(o.max_prompt_tokens),
                           .max_new_tokens = static_cast<int>(o.max_new_tokens),
                           .max_stop_strings = static_cast<int>(o.max_stop_strings),
                           .max_stop_string_bytes = static_cast<int>(o.max_stop_string_bytes)};
  if (absl::Status s = ValidateSamplingParams(state.defaults.sampling); !s.ok()) {
    return Error(absl::StrCat("default sampling: ", s.message()));
  }
  service.SetState(&state);
  if (http) http->SetState(&state);
  health->SetServingStatus(true);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  spdlog::info(
      "serving {} ({}, {} layers, context {}, vocab {}) from {}; {} compute threads, {} activations; "
      "up to {} running and {} queued requests; loaded in {:.2f} s, resident memory {:.0f} MiB",
      c.name, c.arch_name, c.n_layers, c.n_ctx, c.n_vocab, o.model, pool.num_threads(), cpu ? o.activations : "device",
      o.max_running, o.max_queue, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      ru.ru_maxrss / 1024.0);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("received {}: draining (up to {} s)", sig == SIGTERM ? "SIGTERM" : "SIGINT", o.drain_timeout);
  health->SetServingStatus(false);
  service.SetDraining(true);
  if (http) http->SetDraining(true);
  const auto drain_deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.drain_timeout);
  // Until the engine has finished every request and each stream has written its last message.
  auto busy = [&] { return loop.Load().in_flight > 0 || access.open_streams() > 0; };
  while (busy() && std::chrono::steady_clock::now() < drain_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a gauge, not synchronising
  }
  if (busy()) {
    spdlog::warn("drain timeout: cancelling the remaining requests");
    loop.CancelAll(CancelReason::kShutdown);
  }
  loop.Stop();   // finishes anything left with UNAVAILABLE
  http.reset();  // its open streams have ended; it reads `state`
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  spdlog::info("stopped");
  return absl::OkStatus();
}

}  // namespace ps::server
