// The TLS options' checks: a key without its certificate, unreadable or non-PEM files.
// (The handshakes themselves run in security_test.py against real clients.)
#include "server/tls.h"

#include <fstream>

#include "gtest/gtest.h"

namespace ps::server {
namespace {

TEST(Tls, FilesAreCheckedBeforeUse) {
  EXPECT_TRUE(CheckTlsFiles({}).ok());
  EXPECT_TRUE(GrpcServerCredentials({}).ok());  // plaintext
  EXPECT_EQ(CheckTlsFiles({.key = "k.pem"}).message(), "TLS needs both a certificate and its private key");
  EXPECT_EQ(CheckTlsFiles({.cert = "c.pem"}).message(), "TLS needs both a certificate and its private key");
  EXPECT_EQ(CheckTlsFiles({.client_ca = "ca.pem"}).message(), "a TLS client CA needs a certificate and key");
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/not_pem") << "hello";
  EXPECT_EQ(GrpcServerCredentials({.cert = dir + "/missing.pem", .key = dir + "/not_pem"}).status().code(),
            absl::StatusCode::kNotFound);
  const auto not_pem = GrpcServerCredentials({.cert = dir + "/not_pem", .key = dir + "/not_pem"});
  EXPECT_EQ(not_pem.status().message(), "the TLS certificate " + dir + "/not_pem is not PEM");
}

}  // namespace
}  // namespace ps::server
