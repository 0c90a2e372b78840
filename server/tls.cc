#include "server/tls.h"

#include "absl/strings/str_cat.h"
#include "base/mapped_file.h"
#include "base/status.h"

namespace ps::server {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  if (!pem.ok()) return absl::NotFoundError(absl::StrCat("cannot read the TLS ", what, " ", path));
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS ", what, " ", path, " is not PEM"));
  }
  return pem;
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& tls) {
  if (!tls.enabled() && !tls.client_ca.empty()) {
    return absl::InvalidArgumentError("a TLS client CA needs a certificate and key");
  }
  if (tls.enabled() && (tls.cert.empty() || tls.key.empty())) {
    return absl::InvalidArgumentError("TLS needs both a certificate and its private key");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(const TlsFiles& tls) {
  PS_RETURN_IF_ERROR(CheckTlsFiles(tls));
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(tls.client_ca.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  PS_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(tls.cert, "certificate"));
  PS_ASSIGN_OR_RETURN(pair.private_key, ReadPem(tls.key, "key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca.empty()) {
    PS_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(tls.client_ca, "client CA"));
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace ps::server
