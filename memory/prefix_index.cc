#include "memory/prefix_index.h"

#include <algorithm>
#include <utility>

#include "base/status.h"

namespace ps {
namespace {

// FNV-1a over bytes, then SplitMix64's finaliser: fixed across processes and
// machines (little-endian byte order of the values hashed).
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

uint64_t Finish(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool SamePage(const PrefixEntry& e, uint64_t parent, std::string_view extra, std::span<const int32_t> tokens) {
  return e.parent == parent && e.extra == extra &&
         std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end());
}

}  // namespace

PrefixIndex::PrefixIndex(int block_tokens) : block_tokens_(block_tokens) {
  PS_CHECK(block_tokens > 0) << "prefix pages of " << block_tokens << " tokens";
}

uint64_t PrefixIndex::RootKey(std::string_view extra) {
  const uint64_t h = Fnv(kFnvOffset, "root", 4);
  return Finish(Fnv(h, extra.data(), extra.size()));
}

uint64_t PrefixIndex::PageKey(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = kFnvOffset;
  for (int s = 0; s < 64; s += 8) {
    const unsigned char b = static_cast<unsigned char>(parent >> s);
    h = Fnv(h, &b, 1);
  }
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int s = 0; s < 32; s += 8) {
      const unsigned char b = static_cast<unsigned char>(u >> s);
      h = Fnv(h, &b, 1);
    }
  }
  return Finish(h);
}

PrefixEntry* PrefixIndex::Find(uint64_t parent, std::string_view extra, std::span<const int32_t> tokens) {
  auto it = entries_.find(PageKey(parent, tokens));
  return it != entries_.end() && SamePage(it->second, parent, extra, tokens) ? &it->second : nullptr;
}

std::vector<PrefixEntry*> PrefixIndex::Match(std::string_view extra, std::span<const int32_t> tokens,
                                             int64_t max_pages) {
  std::vector<PrefixEntry*> chain;
  uint64_t parent = RootKey(extra);
  const int64_t pages = std::min<int64_t>(max_pages, static_cast<int64_t>(tokens.size()) / block_tokens_);
  for (int64_t p = 0; p < pages; ++p) {
    PrefixEntry* e =
        Find(parent, p == 0 ? extra : std::string_view(), tokens.subspan(p * block_tokens_, block_tokens_));
    if (e == nullptr) break;
    chain.push_back(e);
    parent = e->key;
  }
  return chain;
}

PrefixEntry* PrefixIndex::Insert(uint64_t parent, std::string_view extra, std::span<const int32_t> tokens, Tier tier,
                                 std::vector<int32_t> blocks) {
  PS_CHECK(static_cast<int64_t>(tokens.size()) == block_tokens_) << "a prefix page of " << tokens.size() << " tokens";
  const uint64_t key = PageKey(parent, tokens);
  auto [it, added] = entries_.try_emplace(key);
  if (!added) return nullptr;
  PrefixEntry& e = it->second;
  e.key = key;
  e.parent = parent;
  e.extra = std::string(extra);
  e.tokens.assign(tokens.begin(), tokens.end());
  e.tier = tier;
  e.blocks = std::move(blocks);
  e.stamp = ++clock_;
  lru_[static_cast<int>(tier)].emplace(e.stamp, key);
  events_.push_back({.stored = true, .tier = tier, .key = key, .parent = parent, .tokens = e.tokens});
  return &e;
}

void PrefixIndex::Touch(std::span<PrefixEntry* const> chain) {
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    PrefixEntry& e = **it;
    auto& lru = lru_[static_cast<int>(e.tier)];
    lru.erase(e.stamp);
    e.stamp = ++clock_;
    lru.emplace(e.stamp, e.key);
  }
}

void PrefixIndex::Move(PrefixEntry& e, Tier tier, std::vector<int32_t> blocks) {
  events_.push_back({.stored = false, .tier = e.tier, .key = e.key, .parent = e.parent});
  events_.push_back({.stored = true, .tier = tier, .key = e.key, .parent = e.parent, .tokens = e.tokens});
  lru_[static_cast<int>(e.tier)].erase(e.stamp);
  e.tier = tier;
  e.blocks = std::move(blocks);
  lru_[static_cast<int>(tier)].emplace(e.stamp, e.key);
}

void PrefixIndex::Erase(const PrefixEntry& e) {
  events_.push_back({.stored = false, .tier = e.tier, .key = e.key, .parent = e.parent});
  lru_[static_cast<int>(e.tier)].erase(e.stamp);
  entries_.erase(e.key);
}

std::vector<PrefixEntry*> PrefixIndex::Oldest(Tier tier) {
  std::vector<PrefixEntry*> out;
  for (const auto& [stamp, key] : lru_[static_cast<int>(tier)]) out.push_back(&entries_.at(key));
  return out;
}

std::vector<const PrefixEntry*> PrefixIndex::All() const {
  std::vector<const PrefixEntry*> out;
  for (const auto& [key, e] : entries_) out.push_back(&e);
  std::sort(out.begin(), out.end(), [](const PrefixEntry* a, const PrefixEntry* b) { return a->key < b->key; });
  return out;
}

std::vector<PrefixEvent> PrefixIndex::Snapshot() const {
  // Breadth-first from the pages whose parent is no entry (first pages, and pages
  // whose parent was evicted), so that a parent precedes its children.
  std::unordered_map<uint64_t, std::vector<const PrefixEntry*>> children;
  std::vector<const PrefixEntry*> order;
  for (const PrefixEntry* e : All()) {
    if (entries_.contains(e->parent)) {
      children[e->parent].push_back(e);
    } else {
      order.push_back(e);
    }
  }
  for (size_t i = 0; i < order.size(); ++i) {
    if (auto it = children.find(order[i]->key); it != children.end()) {
      order.insert(order.end(), it->second.begin(), it->second.end());
    }
  }
  std::vector<PrefixEvent> out;
  for (const PrefixEntry* e : order) {
    out.push_back({.stored = true, .tier = e->tier, .key = e->key, .parent = e->parent, .tokens = e->tokens});
  }
  return out;
}

}  // namespace ps
