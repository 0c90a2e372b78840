// The prefix cache through the real server (stories260K, F32 KV, 16-token pages): a
// repeat document hits the cache, says so in Finished, GetLoad and the metrics, and
// gives the tokens of an uncached run; salts and API keys keep tenants apart; a
// flush empties it.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/server/server_test_util.h"

namespace ps::testing {
namespace {

constexpr int kNew = 20;
constexpr int kPageBlocks = 5 * 8;  // stories260K: a page is 8 blocks (4 KV heads' K and V) in each of 5 layers

// A 100-token document (BOS first) and a 3-token question about it.
std::vector<int32_t> Document() {
  std::vector<int32_t> doc = {1};
  for (int k = 0; k < 99; ++k) doc.push_back(300 + (k * 29) % 180);
  return doc;
}

std::vector<int32_t> Ask(int question) {
  std::vector<int32_t> p = Document();
  for (int k = 0; k < 3; ++k) p.push_back(400 + question * 7 + k);
  return p;
}

constexpr uint32_t kCachedTokens = 96;  // the document's 6 whole pages

pb::LoadInfo Load(ServerProcess& s) {
  grpc::ClientContext ctx;
  pb::LoadInfo load;
  EXPECT_TRUE(s.Stub()->GetLoad(&ctx, {}, &load).ok());
  return load;
}

TEST(PrefixCacheServer, RepeatDocumentsHitTheCacheWithTheUncachedTokens) {
  ServerProcess s(StoriesOnF32Kv({}));
  auto stub = s.Stub();
  const StreamResult first = RunStream(*stub, GreedyRequest(Ask(0), kNew));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.finished.usage().cached_tokens(), 0u);
  EXPECT_EQ(absl::StrJoin(first.tokens, " "), absl::StrJoin(Offline(Ask(0), kNew), " "));

  for (int q = 1; q <= 2; ++q) {
    const StreamResult r = RunStream(*stub, GreedyRequest(Ask(q), kNew));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.finished.usage().cached_tokens(), kCachedTokens) << q;
    EXPECT_EQ(r.finished.usage().prompt_tokens(), Ask(q).size()) << "the whole prompt, cached or not";
    EXPECT_EQ(absl::StrJoin(r.tokens, " "), absl::StrJoin(Offline(Ask(q), kNew), " ")) << q;
  }
  // StreamingLLM's prompt pass is dense: it reads the pages `full` cached, and its
  // tokens are those of the whole prompt computed at once (eviction included).
  pb::GenerateRequest streaming = GreedyRequest(Ask(3), kNew);
  streaming.mutable_pruning()->mutable_streamingllm()->set_sinks(4);
  streaming.mutable_pruning()->mutable_streamingllm()->set_recent(32);
  const StreamResult sl = RunStream(*stub, streaming);
  ASSERT_TRUE(sl.status.ok()) << sl.status.error_message();
  EXPECT_EQ(sl.finished.usage().cached_tokens(), kCachedTokens);
  EXPECT_EQ(absl::StrJoin(sl.tokens, " "),
            absl::StrJoin(Offline(Ask(3), kNew, "streamingllm", {"sinks=4", "recent=32"}), " "));
  // Another salt is another tenant: nothing cached, the same tokens.
  pb::GenerateRequest salted = GreedyRequest(Ask(1), kNew);
  salted.set_cache_salt("tenant-b");
  const StreamResult other = RunStream(*stub, salted);
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.finished.usage().cached_tokens(), 0u);
  EXPECT_EQ(absl::StrJoin(other.tokens, " "), absl::StrJoin(Offline(Ask(1), kNew), " "));
  salted.set_cache_salt(std::string(257, 's'));
  EXPECT_EQ(RunStream(*stub, salted).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  ASSERT_TRUE(Drained(s));
  const std::string page = s.Metrics();
  const double prompt = static_cast<double>(Ask(0).size());
  EXPECT_EQ(MetricValue(page, "pruneserve_prefix_cache_queried_tokens_total"), 5 * prompt) << page;
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prefix_cache_hit_tokens_total{tier="device"})"), 3 * kCachedTokens);
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prefix_cache_hit_tokens_total{tier="host"})"), 0);
  // Two tenants' copies of the document's pages.
  EXPECT_EQ(MetricValue(page, R"(pruneserve_prefix_cache_blocks{tier="device"})"), 2 * 6 * kPageBlocks);
  pb::LoadInfo load = Load(s);
  EXPECT_EQ(load.kv(0).cached_tokens(), 2 * kCachedTokens);
  EXPECT_EQ(load.kv(0).used_tokens(), load.kv(0).cached_tokens()) << "idle: only the cache holds blocks";

  grpc::ClientContext ctx;
  pb::FlushCacheResponse flushed;
  ASSERT_TRUE(stub->FlushCache(&ctx, {}, &flushed).ok());
  EXPECT_EQ(flushed.dropped_blocks(), 2u * 6 * kPageBlocks);
  load = Load(s);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(load.kv(t).used_tokens(), 0u) << load.kv(t).tier();
    EXPECT_EQ(load.kv(t).cached_tokens(), 0u) << load.kv(t).tier();
  }
  EXPECT_EQ(MetricValue(s.Metrics(), R"(pruneserve_prefix_cache_blocks{tier="device"})"), 0);
  const StreamResult again = RunStream(*stub, GreedyRequest(Ask(2), kNew));
  EXPECT_EQ(again.finished.usage().cached_tokens(), 0u) << "flushed";
}

TEST(PrefixCacheServer, APrincipalNeverHitsAnothersPrefixes) {
  const std::string keys = ::testing::TempDir() + "/prefix_cache_keys";
  std::ofstream(keys) << "key-of-a\nkey-of-b\n";
  ServerProcess s(StoriesOnF32Kv({"--api-key-file", keys}));
  auto stub = s.Stub();
  auto cached = [&](const std::string& key) {
    const StreamResult r = RunStream(*stub, GreedyRequest(Ask(0), kNew), nullptr, {}, key);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return r.finished.usage().cached_tokens();
  };
  EXPECT_EQ(cached("key-of-a"), 0u);
  EXPECT_EQ(cached("key-of-b"), 0u) << "the same document under another API key";
  EXPECT_EQ(cached("key-of-a"), kCachedTokens);
  EXPECT_EQ(cached("key-of-b"), kCachedTokens);
  std::filesystem::remove(keys);
}

TEST(PrefixCacheServer, OffMeansNothingCached) {
  ServerProcess s(StoriesOnF32Kv({"--prefix-cache", "off"}));
  auto stub = s.Stub();
  for (int i = 0; i < 2; ++i) {
    const StreamResult r = RunStream(*stub, GreedyRequest(Ask(0), kNew));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.finished.usage().cached_tokens(), 0u);
  }
  ASSERT_TRUE(Drained(s));
  EXPECT_EQ(Load(s).kv(0).used_tokens(), 0u);
}

}  // namespace
}  // namespace ps::testing
