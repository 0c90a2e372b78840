// pruneserve: the gRPC inference server.
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

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fault.h"
#include "base/flags.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/pruning/registry.h"
#include "memory/kv_geometry.h"
#include "server/access.h"
#include "server/calibration_source.h"
#include "server/generation_service.h"
#include "server/http_front.h"
#include "server/serving.h"
#include "server/tls.h"

namespace {

struct Options {
  std::string model, host = "0.0.0.0", config, port_file, log_level = "info", preemption = "swap",
                     kv_dtype = ps::kDefaultKvDTypeName, device = "auto", pod_groups, calibrate_text, auto_table,
                     calibration_cache = ps::server::DefaultCacheDir(), tls_cert, tls_key, tls_client_ca, api_key_file,
                     activations = "int8", cpu_isa;
  std::vector<std::string> strategy_args, served_model_names, inject_faults;
  int64_t port = 50051, metrics_port = 9090, threads = 0, max_queue = 256, max_running = 64, max_batch_tokens = 2048,
          prefill_chunk = 512, default_max_new_tokens = 256, kv_block_size = 16, kv_device_bytes = int64_t{1} << 30,
          kv_host_bytes = int64_t{2} << 30, http_port = -1, http_threads = 128, max_request_bytes = int64_t{32} << 20,
          max_prompt_tokens = 0, max_new_tokens = 0, max_stop_strings = 16, max_stop_string_bytes = 256,
          max_streams_per_client = 0, max_stream_backlog = 4096, gather_first = 0;
  double drain_timeout = 30.0, default_temperature = 1.0, default_top_p = 1.0, kv_device_fraction = 0,
         kv_host_fraction = 0;
};

void AddFlags(ps::FlagParser& f, Options& o) {
  f.AddString("model", &o.model, "GGUF file or Hugging Face folder (required)");
  f.AddString("host", &o.host, "address to listen on");
  f.AddInt("port", &o.port, "gRPC port (0 = pick a free one)");
  f.AddInt("metrics-port", &o.metrics_port, "Prometheus /metrics port (0 = pick a free one, -1 = off)");
  f.AddInt("http-port", &o.http_port,
           "OpenAI-compatible HTTP port: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics "
           "(0 = pick a free one, -1 = off)");
  f.AddInt("http-threads", &o.http_threads, "HTTP connections served at once (a streaming request holds one)");
  f.AddInt("max-request-bytes", &o.max_request_bytes,
           "largest request: a gRPC message (RESOURCE_EXHAUSTED beyond) or an HTTP body (413 beyond)");
  f.AddInt("max-prompt-tokens", &o.max_prompt_tokens, "prompt tokens one request may send (0 = the context length)");
  f.AddInt("max-new-tokens", &o.max_new_tokens, "max_new_tokens one request may ask for (0 = the context length)");
  f.AddInt("max-stop-strings", &o.max_stop_strings, "stop strings one request may give");
  f.AddInt("max-stop-string-bytes", &o.max_stop_string_bytes, "bytes of one stop string at most");
  f.AddInt("max-streams-per-client", &o.max_streams_per_client,
           "generation requests one client address may have open at once, gRPC and HTTP together (0 = no limit)");
  f.AddInt("max-stream-backlog", &o.max_stream_backlog,
           "tokens a stream may hold for a client that does not read it; beyond, its request is cancelled "
           "with RESOURCE_EXHAUSTED (flow control: the server's memory per stream is bounded)");
  f.AddString("tls-cert", &o.tls_cert, "PEM certificate (chain) of the gRPC and HTTP ports; with --tls-key: TLS only");
  f.AddString("tls-key", &o.tls_key, "PEM private key of --tls-cert");
  f.AddString("tls-client-ca", &o.tls_client_ca,
              "PEM CA: clients must present a certificate it signed (mutual TLS); needs --tls-cert");
  f.AddString("api-key-file", &o.api_key_file,
              "file of API keys, one per line: the gRPC Generation service and the HTTP /v1/ API ask for "
              "'authorization: Bearer KEY' (health and metrics do not)");
  f.AddStringList("served-model-name", &o.served_model_names,
                  "the name(s) the HTTP API's \"model\" field takes (default: the model file's name without "
                  "extension)");
  f.AddString("port-file", &o.port_file, "write the bound ports here (lines grpc=N, metrics=N, http=N)");
  f.AddString("device", &o.device, "cpu | cuda | auto: the backend (auto = cuda when a usable device is present)");
  f.AddInt("threads", &o.threads, "compute threads (0 = number of cores)");
  f.AddInt("max-queue", &o.max_queue, "waiting requests at most (RESOURCE_EXHAUSTED beyond)");
  f.AddInt("max-running", &o.max_running, "requests in the running batch at most");
  f.AddInt("max-batch-tokens", &o.max_batch_tokens, "token rows per engine step (every decode, then prefill chunks)");
  f.AddInt("prefill-chunk", &o.prefill_chunk, "prompt tokens of one request per engine step at most");
  f.AddInt("kv-block-size", &o.kv_block_size, "tokens per KV page (a block per KV head for K and for V)");
  f.AddString("kv-dtype", &o.kv_dtype,
              "KV cache element type: bf16 | f16 (F16 overflows past 65504) | f32 (twice the bytes) | q8_0 (int8 with "
              "a scale per 32 values: 53% of bf16's bytes; CPU only)");
  f.AddInt("kv-device-bytes", &o.kv_device_bytes, "bytes of the device KV tier");
  f.AddInt("kv-host-bytes", &o.kv_host_bytes,
           "bytes of the host KV tier, where preempted requests are swapped (0 = none)");
  f.AddFloat("kv-device-fraction", &o.kv_device_fraction,
             "device KV tier as a fraction of the memory available at start-up (a GPU's free memory once the weights "
             "are loaded; host memory on the CPU); overrides --kv-device-bytes (0 = off)");
  f.AddFloat(
      "kv-host-fraction", &o.kv_host_fraction,
      "host KV tier as a fraction of the host memory available at start-up; overrides --kv-host-bytes (0 = off)");
  f.AddString("preemption", &o.preemption, "swap | recompute: what happens to a preempted request's KV");
  f.AddStringList("strategy-arg", &o.strategy_args,
                  "server default of a pruning parameter, STRATEGY.key=value (e.g. lazyllm.keep=0.5,0.3,0.2,0.1, "
                  "gemfilter.top_k=2048); requests override them; GetModelInfo lists the effective defaults");
  f.AddString("pod-groups", &o.pod_groups,
              "the model's calibration file: PoD's layer groups (PoD is unavailable without a calibration) and "
              "calibrated GemFilter / LazyLLM defaults. Default: MODEL.calibration.json, or the one in "
              "--calibration-cache, when there is one (pruneserve-calibrate or --calibrate-text write them)");
  f.AddString("calibrate-text", &o.calibrate_text,
              "a text file or folder (e.g. ../shared/testdata/haystack/paul_graham_essays): when the model has no "
              "calibration yet, measure it at start-up over this text (about a minute for a 0.5B model on 2 cores) "
              "and cache it for the next start");
  f.AddString("auto-table", &o.auto_table,
              "the evaluation's table for the `auto` strategy (pruneserve-eval --auto-table writes it; default: "
              "MODEL.auto.json when there is one); `auto` is unavailable without one");
  f.AddString("calibration-cache", &o.calibration_cache,
              "folder for a measured calibration when the model's own folder is read-only");
  f.AddInt("default-max-new-tokens", &o.default_max_new_tokens, "max_new_tokens when a request sets none");
  f.AddFloat("default-temperature", &o.default_temperature, "temperature when a request sets none");
  f.AddFloat("default-top-p", &o.default_top_p, "top_p when a request sets none");
  f.AddFloat("drain-timeout", &o.drain_timeout, "seconds in-flight requests may take to finish on SIGTERM");
  f.AddString("activations", &o.activations,
              "int8 | f32: activations of products with quantised (GGUF) weights. int8: llama.cpp's numerics, "
              "weights repacked once at start-up for the int8 kernels; f32: exact products of the quantised "
              "weights, slower");
  f.AddString("cpu-isa", &o.cpu_isa,
              absl::StrCat("scalar | avx2 | avx512 | avx512_bf16: cap the CPU kernels' instruction level (also "
                           "$PS_CPU_ISA; default: the best of this CPU, now ",
                           ps::DescribeCpuKernels(), ")"));
  f.AddStringList("inject-fault", &o.inject_faults,
                  "TESTING ONLY: POINT=N makes the next N hits of a fault point fail (swap_copy, host_tier_full, "
                  "kv_append, strategy)");
  f.AddInt("gather-first", &o.gather_first,
           "TESTING ONLY: the engine's first step waits until N requests have arrived (tests whose requests "
           "must meet, e.g. to force preemption)");
  f.AddString("log-level", &o.log_level, "trace | debug | info | warn | error");
  f.AddString("config", &o.config, "config file of 'name = value' lines (command-line flags win)");
}

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

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  Options o;
  FlagParser flags("pruneserve", "gRPC inference server for LLaMA-family models with per-request token pruning.");
  AddFlags(flags, o);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (!o.config.empty()) {  // the file first, then the command line again so it wins
    if (absl::Status s = flags.ParseConfigFile(o.config); !s.ok()) return Fail(std::string(s.message()));
    if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  }
  if (o.model.empty()) return Fail("--model is required (see --help)");
  if (o.port < 0 || o.port > 65535 || o.metrics_port < -1 || o.metrics_port > 65535 || o.http_port < -1 ||
      o.http_port > 65535) {
    return Fail("bad port");
  }
  if (o.http_threads < 1 || o.max_request_bytes < 1 || o.max_request_bytes > INT32_MAX) {
    return Fail("--http-threads must be >= 1 and --max-request-bytes in [1, 2^31)");
  }
  if (o.max_prompt_tokens < 0 || o.max_new_tokens < 0 || o.max_stop_strings < 0 || o.max_stop_string_bytes < 0 ||
      o.max_streams_per_client < 0 || o.max_stream_backlog < 1 || o.max_prompt_tokens > INT32_MAX ||
      o.max_new_tokens > INT32_MAX || o.max_stop_strings > INT32_MAX || o.max_stop_string_bytes > INT32_MAX ||
      o.max_streams_per_client > INT32_MAX) {
    return Fail(
        "--max-prompt-tokens, --max-new-tokens, --max-stop-strings, --max-stop-string-bytes and "
        "--max-streams-per-client must be in [0, 2^31)");
  }
  const server::TlsFiles tls{.cert = o.tls_cert, .key = o.tls_key, .client_ca = o.tls_client_ca};
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = server::GrpcServerCredentials(tls);
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  for (const std::string& spec : o.inject_faults) {
    if (absl::Status s = fault::Arm(spec); !s.ok()) return Fail(absl::StrCat("--inject-fault: ", s.message()));
  }
  std::vector<std::string> api_keys;
  if (!o.api_key_file.empty()) {
    absl::StatusOr<std::vector<std::string>> keys = server::LoadApiKeys(o.api_key_file);
    if (!keys.ok()) return Fail(std::string(keys.status().message()));
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
    return Fail(
        "--max-queue, --max-running, --max-batch-tokens, --prefill-chunk, --default-max-new-tokens, "
        "--kv-block-size (<= 4096), --kv-device-bytes must be >= 1; --threads, --drain-timeout, "
        "--kv-host-bytes, --gather-first >= 0");
  }
  const absl::StatusOr<DType> parsed_kv_dtype = ParseKvDType(o.kv_dtype);
  if (!parsed_kv_dtype.ok()) return Fail(std::string(parsed_kv_dtype.status().message()));
  const DType kv_dtype = *parsed_kv_dtype;
  if (o.kv_device_fraction < 0 || o.kv_host_fraction < 0 || o.kv_device_fraction > 0.9 || o.kv_host_fraction > 0.9) {
    return Fail("--kv-device-fraction and --kv-host-fraction must be between 0 and 0.9");
  }
  const absl::StatusOr<bool> int8_activations = ParseActivations(o.activations);
  if (!int8_activations.ok()) return Fail(std::string(int8_activations.status().message()));
  if (!o.cpu_isa.empty()) {
    if (absl::Status s = CapCpuKernels(o.cpu_isa); !s.ok()) return Fail(absl::StrCat("--cpu-isa: ", s.message()));
  }
  if (o.preemption != "swap" && o.preemption != "recompute") {
    return Fail("--preemption must be swap or recompute, not '" + o.preemption + "'");
  }
  const auto level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off") return Fail("unknown --log-level " + o.log_level);
  spdlog::set_level(level);
  if (!o.inject_faults.empty()) {
    spdlog::warn("fault injection armed (testing only): {}", absl::StrJoin(o.inject_faults, ", "));
  }

