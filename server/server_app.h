// The server process around the serving core: the flags' values (ServerOptions)
// and RunServer, which checks them, starts the backend, the gRPC, HTTP and metrics
// listeners, loads the model, assembles the serving core (serving.h), serves until
// SIGINT or SIGTERM and drains. main.cc reads the flags into ServerOptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "memory/kv_geometry.h"
#include "server/calibration_source.h"

namespace ps::server {

struct ServerOptions {
  std::string model, host = "0.0.0.0", config, port_file, log_level = "info", preemption = "swap",
                     kv_dtype = kDefaultKvDTypeName, device = "auto", pod_groups, calibrate_text, auto_table,
                     calibration_cache = DefaultCacheDir(), tls_cert, tls_key, tls_client_ca, api_key_file,
                     activations = "int8", cpu_isa, prefix_cache = "on", chat_template;
  std::vector<std::string> strategy_args, served_model_names, inject_faults;
  int64_t port = 50051, metrics_port = 9090, threads = 0, max_queue = 256, max_running = 64, max_batch_tokens = 2048,
          prefill_chunk = 512, default_max_new_tokens = 256, kv_block_size = 16, kv_device_bytes = int64_t{1} << 30,
          kv_host_bytes = int64_t{2} << 30, http_port = -1, http_threads = 128, max_request_bytes = int64_t{32} << 20,
          max_prompt_tokens = 0, max_new_tokens = 0, max_stop_strings = 16, max_stop_string_bytes = 256,
          max_streams_per_client = 0, max_stream_backlog = 4096, gather_first = 0;
  double drain_timeout = 30.0, default_temperature = 1.0, default_top_p = 1.0, kv_device_fraction = 0,
         kv_host_fraction = 0;
};

// Serves until a stop signal, then drains (the calling thread waits for the
// signal: SIGINT and SIGTERM are blocked in every thread started here). Bad options,
// a port taken or a model that does not load are an error, before anything serves.
absl::Status RunServer(ServerOptions o);

}  // namespace ps::server
