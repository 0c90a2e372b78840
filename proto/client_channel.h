// The clients' side of the server's security options: a gRPC channel with TLS
// (the server's CA, optionally a client certificate for mutual TLS) and a bearer
// token sent with every call. Shared by pruneserve-cli, pruneserve-loadtest and
// pruneserve-eval.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/channel.h>

#include "absl/status/statusor.h"

namespace ps {

struct ClientChannelOptions {
  bool tls = false;                   // TLS with the system's roots, or `tls_ca` when set
  std::string tls_ca;                 // PEM file of the CA that signed the server's certificate (implies tls)
  std::string tls_cert, tls_key;      // PEM files: a client certificate and its key (mutual TLS)
  std::string api_key_file;           // its first non-comment line is sent as "authorization: Bearer KEY";
                                      // unset: $PRUNESERVE_API_KEY, if set
  int max_receive_message_bytes = 0;  // 0: gRPC's default
};

// The channel to `addr`; an error names a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(const std::string& addr,
                                                                   const ClientChannelOptions& options);

// Registers --tls, --tls-ca, --tls-cert, --tls-key and --api-key-file on a ps::FlagParser.
template <typename FlagParser>
void AddClientChannelFlags(FlagParser& f, ClientChannelOptions* o) {
  f.AddBool("tls", &o->tls, "connect with TLS, trusting the system's CAs (or --tls-ca)");
  f.AddString("tls-ca", &o->tls_ca, "PEM file of the CA that signed the server's certificate (implies --tls)");
  f.AddString("tls-cert", &o->tls_cert, "PEM client certificate, for a server that asks for one (mutual TLS)");
  f.AddString("tls-key", &o->tls_key, "PEM key of --tls-cert");
  f.AddString("api-key-file", &o->api_key_file,
              "file whose first line is the server's API key (default: $PRUNESERVE_API_KEY, if set)");
}

}  // namespace ps