  // SIGINT/SIGTERM are taken by sigwait in this thread; block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a write to a client that went away fails instead

  // The backend before anything listens: a --device that cannot run is one line and a non-zero exit.
  ThreadPool pool(static_cast<int>(o.threads));
  std::string device_note;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(o.device, pool, CpuBackendOptions{.int8_activations = *int8_activations}, &device_note);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  spdlog::info("device: {}", device_note);
  const bool cpu = (*backend)->kind() == DeviceKind::kCpu;
  if (cpu) spdlog::info("CPU kernels: {}; {} activations", DescribeCpuKernels(), o.activations);
  // The KV tiers from fractions of free memory: the host tier's of host memory; the
  // device tier's of device memory on a GPU (once the weights are there, below), of
  // host memory on the CPU, where the two tiers share it.
  const bool device_memory = (*backend)->kind() == DeviceKind::kCuda;
  if (!device_memory && o.kv_device_fraction + o.kv_host_fraction > 0.9) {
    return Fail(
        "on the CPU both KV tiers are host memory: --kv-device-fraction and --kv-host-fraction must add up "
        "to 0.9 at most");
  }
  if (o.kv_host_fraction > 0 || (!device_memory && o.kv_device_fraction > 0)) {
    const absl::StatusOr<int64_t> available = AvailableMemoryBytes();
    if (!available.ok()) return Fail(absl::StrCat("KV tier fractions: ", available.status().message()));
    if (!device_memory && o.kv_device_fraction > 0) {
      o.kv_device_bytes = static_cast<int64_t>(*available * o.kv_device_fraction);
    }
    if (o.kv_host_fraction > 0) o.kv_host_bytes = static_cast<int64_t>(*available * o.kv_host_fraction);
    spdlog::info("KV tiers from fractions of {:.0f} MiB of host memory available: {}host {:.0f} MiB",
                 *available / 1048576.0,
                 device_memory ? "" : absl::StrCat("device ", o.kv_device_bytes / 1048576, " MiB, "),
                 o.kv_host_bytes / 1048576.0);
  }

