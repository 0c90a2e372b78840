#include "server/access.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ps::server {

absl::StatusOr<std::vector<std::string>> LoadApiKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the API key file ", path));
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    const std::string key(absl::StripAsciiWhitespace(line));
    if (!key.empty() && key.front() != '#') keys.push_back(key);
  }
  if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat("the API key file ", path, " holds no key"));
  return keys;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is read; a length difference is folded in.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

std::string PeerHost(std::string_view peer) {
  if (!peer.starts_with("ipv4:") && !peer.starts_with("ipv6:")) return std::string(peer);
  peer.remove_prefix(5);  // gRPC's scheme
  if (peer.starts_with('[')) return std::string(peer.substr(1, peer.find(']') - 1));
  return std::string(peer.substr(0, peer.rfind(':')));
}

AccessControl::AccessControl(std::vector<std::string> api_keys, int max_streams_per_client)
    : keys_(std::move(api_keys)), max_streams_per_client_(max_streams_per_client) {}

absl::StatusOr<std::string> AccessControl::Authenticate(std::string_view authorization) const {
  if (keys_.empty()) return std::string();
  constexpr std::string_view kBearer = "Bearer ";
  if (!authorization.starts_with(kBearer)) {
    return absl::UnauthenticatedError("an API key is required: send the header 'Authorization: Bearer KEY'");
  }
  const std::string_view presented = authorization.substr(kBearer.size());
  size_t match = keys_.size();
  for (size_t i = 0; i < keys_.size(); ++i) {  // no early exit
    if (ConstantTimeEquals(presented, keys_[i])) match = i;
  }
  if (match == keys_.size()) return absl::UnauthenticatedError("the API key is not valid");
  return keys_[match];
}

absl::StatusOr<std::shared_ptr<void>> AccessControl::OpenStream(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  int& open = open_[client];
  if (max_streams_per_client_ > 0 && open >= max_streams_per_client_) {
    if (open == 0) open_.erase(client);
    return absl::ResourceExhaustedError(
        absl::StrCat("client ", client, " has ", open, " streams open; this server allows ", max_streams_per_client_));
  }
  ++open;
  ++total_open_;
  return std::shared_ptr<void>(nullptr, [this, client](void*) {
    std::lock_guard<std::mutex> lock(mu_);
    --total_open_;
    if (--open_[client] == 0) open_.erase(client);
  });
}

int AccessControl::open_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_open_;
}

int AccessControl::open_streams(const std::string& client) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(client);
  return it == open_.end() ? 0 : it->second;
}

}  // namespace ps::server
