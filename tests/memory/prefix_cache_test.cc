// The prefix cache without a model: the index's hash chain and LRU, and the KV
// owner's cached pages (shared, evicted device -> host -> dropped, brought back),
// with exact block ids and the owner's integrity after every operation.
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "memory/kv_cache_manager.h"
#include "memory/prefix_index.h"

namespace ps {
namespace {

#define EXPECT_INTACT(m) EXPECT_TRUE((m).VerifyIntegrity().ok()) << (m).VerifyIntegrity()

std::vector<int32_t> Iota(int from, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(PrefixIndex, KeysChainThePrefixAndAreFixedAcrossProcesses) {
  const std::vector<int32_t> a = Iota(0, 4), b = Iota(100, 4);
  const uint64_t root = PrefixIndex::RootKey("");
  EXPECT_NE(root, PrefixIndex::RootKey("tenant"));
  EXPECT_NE(PrefixIndex::PageKey(root, a), PrefixIndex::PageKey(root, b));
  // The same page after a different prefix is a different key.
  EXPECT_NE(PrefixIndex::PageKey(PrefixIndex::PageKey(root, a), b),
            PrefixIndex::PageKey(PrefixIndex::PageKey(root, b), b));
  // Replicas compare keys: they must not change between builds, runs or machines.
  // The values from an independent implementation of the same rule (FNV-1a over
  // "root" and the salt, or over the parent key's and the tokens' little-endian
  // bytes, then SplitMix64's finaliser), in Python.
  EXPECT_EQ(root, 0x4ffc53165c1dc41bull);
  EXPECT_EQ(PrefixIndex::PageKey(root, std::vector<int32_t>{1, 2, 3, 4}), 0xcafeb2a86666b2f9ull);
}

TEST(PrefixIndex, MatchesTheLongestChainAndComparesTokens) {
  PrefixIndex index(4);
  const std::vector<int32_t> prompt = Iota(0, 12);
  const uint64_t root = PrefixIndex::RootKey("s");
  PrefixEntry* p0 = index.Insert(root, "s", std::span(prompt).subspan(0, 4), Tier::kDevice, {10});
  ASSERT_NE(p0, nullptr);
  PrefixEntry* p1 = index.Insert(p0->key, "", std::span(prompt).subspan(4, 4), Tier::kHost, {11});
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(index.Insert(root, "s", std::span(prompt).subspan(0, 4), Tier::kDevice, {12}), nullptr);  // taken
  EXPECT_EQ(index.Match("s", prompt, 10), (std::vector<PrefixEntry*>{p0, p1}));
  EXPECT_EQ(index.Match("s", prompt, 1), (std::vector<PrefixEntry*>{p0}));
  EXPECT_TRUE(index.Match("t", prompt, 10).empty());  // another salt
  std::vector<int32_t> other = prompt;
  other[5] = 99;
  EXPECT_EQ(index.Match("s", other, 10), (std::vector<PrefixEntry*>{p0}));
  EXPECT_EQ(index.size(Tier::kDevice), 1);
  EXPECT_EQ(index.size(Tier::kHost), 1);
}

TEST(PrefixIndex, ReportsEveryChangeAndASnapshotWithParentsFirst) {
  PrefixIndex index(2);
  const std::vector<int32_t> prompt = Iota(0, 6);
  const uint64_t root = PrefixIndex::RootKey("");
  PrefixEntry* p0 = index.Insert(root, "", std::span(prompt).subspan(0, 2), Tier::kDevice, {1});
  PrefixEntry* p1 = index.Insert(p0->key, "", std::span(prompt).subspan(2, 2), Tier::kDevice, {2});
  PrefixEntry* p2 = index.Insert(p1->key, "", std::span(prompt).subspan(4, 2), Tier::kDevice, {3});
  const uint64_t k0 = p0->key, k1 = p1->key, k2 = p2->key;
  index.Move(*p1, Tier::kHost, {7});
  index.Erase(*p2);
  const std::vector<PrefixEvent> events = index.TakeEvents();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_TRUE(events[0].stored && events[0].key == k0 && events[0].parent == root);
  EXPECT_EQ(events[0].tokens, (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(events[2].stored && events[2].key == k2 && events[2].parent == k1);
  EXPECT_TRUE(!events[3].stored && events[3].key == k1 && events[3].tier == Tier::kDevice);  // the move
  EXPECT_TRUE(events[4].stored && events[4].key == k1 && events[4].tier == Tier::kHost);
  EXPECT_EQ(events[4].tokens, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(!events[5].stored && events[5].key == k2);
  EXPECT_TRUE(index.TakeEvents().empty());
  // Whatever the key order, a parent comes before its child.
  for (int i = 0; i < 8; ++i) {
    index.Insert(k1, "", std::vector<int32_t>{100 + i, 0}, Tier::kDevice, {20 + i});
  }
  const std::vector<PrefixEvent> all = index.Snapshot();
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(all[0].key, k0);
  EXPECT_EQ(all[1].key, k1);
  EXPECT_EQ(all[1].tier, Tier::kHost);
  for (const PrefixEvent& e : all) EXPECT_TRUE(e.stored);
}

TEST(PrefixIndex, AHitAgesThePrefixTailFirst) {
  PrefixIndex index(2);
  const std::vector<int32_t> prompt = Iota(0, 6);
  std::vector<PrefixEntry*> chain;
  uint64_t parent = PrefixIndex::RootKey("");
  for (int p = 0; p < 3; ++p) {
    chain.push_back(index.Insert(parent, "", std::span(prompt).subspan(2 * p, 2), Tier::kDevice, {p}));
    parent = chain.back()->key;
  }
  PrefixEntry* lone = index.Insert(PrefixIndex::RootKey(""), "", std::vector<int32_t>{7, 7}, Tier::kDevice, {9});
  EXPECT_EQ(index.Oldest(Tier::kDevice), (std::vector<PrefixEntry*>{chain[0], chain[1], chain[2], lone}));
  index.Touch(chain);
  EXPECT_EQ(index.Oldest(Tier::kDevice), (std::vector<PrefixEntry*>{lone, chain[2], chain[1], chain[0]}));
  index.Move(*chain[2], Tier::kHost, {5});
  EXPECT_EQ(index.Oldest(Tier::kHost), (std::vector<PrefixEntry*>{chain[2]}));
  index.Erase(*lone);
  EXPECT_EQ(index.Oldest(Tier::kDevice), (std::vector<PrefixEntry*>{chain[1], chain[0]}));
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  // Two layers of 4-token pages: a cached page is 2 blocks.
  BlockPool device_{Tier::kDevice, 12, 64};
  BlockPool host_{Tier::kHost, 4, 64};
  KvCacheManager m_{device_, host_, {.n_layers = 2, .block_tokens = 4, .prefix_cache = true}};
  const std::vector<int32_t> doc_ = Iota(1000, 10);  // two whole pages and two tokens

  // Sequence 1 computes the document, which the cache keeps after it.
  void CacheDocument() {
    Compute(1, doc_);
    EXPECT_EQ(m_.CachePrefix(1, doc_, ""), 2);
    m_.Release(1);
  }
  // A sequence that computed `tokens` at both layers.
  void Compute(int64_t seq, const std::vector<int32_t>& tokens, int from = 0) {
    for (int l = 0; l < 2; ++l) ASSERT_TRUE(m_.Append(seq, l, Iota(from, static_cast<int>(tokens.size()) - from)));
  }
};

TEST_F(PrefixCacheTest, ALaterSequenceSharesTheCachedPages) {
  Compute(1, doc_);  // layer 0: blocks 0-2, layer 1: 3-5
  EXPECT_EQ(m_.CachePrefix(1, doc_, ""), 2);
  m_.Release(1);
  EXPECT_INTACT(m_);
  EXPECT_EQ(device_.num_free(), 8);  // the cache keeps 0, 1, 3, 4
  EXPECT_EQ(m_.Evictable(Tier::kDevice), 4);

  std::vector<int32_t> question = doc_;
  question.push_back(7);
  const PrefixHit hit = m_.AttachPrefix(2, question, "");
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.host_tokens, 0);
  EXPECT_EQ(m_.Table(2, 0).blocks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(m_.Table(2, 1).blocks, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(m_.Table(2, 1).positions, Iota(0, 8));
  EXPECT_EQ(m_.BlocksIn(2, Tier::kDevice), 4);
  EXPECT_EQ(m_.Evictable(Tier::kDevice), 0);  // held
  EXPECT_INTACT(m_);
  // The rest is appended after the shared pages, in blocks of its own.
  Compute(2, question, 8);
  EXPECT_EQ(m_.Table(2, 0).blocks.size(), 3u);
  EXPECT_INTACT(m_);
  m_.Release(2);
  EXPECT_EQ(device_.num_free(), 8);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, AtLeastOneTokenIsLeftToCompute) {
  Compute(1, doc_);
  m_.CachePrefix(1, doc_, "");
  const std::vector<int32_t> eight(doc_.begin(), doc_.begin() + 8);
  EXPECT_EQ(m_.AttachPrefix(2, eight, "").tokens, 4);  // the last page is recomputed for its last token
  EXPECT_EQ(m_.AttachPrefix(3, std::vector<int32_t>(doc_.begin(), doc_.begin() + 4), "").tokens, 0);
  EXPECT_FALSE(m_.Contains(3));
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, SaltsAndStrategiesKeepPrefixesApart) {
  Compute(1, doc_);
  EXPECT_EQ(m_.CachePrefix(1, doc_, "tenant-a"), 2);
  EXPECT_EQ(m_.AttachPrefix(2, doc_, "tenant-b").tokens, 0);
  EXPECT_EQ(m_.AttachPrefix(3, doc_, "tenant-a").tokens, 8);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, PrunedOrPartialPagesAreNotCached) {
  for (int l = 0; l < 2; ++l)
    ASSERT_TRUE(m_.Append(1, l, l == 0 ? Iota(0, 10) : std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7, 8}));
  EXPECT_EQ(m_.CachePrefix(1, doc_, ""), 1);  // page 1 of layer 1 skips token 4
  m_.Release(1);
  EXPECT_EQ(m_.AttachPrefix(2, doc_, "").tokens, 4);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, EvictionMovesTheOldestToTheHostThenDropsThem) {
  CacheDocument();
  const std::vector<int32_t> other = Iota(2000, 5);
  Compute(2, other);  // layer 0: blocks 6, 7; layer 1: 8, 9
  m_.CachePrefix(2, other, "");
  m_.Release(2);
  EXPECT_EQ(m_.CachedPages(Tier::kDevice), 3);
  const int64_t before = m_.Available(Tier::kDevice);

  // Two blocks: doc's second page goes first (a prefix loses its tail first).
  SwapPlan plan = m_.PlanEvict(2);
  ASSERT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(plan.copies[0].src, 1);
  EXPECT_EQ(plan.copies[1].src, 4);
  EXPECT_EQ(plan.device_frees, 2);
  EXPECT_EQ(m_.Available(Tier::kDevice), before + 2);
  EXPECT_INTACT(m_);
  // Not found again until its copy has landed.
  EXPECT_EQ(m_.AttachPrefix(3, doc_, "").tokens, 4);
  m_.Release(3);
  m_.Complete(plan);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 1);
  EXPECT_EQ(host_.num_free(), 2);
  EXPECT_INTACT(m_);

  // Found in the host tier: the sequence is brought in like a swapped one.
  PrefixHit hit = m_.AttachPrefix(4, doc_, "");
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.host_tokens, 4);
  const PrefixCacheCounts counts = m_.prefix_counts();
  EXPECT_EQ(counts.queried_tokens, 20);  // sequences 3 and 4
  EXPECT_EQ(counts.hit_tokens[static_cast<int>(Tier::kDevice)], 8);
  EXPECT_EQ(counts.hit_tokens[static_cast<int>(Tier::kHost)], 4);
  EXPECT_EQ(counts.evicted_to_host, 2);
  EXPECT_EQ(counts.dropped, 0);
  EXPECT_EQ(m_.BlocksIn(4, Tier::kHost), 2);
  ASSERT_TRUE(m_.Reserve(4, 2));
  std::optional<SwapPlan> in = m_.PlanSwapIn(4);
  ASSERT_TRUE(in);
  m_.Complete(*in);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 1);  // the cache keeps its host copy
  EXPECT_INTACT(m_);
  // Caching the sequence's prefix again keeps the device copy.
  EXPECT_EQ(m_.CachePrefix(4, doc_, ""), 2);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 0);
  EXPECT_EQ(host_.num_free(), 4);
  m_.Release(4);
  m_.EndStep();
  EXPECT_INTACT(m_);

  // With the host tier full, what does not fit there is dropped.
  ASSERT_TRUE(m_.Append(5, 0, Iota(0, 16)));  // host blocks 0-3 in use by a swapped sequence
  std::optional<SwapPlan> out = m_.PlanSwapOut(5);
  ASSERT_TRUE(out);
  m_.Complete(*out);
  SwapPlan drop = m_.PlanEvict(100);
  EXPECT_TRUE(drop.copies.empty());
  EXPECT_EQ(m_.CachedPages(Tier::kDevice), 0);
  EXPECT_EQ(device_.num_free(), 12);
  EXPECT_EQ(m_.prefix_counts().dropped, 6);  // doc's two pages and other's one, two layers each
  m_.Complete(drop);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, ASwapOutTakesHostRoomFromTheCache) {
  CacheDocument();
  SwapPlan plan = m_.PlanEvict(4);
  m_.Complete(plan);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 2);
  EXPECT_EQ(m_.Available(Tier::kHost), 4);  // cached pages no one holds count as room
  ASSERT_TRUE(m_.Append(2, 0, Iota(0, 12)));
  std::optional<SwapPlan> out = m_.PlanSwapOut(2);
  ASSERT_TRUE(out);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 0);  // the older page went for the running sequence's KV
  m_.Complete(*out);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, AFailedEvictionForgetsItsPagesAndAFlushKeepsWhatIsHeld) {
  CacheDocument();
  SwapPlan plan = m_.PlanEvict(2);
  m_.Complete(plan);
  m_.ForgetEvicted(plan);
  EXPECT_EQ(m_.CachedPages(Tier::kHost), 0);
  EXPECT_EQ(m_.CachedPages(Tier::kDevice), 1);
  EXPECT_INTACT(m_);
  EXPECT_EQ(m_.AttachPrefix(2, doc_, "").tokens, 4);
  const std::vector<int32_t> other = Iota(2000, 5);
  Compute(3, other);
  m_.CachePrefix(3, other, "");
  m_.Release(3);
  EXPECT_EQ(m_.FlushPrefixCache(), 2);  // sequence 2 still holds doc's first page
  EXPECT_EQ(m_.CachedPages(Tier::kDevice), 1);
  m_.Release(2);
  EXPECT_EQ(m_.FlushPrefixCache(), 2);
  EXPECT_EQ(device_.num_free(), 12);
  EXPECT_INTACT(m_);
}

