#include "proto/client_channel.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ps {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Adds "authorization: Bearer KEY" to every call's initial metadata.
class BearerToken final : public grpc::experimental::Interceptor {
 public:
  explicit BearerToken(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  std::string header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string key) : header_("Bearer " + std::move(key)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerToken(header_);
  }

 private:
  std::string header_;
};

absl::StatusOr<std::string> ApiKey(const std::string& file) {
  if (file.empty()) {
    const char* env = std::getenv("PRUNESERVE_API_KEY");
    return env != nullptr ? std::string(env) : std::string();
  }
  absl::StatusOr<std::string> text = ReadFile(file, "API key file");
  if (!text.ok()) return text.status();
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    std::string key(absl::StripAsciiWhitespace(line));
    if (!key.empty() && key.front() != '#') return key;
  }
  return absl::InvalidArgumentError(absl::StrCat("the API key file ", file, " holds no key"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(const std::string& addr,
                                                                   const ClientChannelOptions& o) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (o.tls || !o.tls_ca.empty() || !o.tls_cert.empty()) {
    grpc::SslCredentialsOptions ssl;
    if (!o.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadFile(o.tls_ca, "TLS CA");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (o.tls_cert.empty() != o.tls_key.empty()) {
      return absl::InvalidArgumentError("a TLS client certificate needs its key, and the key its certificate");
    }
    if (!o.tls_cert.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(o.tls_cert, "TLS certificate");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(o.tls_key, "TLS key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  if (o.max_receive_message_bytes > 0) args.SetMaxReceiveMessageSize(o.max_receive_message_bytes);
  absl::StatusOr<std::string> key = ApiKey(o.api_key_file);
  if (!key.ok()) return key.status();
  if (key->empty()) return grpc::CreateCustomChannel(addr, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(*std::move(key)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(addr, creds, args, std::move(interceptors));
}

}  // namespace ps
