// TLS for the gRPC and HTTP fronts: the server's certificate and key (PEM files)
// and, optionally, the CA whose client certificates are required (mutual TLS).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace ps::server {

struct TlsFiles {
  std::string cert, key;  // both, or neither (plaintext)
  std::string client_ca;  // set: clients must present a certificate it signed
  bool enabled() const { return !cert.empty() || !key.empty(); }
};

// OK for plaintext (nothing set) or a certificate with its key; an error for a key
// without its certificate (or the reverse), or a client CA without either.
absl::Status CheckTlsFiles(const TlsFiles& tls);

// Insecure credentials without TLS; else the files read (an error names the
// file that cannot be read, or a key without its certificate).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& tls);

}  // namespace ps::server
