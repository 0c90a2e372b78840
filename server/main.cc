// pruneserve: the gRPC inference server. Flags in, server/server_app.h does the rest.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/flags.h"
#include "kernels/backend.h"
#include "server/server_app.h"

namespace {

void AddFlags(ps::FlagParser& f, ps::server::ServerOptions& o) {
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
  f.AddString("chat-template", &o.chat_template,
              "a Jinja chat template file formatting chat messages in place of the model's own "
              "(tokenizer.chat_template; e.g. one of models/templates/)");
  f.AddString("device", &o.device, "cpu | cuda | auto: the backend (auto = cuda when a usable device is present)");
  f.AddInt("threads", &o.threads, "compute threads (0 = number of cores)");
  f.AddInt("max-queue", &o.max_queue, "waiting requests at most (RESOURCE_EXHAUSTED beyond)");
  f.AddInt("max-running", &o.max_running, "requests in the running batch at most");
  f.AddInt("max-batch-tokens", &o.max_batch_tokens, "token rows per engine step (every decode, then prefill chunks)");
  f.AddInt("prefill-chunk", &o.prefill_chunk, "prompt tokens of one request per engine step at most");
  f.AddInt("kv-block-size", &o.kv_block_size, "tokens per KV page (a block per KV head for K and for V)");
  f.AddString("kv-dtype", &o.kv_dtype,
              "KV cache element type: bf16 | f16 (F16 overflows past 65504) | f32 (twice the bytes) | q8_0 (int8 with "
              "a scale per 32 values: 53% of bf16's bytes, scores on int8 dot products on AVX-512 VNNI; CPU only)");
  f.AddInt("kv-device-bytes", &o.kv_device_bytes, "bytes of the device KV tier");
  f.AddInt("kv-host-bytes", &o.kv_host_bytes,
           "bytes of the host KV tier, where preempted requests are swapped (0 = none)");
  f.AddFloat("kv-device-fraction", &o.kv_device_fraction,
             "device KV tier as a fraction of the memory available at start-up (a GPU's free memory once the weights "
             "are loaded; host memory on the CPU); overrides --kv-device-bytes (0 = off)");
  f.AddFloat(
      "kv-host-fraction", &o.kv_host_fraction,
      "host KV tier as a fraction of the host memory available at start-up; overrides --kv-host-bytes (0 = off)");
  f.AddString("prefix-cache", &o.prefix_cache,
              "on | off: keep the KV of full prompt pages for later requests with the same prefix (the least "
              "recently used move to the host tier when the device tier needs room, and are dropped from there)");
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

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pruneserve: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  ps::server::ServerOptions o;
  ps::FlagParser flags("pruneserve", "gRPC inference server for LLaMA-family models with per-request token pruning.");
  AddFlags(flags, o);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s);
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (!o.config.empty()) {  // the file first, then the command line again so it wins
    if (absl::Status s = flags.ParseConfigFile(o.config); !s.ok()) return Fail(s);
    if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(s);
  }
  const absl::Status served = ps::server::RunServer(std::move(o));
  return served.ok() ? 0 : Fail(served);
}