TEST_F(PrefixCacheTest, OffByDefault) {
  KvCacheManager off(device_, host_, 2, 4);
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(off.Append(1, l, Iota(0, 10)));
  EXPECT_EQ(off.CachePrefix(1, doc_, ""), 0);
  EXPECT_EQ(off.AttachPrefix(2, doc_, "").tokens, 0);
  EXPECT_INTACT(off);
}

// Random starts, releases, evictions, swaps and flushes over a small cache. Each
// block's bytes hold the tokens (and layer) of its slots, written where they are
// computed and carried by every planned copy; a hit must hand a sequence exactly
// the KV of its own prefix, and once everything is released and flushed every
// block is free.
TEST(PrefixCacheOps, AHitAlwaysHoldsTheKvOfItsOwnPrefix) {
  constexpr int kLayers = 2, kPage = 4;
  BlockPool device(Tier::kDevice, 24, 64), host(Tier::kHost, 10, 64);
  KvCacheManager m(device, host, {.n_layers = kLayers, .block_tokens = kPage, .prefix_cache = true});
  std::mt19937 rng(7);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  auto run = [&](const SwapPlan& plan) {
    for (const BlockCopy& c : plan.copies) {
      BlockPool& from = c.src_tier == Tier::kDevice ? device : host;
      BlockPool& to = c.dst_tier == Tier::kDevice ? device : host;
      std::memcpy(to.data(c.dst), from.data(c.src), 64);
    }
    m.Complete(plan);
  };
  // What slot k of (layer, page p) holds: token and layer, in the block's bytes.
  auto write = [&](int64_t seq, const std::vector<int32_t>& tokens, int from) {
    for (int l = 0; l < kLayers; ++l) {
      const LayerTable& t = m.Table(seq, l);
      for (int k = from; k < static_cast<int>(tokens.size()); ++k) {
        const int32_t slot[2] = {tokens[k], l};
        std::memcpy(device.data(t.blocks[k / kPage]) + (k % kPage) * 8, slot, 8);
      }
    }
  };
  auto holds = [&](int64_t seq, const std::vector<int32_t>& tokens, int n) {
    for (int l = 0; l < kLayers; ++l) {
      const LayerTable& t = m.Table(seq, l);
      for (int k = 0; k < n; ++k) {
        int32_t slot[2];
        std::memcpy(
            slot, (t.tiers[k / kPage] == Tier::kDevice ? device : host).data(t.blocks[k / kPage]) + (k % kPage) * 8, 8);
        if (slot[0] != tokens[k] || slot[1] != l) return false;
      }
    }
    return true;
  };
  const std::vector<std::vector<int32_t>> docs = {Iota(100, 13), Iota(200, 9), Iota(300, 17)};
  struct Live {
    int64_t id;
    std::vector<int32_t> tokens;
    bool out = false;
  };
  std::vector<Live> live;
  int64_t next = 1, hits = 0, host_hits = 0, evicted = 0, starts = 0;
  for (int op = 0; op < 4000; ++op) {
    const int what = pick(10);
    if (what < 4) {  // a request: a document, a question, a salt
      std::vector<int32_t> tokens = docs[pick(3)];
      for (int q = pick(6); q > 0; --q) tokens.push_back(pick(3));
      const std::string salt = pick(4) == 0 ? "b" : "";
      const int64_t id = next++;
      ++starts;
      const PrefixHit hit = m.AttachPrefix(id, tokens, salt);
      hits += hit.tokens > 0;
      if (hit.host_tokens > 0) {
        ++host_hits;
        std::optional<SwapPlan> in = m.PlanSwapIn(id);
        if (!in) {
          m.Release(id);
          continue;
        }
        run(*in);
      }
      ASSERT_TRUE(holds(id, tokens, static_cast<int>(hit.tokens))) << "op " << op;
      bool fits = true;
      for (int l = 0; l < kLayers && fits; ++l) {
        const auto rest = Iota(static_cast<int>(hit.tokens), static_cast<int>(tokens.size() - hit.tokens));
        if (!m.Append(id, l, rest)) {
          const SwapPlan plan = m.PlanEvict(m.BlocksNeeded(id, static_cast<int64_t>(rest.size())));
          evicted += static_cast<int64_t>(plan.copies.size());
          run(plan);
          fits = m.Append(id, l, rest);
        }
      }
      if (!fits) {
        m.Release(id);
        continue;
      }
      write(id, tokens, static_cast<int>(hit.tokens));
      m.CachePrefix(id, tokens, salt);
      live.push_back({id, tokens});
    } else if (what < 7 && !live.empty()) {
      const size_t i = pick(static_cast<int>(live.size()));
      m.Release(live[i].id);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (what == 7) {
      const SwapPlan plan = m.PlanEvict(pick(8));
      evicted += static_cast<int64_t>(plan.copies.size());
      run(plan);
    } else if (what == 8 && !live.empty()) {  // a swap out, or back in
      Live& s = live[pick(static_cast<int>(live.size()))];
      std::optional<SwapPlan> plan = s.out ? m.PlanSwapIn(s.id) : m.PlanSwapOut(s.id);
      if (plan) {
        run(*plan);
        s.out = !s.out;
      }
      ASSERT_TRUE(holds(s.id, s.tokens, static_cast<int>(s.tokens.size()))) << "op " << op;
    } else if (what == 9 && pick(20) == 0) {
      m.FlushPrefixCache();
    }
    ASSERT_TRUE(m.VerifyIntegrity().ok()) << "op " << op << ": " << m.VerifyIntegrity();
  }
  // The run did what it is for.
  EXPECT_GT(hits, starts / 4);
  EXPECT_GT(host_hits, 20);
  EXPECT_GT(evicted, 50);
  for (const Live& s : live) m.Release(s.id);
  m.FlushPrefixCache();
  EXPECT_EQ(device.num_free(), device.num_blocks());
  EXPECT_EQ(host.num_free(), host.num_blocks());
  EXPECT_INTACT(m);
}

}  // namespace
}  // namespace ps
