// Who may use the server and how much one client may hold: the bearer-token
// check (constant time) and the count of open generation streams per client,
// shared by the gRPC and HTTP fronts. Health and metrics never ask for a token.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ps::server {

// The keys of an --api-key-file: one per line; blank lines and lines starting
// with '#' are skipped. An error when the file cannot be read or holds no key.
absl::StatusOr<std::vector<std::string>> LoadApiKeys(const std::string& path);

// `a == b` in a time that depends on their lengths only, not on where they differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The host part of a peer address: "ipv4:10.0.0.7:5123" and "10.0.0.7" give
// "10.0.0.7", "ipv6:[::1]:5123" gives "::1".
std::string PeerHost(std::string_view peer);

class AccessControl {
 public:
  // No keys: every caller is served. max_streams_per_client 0: no limit.
  AccessControl(std::vector<std::string> api_keys, int max_streams_per_client);

  bool requires_token() const { return !keys_.empty(); }
  // The caller's principal when no keys are set ("") or `authorization` is
  // "Bearer KEY" with a known key (the key: it salts the prefix cache's root keys,
  // so one tenant can neither hit another's cached prefixes nor compute their page
  // keys; never logged or sent); UNAUTHENTICATED otherwise.
  absl::StatusOr<std::string> Authenticate(std::string_view authorization) const;

  // An open stream of `client` (PeerHost of the caller), counted until the
  // returned handle is destroyed; RESOURCE_EXHAUSTED when the client already has
  // max_streams_per_client. The handle may outlive this object's callers but not it.
  absl::StatusOr<std::shared_ptr<void>> OpenStream(const std::string& client);
  int open_streams(const std::string& client) const;
  // Over every client: what a drain waits for (a stream ends once its last message is written).
  int open_streams() const;

 private:
  std::vector<std::string> keys_;
  int max_streams_per_client_;
  mutable std::mutex mu_;
  std::map<std::string, int> open_;  // client -> streams open
  int total_open_ = 0;
};

}  // namespace ps::server
