// The bearer-token check, API key files, peer addresses and the per-client stream count.
#include "server/access.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace ps::server {
namespace {

TEST(Access, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", std::string_view("secret\0", 7)));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secre"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
}

TEST(Access, PeerHost) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:5123"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5123"), "::1");
  EXPECT_EQ(PeerHost("10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(PeerHost("unix:/tmp/sock"), "unix:/tmp/sock");
}

TEST(Access, ApiKeyFile) {
  const std::string path = testing::TempDir() + "/keys";
  std::ofstream(path) << "# comment\n\n  key-one  \nkey-two\n";
  const absl::StatusOr<std::vector<std::string>> keys = LoadApiKeys(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{"key-one", "key-two"}));
  std::ofstream(path) << "# only a comment\n";
  EXPECT_EQ(LoadApiKeys(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::remove(path.c_str());
  EXPECT_EQ(LoadApiKeys(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(Access, BearerToken) {
  AccessControl open({}, 0);
  EXPECT_FALSE(open.requires_token());
  EXPECT_EQ(open.Authenticate("").value_or("?"), "");
  AccessControl keyed({"k1", "k2"}, 0);
  EXPECT_TRUE(keyed.requires_token());
  EXPECT_EQ(keyed.Authenticate("Bearer k1").value_or("?"), "k1");  // the principal: apart in the prefix cache
  EXPECT_EQ(keyed.Authenticate("Bearer k2").value_or("?"), "k2");
  for (const char* bad : {"", "k1", "Bearer ", "Bearer k3", "Bearer k1 ", "bearer k1", "Basic k1"}) {
    EXPECT_EQ(keyed.Authenticate(bad).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(Access, StreamsPerClient) {
  AccessControl access({}, 2);
  auto a1 = access.OpenStream("a");
  auto a2 = access.OpenStream("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(access.OpenStream("a").status().code(), absl::StatusCode::kResourceExhausted);
  auto b1 = access.OpenStream("b");  // another client is not counted against "a"
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(access.open_streams("a"), 2);
  EXPECT_EQ(access.open_streams(), 3);
  a1->reset();  // the stream ends: its slot is free again
  EXPECT_EQ(access.open_streams("a"), 1);
  EXPECT_EQ(access.open_streams(), 2);
  EXPECT_TRUE(access.OpenStream("a").ok());  // a temporary: released at once
  EXPECT_EQ(access.open_streams("a"), 1);
  AccessControl unlimited({}, 0);
  std::vector<std::shared_ptr<void>> held;
  for (int i = 0; i < 100; ++i) held.push_back(*unlimited.OpenStream("a"));
  EXPECT_EQ(unlimited.open_streams("a"), 100);
}

}  // namespace
}  // namespace ps::server