  server::AccessControl access(std::move(api_keys), static_cast<int>(o.max_streams_per_client));
  server::GenerationService service(&access);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.port), *credentials, &grpc_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(o.max_request_bytes));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (grpc_server == nullptr || grpc_port == 0) return Fail(absl::StrCat("cannot listen on ", o.host, ":", o.port));
  grpc::HealthCheckServiceInterface* health = grpc_server->GetHealthCheckService();
  health->SetServingStatus(false);  // NOT_SERVING while the model loads
  spdlog::info("listening on {}:{} (gRPC{}{}{})", o.host, grpc_port, tls.enabled() ? ", TLS" : "",
               tls.client_ca.empty() ? "" : ", client certificates required",
               access.requires_token() ? ", API key required" : "");

  server::Metrics metrics;
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
      return Fail(absl::StrCat("cannot serve metrics on port ", o.metrics_port, ": ", e.what()));
    }
    exposer->RegisterCollectable(metrics.registry());
    metrics_port = exposer->GetListeningPorts().at(0);
    spdlog::info("metrics on http://{}:{}/metrics", o.host, metrics_port);
  }
  std::unique_ptr<server::HttpFront> http;
  if (o.http_port >= 0) {
    absl::StatusOr<std::unique_ptr<server::HttpFront>> front =
        server::HttpFront::Start({.host = o.host,
                                  .port = static_cast<int>(o.http_port),
                                  .threads = static_cast<int>(o.http_threads),
                                  .max_body_bytes = static_cast<size_t>(o.max_request_bytes),
                                  .served_models = o.served_model_names,
                                  .tls = tls},
                                 metrics.registry(), &access);
    if (!front.ok()) return Fail(std::string(front.status().message()));
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
    spdlog::error("cannot load the model: {}", std::string(model.status().message()));
    grpc_server->Shutdown();
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  {  // the weights in the backend's layouts (a GPU's copies), then the device tier from what is left
    const auto w0 = std::chrono::steady_clock::now();
    const absl::StatusOr<size_t> packed = PrepareWeights(**model, **backend);
    const absl::StatusOr<int64_t> free = !packed.ok()    ? packed.status()
                                         : device_memory ? (*backend)->FreeDeviceBytes()
                                                         : int64_t{0};
    if (!free.ok()) {
      spdlog::error("preparing the weights: {}", std::string(free.status().message()));
      grpc_server->Shutdown();
      return 1;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    if (*packed > 0) {
      spdlog::info("weights repacked for the int8 kernels in {:.1f} s ({:.0f} MiB)", seconds, *packed / 1048576.0);
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
    spdlog::error("--kv-dtype {}: {}", o.kv_dtype, std::string(valid.message()));
    return 1;
  }
  const int64_t kv_blocks = geometry.BlocksInBytes(o.kv_device_bytes);
  if (kv_blocks < geometry.BlocksForTokens(1)) {
    spdlog::error("--kv-device-bytes {} holds {} blocks of {} bytes; one token needs {} ({} per layer)",
                  o.kv_device_bytes, kv_blocks, geometry.block_bytes(), geometry.BlocksForTokens(1),
                  geometry.blocks_per_page());
    return 1;
  }
  const int64_t host_blocks = geometry.BlocksInBytes(o.kv_host_bytes);
  const PreemptionMode preemption = o.preemption == "swap" ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  server::ServiceState state{.model = model->get(),
                             .metrics = &metrics,
                             .kv_block_tokens = geometry.block_tokens,
                             .kv_token_blocks = geometry.BlocksForTokens(1),
                             .max_stream_backlog = static_cast<size_t>(o.max_stream_backlog)};
  const absl::StatusOr<CalibrationPtr> calibration = server::ResolveCalibration(**model, **backend,
                                                                                {.file = o.pod_groups,
                                                                                 .model_path = o.model,
                                                                                 .text = o.calibrate_text,
                                                                                 .cache_dir = o.calibration_cache,
                                                                                 .auto_table = o.auto_table});
  if (!calibration.ok()) return Fail(std::string(calibration.status().message()));
  if (absl::StatusOr<StrategyDefaults> d = StrategyDefaults::ForModel(c, o.strategy_args, *calibration); d.ok()) {
    state.defaults.strategies = std::make_shared<const StrategyDefaults>(*std::move(d));
  } else {
    return Fail(absl::StrCat("--strategy-arg: ", d.status().message()));
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
  absl::StatusOr<std::unique_ptr<server::Serving>> serving = server::Serving::Create(
      **model, **backend,
      server::ServingOptions{.engine = {.kv_block_tokens = geometry.block_tokens,
                                        .kv_dtype = kv_dtype,
                                        .kv_device_blocks = kv_blocks,
                                        .kv_host_blocks = host_blocks},
                             .scheduler = {.max_running = static_cast<int>(o.max_running),
                                           .max_queue = static_cast<int>(o.max_queue),
                                           .max_batch_tokens = static_cast<int>(o.max_batch_tokens),
                                           .prefill_chunk = static_cast<int>(o.prefill_chunk),
                                           .preemption = preemption,
                                           .gather_first = static_cast<int>(o.gather_first)}},
      &metrics);
  if (!serving.ok()) {
    grpc_server->Shutdown();
    return Fail(std::string(serving.status().message()));
  }
  metrics.SetCacheConfig(geometry.block_tokens, o.kv_dtype, kv_blocks, host_blocks);
  for (auto [tier, blocks] : {std::pair{"device", kv_blocks}, std::pair{"host", host_blocks}}) {
    spdlog::info("KV cache: {} tier {} blocks of {} tokens of one KV head's K or V, {} ({:.0f} MiB, {} tokens)", tier,
                 blocks, o.kv_block_size, o.kv_dtype, blocks * static_cast<double>(geometry.block_bytes()) / (1 << 20),
                 blocks / geometry.BlocksForTokens(1) * o.kv_block_size);
  }
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
  state.defaults.limits = {.max_prompt_tokens = static_cast<int>(o.max_prompt_tokens),
                           .max_new_tokens = static_cast<int>(o.max_new_tokens),
                           .max_stop_strings = static_cast<int>(o.max_stop_strings),
                           .max_stop_string_bytes = static_cast<int>(o.max_stop_string_bytes)};
  if (absl::Status s = ValidateSamplingParams(state.defaults.sampling); !s.ok()) {
    return Fail(absl::StrCat("default sampling: ", s.message()));
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
  return 0;
}
