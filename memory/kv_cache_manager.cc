#include "memory/kv_cache_manager.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

// fn(page, id) for every block of the table's pages that is not dropped.
template <typename Table, typename Fn>
void ForLiveBlocks(Table& t, int per_page, Fn&& fn) {
  for (int64_t p = 0; p < t.pages(); ++p) {
    for (int i = 0; i < per_page; ++i) {
      auto& id = t.blocks[p * per_page + i];
      if (id != LayerTable::kDropped) fn(p, id);
    }
  }
}

}  // namespace

KvCacheManager::KvCacheManager(BlockPool& device, BlockPool& host, const Options& o)
    : device_(device),
      host_(host),
      n_layers_(o.n_layers),
      block_tokens_(o.block_tokens),
      blocks_per_page_(o.blocks_per_page),
      metered_(o.metered),
      host_rows_(host, o.host_row_bytes),
      prefix_enabled_(o.prefix_cache),
      prefix_(o.block_tokens) {
  PS_CHECK(n_layers_ > 0 && block_tokens_ > 0 && blocks_per_page_ > 0) << "bad KV geometry";
  PS_CHECK(device.tier() == Tier::kDevice && host.tier() == Tier::kHost) << "pools in the wrong tiers";
  pending_[0].assign(device.num_blocks(), 0);
  pending_[1].assign(host.num_blocks(), 0);
}

bool KvCacheManager::Unref(Tier tier, int32_t id) {
  BlockPool& p = pool(tier);
  const bool last = p.ref_count(id) == 1;
  p.Release(id);
  return last;
}

void KvCacheManager::ReleaseAfter(SwapPlan* plan, Tier tier, int32_t id) {
  plan->release_after.push_back({tier, id});
  // The table's reference is the plan's now: no table holds the block when all
  // its references are plans'.
  const int32_t pending = ++pending_[static_cast<int>(tier)][id];
  if (tier == Tier::kDevice && pool(tier).ref_count(id) == pending) ++plan->device_frees;
}

SwapPlan& KvCacheManager::Issue(SwapPlan& plan) {
  releasing_ += plan.device_frees;
  if (!plan.copies.empty() || !plan.release_after.empty()) ++in_flight_[plan.seq];
  return plan;
}

int KvCacheManager::InFlight(int64_t seq) const {
  auto it = in_flight_.find(seq);
  return it == in_flight_.end() ? 0 : it->second;
}

void KvCacheManager::CheckLive(int64_t seq) const {
  PS_CHECK(!released_.contains(seq)) << "sequence " << seq << " used after its release";
}

KvCacheManager::SeqKv& KvCacheManager::Seq(int64_t seq) {
  SeqKv& s = seqs_[seq];
  if (s.layers.empty()) s.layers.resize(n_layers_);
  return s;
}

const LayerTable& KvCacheManager::Table(int64_t seq, int layer) const {
  static const LayerTable kEmpty;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kEmpty : it->second.layers.at(layer);
}

int64_t KvCacheManager::BlocksNeeded(int64_t seq, int64_t n_tokens) const {
  int64_t pages = 0, copied = 0;
  for (int l = 0; l < n_layers_; ++l) {
    const LayerTable& t = Table(seq, l);
    const int64_t filled = static_cast<int64_t>(t.positions.size()), capacity = t.pages() * block_tokens_;
    const int64_t after = filled + n_tokens;
    if (after > capacity) pages += (after - capacity + block_tokens_ - 1) / block_tokens_;
    if (n_tokens > 0 && filled < capacity && t.tiers.back() == Tier::kDevice) {
      for (int64_t i = (t.pages() - 1) * blocks_per_page_; i < t.pages() * blocks_per_page_; ++i) {
        copied += t.blocks[i] != LayerTable::kDropped && device_.ref_count(t.blocks[i]) > 1;
      }
    }
  }
  return pages * blocks_per_page_ + copied;
}

int64_t KvCacheManager::BlocksIn(int64_t seq, Tier tier) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.held[static_cast<int>(tier)];
}

int64_t KvCacheManager::OwnBlocks(int64_t seq, Tier tier) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int64_t n = 0;
  for (const LayerTable& t : it->second.layers) {
    ForLiveBlocks(t, blocks_per_page_,
                  [&](int64_t p, int32_t id) { n += t.tiers[p] == tier && pool(tier).ref_count(id) == 1; });
  }
  return n;
}

KvCacheManager::Peak KvCacheManager::PeakBlocks(int64_t seq) const {
  auto it = peaks_.find(seq);
  return it == peaks_.end() ? Peak{} : it->second;
}

void KvCacheManager::NotePeak(int64_t seq) {
  const int64_t owner = ScratchOwner(seq);
  Peak now;
  for (int64_t id : {owner, ~owner}) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    const SeqKv& s = it->second;
    now.device += s.held[static_cast<int>(Tier::kDevice)];
    now.total += s.held[0] + s.held[1] + s.host_copies;
  }
  Peak& peak = peaks_[owner];
  peak.device = std::max(peak.device, now.device);
  peak.total = std::max(peak.total, now.total);
}

int64_t KvCacheManager::Available(Tier tier) const {
  if (tier == Tier::kHost) return host_.num_free() + host_copies_ + Evictable(Tier::kHost);
  return device_.num_free() + releasing_ - reserved_total_;
}

bool KvCacheManager::Reserve(int64_t seq, int64_t n) {
  PS_CHECK(n >= 0 && seq >= 0) << "reserve " << n << " blocks for sequence " << seq;
  if (!metered_) return true;
  if (n > Available(Tier::kDevice)) return false;
  reserved_[seq] += n;
  reserved_total_ += n;
  return true;
}

int64_t KvCacheManager::Reserved(int64_t seq) const {
  auto it = reserved_.find(seq);
  return it == reserved_.end() ? 0 : it->second;
}

void KvCacheManager::EndStep() {
  reserved_.clear();
  reserved_total_ = 0;
}

void KvCacheManager::Credit(int64_t seq, int64_t n) {
  if (!metered_ || n == 0) return;
  reserved_[seq] += n;
  reserved_total_ += n;
}

std::optional<std::vector<int32_t>> KvCacheManager::TakeDevice(int64_t seq, int64_t n) {
  if (n == 0) return std::vector<int32_t>{};
  if (metered_) {
    auto it = reserved_.find(ScratchOwner(seq));
    if (it == reserved_.end() || it->second < n) return std::nullopt;
    std::optional<std::vector<int32_t>> ids = device_.Allocate(static_cast<int32_t>(n));
    if (ids) {
      it->second -= n;
      reserved_total_ -= n;
    }
    return ids;
  }
  return device_.Allocate(static_cast<int32_t>(n));
}

bool KvCacheManager::Append(int64_t seq, int layer, std::span<const int32_t> positions, std::vector<BlockCopy>* cow) {
  PS_CHECK(layer >= 0 && layer < n_layers_) << "layer " << layer;
  CheckLive(seq);
  SeqKv& s = Seq(seq);
  LayerTable& t = s.layers[layer];
  const int64_t capacity = t.pages() * block_tokens_;
  const int64_t filled = static_cast<int64_t>(t.positions.size());
  const int64_t after = filled + static_cast<int64_t>(positions.size());
  if (filled < capacity && t.tiers.back() != Tier::kDevice) return false;  // the tail page was moved out
  const int64_t pages = after > capacity ? (after - capacity + block_tokens_ - 1) / block_tokens_ : 0;
  // Blocks of the partly filled last page that another sequence shares: the rows
  // must not land in its data, so this sequence writes into copies of its own.
  std::vector<int64_t> shared;
  if (filled < capacity && !positions.empty()) {
    for (int64_t i = (t.pages() - 1) * blocks_per_page_; i < t.pages() * blocks_per_page_; ++i) {
      if (t.blocks[i] != LayerTable::kDropped && device_.ref_count(t.blocks[i]) > 1) shared.push_back(i);
    }
  }
  std::optional<std::vector<int32_t>> ids =
      TakeDevice(seq, pages * blocks_per_page_ + static_cast<int64_t>(shared.size()));
  if (!ids) return false;
  PS_CHECK(shared.empty() || cow != nullptr) << "an append to a shared page with nowhere to put its copies";
  for (int64_t i : shared) {
    const int32_t copy = ids->back();
    ids->pop_back();
    cow->push_back({Tier::kDevice, t.blocks[i], Tier::kDevice, copy});
    Unref(Tier::kDevice, t.blocks[i]);  // still held by the sharer: its data outlives the copy
    t.blocks[i] = copy;
  }
  if (!t.host_copies.empty()) {
    if (filled < capacity) {  // the tail page is written: its host copies go stale
      for (int i = 0; i < blocks_per_page_; ++i) {
        ReleaseHostCopy(s, t, (t.pages() - 1) * blocks_per_page_ + i);
      }
    }
    t.host_copies.resize(t.blocks.size() + ids->size(), LayerTable::kDropped);
  }
  t.tiers.insert(t.tiers.end(), pages, Tier::kDevice);
  // Block i of each new page from the i-th run of `pages` ids: the pool hands out ids in
  // its free list's order (consecutive ones while it is unfragmented), so each KV head's K
  // (and V) rows of a prefill chunk lie in consecutive blocks, which decode reads as one
  // stream. (Taken page after page, a head's successive blocks lay 2 * n_kv_heads blocks
  // apart: `ps_bench_engine --decode-depth`, Zen 4, 16-token blocks, alternated runs, decode
  // at 8k 4% slower on SmolLM2, 6% on Qwen2.5-0.5B.)
  const size_t first = t.blocks.size();
  t.blocks.resize(first + ids->size());
  for (int64_t q = 0; q < pages; ++q) {
    for (int i = 0; i < blocks_per_page_; ++i) t.blocks[first + q * blocks_per_page_ + i] = (*ids)[i * pages + q];
  }
  s.held[static_cast<int>(Tier::kDevice)] += pages * blocks_per_page_;
  for (int32_t p : positions) {
    if (!t.positions.empty() && p <= t.positions.back()) t.ascending = false;
    t.positions.push_back(p);
  }
  if (pages > 0 || !shared.empty()) NotePeak(seq);
  return true;
}

void KvCacheManager::Fork(int64_t parent, int64_t child) {
  CheckLive(parent);
  PS_CHECK(child != parent && !seqs_.contains(child) && !released_.contains(child) && InFlight(parent) == 0)
      << "fork of sequence " << parent << " into " << child;
  auto it = seqs_.find(parent);
  if (it == seqs_.end()) return;  // nothing to share
  SeqKv c{.layers = it->second.layers, .held = {it->second.held[0], it->second.held[1]}};
  for (LayerTable& t : c.layers) {
    t.host_copies.clear();
    ForLiveBlocks(t, blocks_per_page_, [&](int64_t p, int32_t id) { pool(t.tiers[p]).AddRef(id); });
  }
  seqs_.emplace(child, std::move(c));
  NotePeak(child);
}

std::optional<SwapPlan> KvCacheManager::PlanMoveAll(int64_t seq, Tier from, Tier to) {
  CheckLive(seq);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return SwapPlan{.seq = seq};
  const int64_t n = BlocksIn(seq, from);
  int64_t to_copy = 0;
  for (const LayerTable& t : it->second.layers) {
    for (int64_t p = 0; p < t.pages(); ++p) {
      int64_t c = 0;
      if (t.tiers[p] == from) LiveBlocks(t, p, to, &c);
      to_copy += c;
    }
  }
  std::optional<std::vector<int32_t>> ids = to == Tier::kDevice ? TakeDevice(seq, to_copy) : TakeHost(to_copy, seq);
  if (!ids) return std::nullopt;
  SwapPlan plan{.seq = seq};
  size_t k = 0;
  it->second.held[static_cast<int>(from)] -= n;
  it->second.held[static_cast<int>(to)] += n;
  AddHostCopies(it->second, to_copy - n);  // taken back into the tables (none when moving to the device)
  for (LayerTable& t : it->second.layers) {
    for (int64_t p = 0; p < t.pages(); ++p) {
      if (t.tiers[p] == from) MovePage(t, p, to, *ids, &k, /*keep_clean=*/false, &plan);
    }
  }
  NotePeak(seq);
  return Issue(plan);
}

int64_t KvCacheManager::LiveBlocks(const LayerTable& t, int64_t p, Tier to, int64_t* to_copy) const {
  int64_t live = 0;
  *to_copy = 0;
  for (int64_t i = p * blocks_per_page_; i < (p + 1) * blocks_per_page_; ++i) {
    if (t.blocks[i] == LayerTable::kDropped) continue;
    ++live;
    const bool clean = to == Tier::kHost && !t.host_copies.empty() && t.host_copies[i] != LayerTable::kDropped;
    *to_copy += !clean;
  }
  return live;
}

void KvCacheManager::ReleaseHostCopy(SeqKv& s, LayerTable& t, int64_t i) {
  if (t.host_copies.empty() || t.host_copies[i] == LayerTable::kDropped) return;
  Unref(Tier::kHost, t.host_copies[i]);
  t.host_copies[i] = LayerTable::kDropped;
  AddHostCopies(s, -1);
}

std::optional<std::vector<int32_t>> KvCacheManager::TakeHost(int64_t n, int64_t except) {
  for (auto& [id, s] : seqs_) {
    if (host_.num_free() >= n || host_copies_ == 0) break;
    if (id == except || s.host_copies == 0) continue;
    for (LayerTable& t : s.layers) {
      for (int64_t i = 0; i < static_cast<int64_t>(t.host_copies.size()) && host_.num_free() < n; ++i) {
        ReleaseHostCopy(s, t, i);
      }
    }
  }
  FreeHostFromCache(n, std::numeric_limits<uint64_t>::max());  // a running sequence's KV before a cached page
  return host_.Allocate(static_cast<int32_t>(n));
}

void KvCacheManager::MovePage(LayerTable& t, int64_t p, Tier to, const std::vector<int32_t>& ids, size_t* next,
                              bool keep_clean, SwapPlan* plan) {
  const Tier from = t.tiers[p];
  if (keep_clean && to == Tier::kDevice && t.host_copies.empty()) {
    t.host_copies.assign(t.blocks.size(), LayerTable::kDropped);
  }
  for (int64_t i = p * blocks_per_page_; i < (p + 1) * blocks_per_page_; ++i) {
    int32_t& id = t.blocks[i];
    if (id == LayerTable::kDropped) continue;
    int32_t* copy = t.host_copies.empty() ? nullptr : &t.host_copies[i];
    if (to == Tier::kHost && copy != nullptr && *copy != LayerTable::kDropped) {
      ReleaseAfter(plan, from, id);  // the host still holds these bytes
      id = std::exchange(*copy, LayerTable::kDropped);
      continue;
    }
    const int32_t dst = ids[(*next)++];
    plan->copies.push_back({from, id, to, dst});
    if (keep_clean && to == Tier::kDevice) {
      *copy = id;
    } else {
      ReleaseAfter(plan, from, id);
    }
    id = dst;
  }
  t.tiers[p] = to;
}

std::optional<SwapPlan> KvCacheManager::PlanSwapOut(int64_t seq) {
  return PlanMoveAll(seq, Tier::kDevice, Tier::kHost);
}
std::optional<SwapPlan> KvCacheManager::PlanSwapIn(int64_t seq) { return PlanMoveAll(seq, Tier::kHost, Tier::kDevice); }

std::optional<SwapPlan> KvCacheManager::PlanMove(int64_t seq, int layer, std::span<const int32_t> pages, Tier to) {
  CheckLive(seq);
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || layer < 0 || layer >= n_layers_) return std::nullopt;
  LayerTable& t = it->second.layers[layer];
  std::vector<int32_t> moving;
  int64_t n = 0, to_copy = 0;
  for (int32_t p : pages) {
    if (p < 0 || p >= t.pages()) return std::nullopt;
    if (t.tiers[p] != to && std::find(moving.begin(), moving.end(), p) == moving.end()) {
      moving.push_back(p);
      int64_t c = 0;
      n += LiveBlocks(t, p, to, &c);
      to_copy += c;
    }
  }
  std::optional<std::vector<int32_t>> ids = to == Tier::kDevice ? TakeDevice(seq, to_copy) : TakeHost(to_copy, seq);
  if (!ids) return std::nullopt;
  SwapPlan plan{.seq = seq, .credit_seq = seq};
  const Tier from = to == Tier::kDevice ? Tier::kHost : Tier::kDevice;
  it->second.held[static_cast<int>(from)] -= n;
  it->second.held[static_cast<int>(to)] += n;
  size_t k = 0;
  for (int32_t p : moving) MovePage(t, p, to, *ids, &k, /*keep_clean=*/true, &plan);
  AddHostCopies(it->second, to == Tier::kDevice ? to_copy : to_copy - n);  // kept, or taken back into the table
  NotePeak(seq);
  return Issue(plan);
}

int64_t KvCacheManager::Drop(int64_t seq, int layer, std::span<const int32_t> pages, int index) {
  auto it = seqs_.find(seq);
  PS_CHECK(it != seqs_.end() && layer >= 0 && layer < n_layers_ && index >= 0 && index < blocks_per_page_)
      << "drop block " << index << " of sequence " << seq << " layer " << layer;
  LayerTable& t = it->second.layers[layer];
  int64_t dropped[2] = {0, 0}, device_freed = 0;
  for (int32_t p : pages) {
    PS_CHECK(p >= 0 && p < t.pages()) << "drop from page " << p << " of " << t.pages();
    int32_t& id = t.blocks[p * blocks_per_page_ + index];
    if (id == LayerTable::kDropped) continue;
    ReleaseHostCopy(it->second, t, p * blocks_per_page_ + index);
    device_freed += Unref(t.tiers[p], id) && t.tiers[p] == Tier::kDevice;
    id = LayerTable::kDropped;
    ++dropped[static_cast<int>(t.tiers[p])];
  }
  it->second.held[0] -= dropped[0];
  it->second.held[1] -= dropped[1];
  Credit(ScratchOwner(seq), device_freed);
  return dropped[0] + dropped[1];
}

void KvCacheManager::Complete(const SwapPlan& plan) {
  int64_t device_freed = 0;
  for (const BlockLoc& b : plan.release_after) {
    int32_t& pending = pending_[static_cast<int>(b.tier)][b.id];
    PS_CHECK(pending > 0) << "a plan completed twice, or not issued here";
    --pending;
    device_freed += Unref(b.tier, b.id) && b.tier == Tier::kDevice;
  }
  releasing_ -= plan.device_frees;
  PS_CHECK(releasing_ >= 0) << "more device blocks released than planned";
  if (plan.credit_seq >= 0) Credit(plan.credit_seq, device_freed);
  if (plan.copies.empty() && plan.release_after.empty()) return;
  auto it = in_flight_.find(plan.seq);
  PS_CHECK(it != in_flight_.end()) << "a plan of sequence " << plan.seq << " completed twice";
  if (--it->second > 0) return;
  in_flight_.erase(it);
  if (released_.erase(plan.seq) != 0) Free(plan.seq);  // its release waited for this copy
}

void KvCacheManager::Release(int64_t seq) {
  PS_CHECK(seq >= 0) << "release of scratch sequence " << seq;
  if (InFlight(seq) > 0) {
    released_.insert(seq);
  } else {
    Free(seq);
  }
}

int64_t KvCacheManager::ReleaseLayer(SeqKv& s, LayerTable& t) {
  int64_t held[2] = {0, 0}, device_freed = 0;
  ForLiveBlocks(t, blocks_per_page_, [&](int64_t p, int32_t id) {
    device_freed += Unref(t.tiers[p], id) && t.tiers[p] == Tier::kDevice;
    ++held[static_cast<int>(t.tiers[p])];
  });
  for (int64_t i = 0; i < static_cast<int64_t>(t.host_copies.size()); ++i) ReleaseHostCopy(s, t, i);
  s.held[0] -= held[0];
  s.held[1] -= held[1];
  t = LayerTable{};
  return device_freed;
}

void KvCacheManager::FreeLayer(int64_t seq, int layer) {
  auto it = seqs_.find(seq);
  PS_CHECK(layer >= 0 && layer < n_layers_) << "free layer " << layer << " of sequence " << seq;
  if (it == seqs_.end()) return;
  Credit(ScratchOwner(seq), ReleaseLayer(it->second, it->second.layers[layer]));
}

void KvCacheManager::Free(int64_t seq) {
  PS_CHECK(InFlight(seq) == 0) << "sequence " << seq << " freed while copies of its blocks are in flight";
  host_rows_.Release(seq);
  if (seq >= 0) peaks_.erase(seq);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  int64_t device_freed = 0;
  for (LayerTable& t : it->second.layers) device_freed += ReleaseLayer(it->second, t);
  seqs_.erase(it);
  if (seq < 0) Credit(ScratchOwner(seq), device_freed);
}

absl::Status KvCacheManager::VerifyIntegrity() const {
  PS_RETURN_IF_ERROR(device_.VerifyIntegrity());
  PS_RETURN_IF_ERROR(host_.VerifyIntegrity());
  std::vector<int32_t> refs[2] = {pending_[0], pending_[1]};  // per tier and block: references expected
  for (const auto& [seq, s] : seqs_) {
    int64_t held[2] = {0, 0};
    for (size_t l = 0; l < s.layers.size(); ++l) {
      const LayerTable& t = s.layers[l];
      // Pages are taken only as slots need them: exactly ceil(tokens / block_tokens).
      if (t.tiers.size() != (t.positions.size() + block_tokens_ - 1) / block_tokens_ ||
          t.blocks.size() != t.tiers.size() * blocks_per_page_) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " layer ", l, ": ", t.tiers.size(), " pages of ",
                                                t.blocks.size(), " blocks for ", t.positions.size(), " tokens"));
      }
      if (t.ascending != std::is_sorted(t.positions.begin(), t.positions.end(), std::less_equal<int32_t>())) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " layer ", l, ": stale ascending flag"));
      }
      ForLiveBlocks(t, blocks_per_page_, [&](int64_t p, int32_t id) {
        ++refs[static_cast<int>(t.tiers[p])][id];
        ++held[static_cast<int>(t.tiers[p])];
      });
      if (!t.host_copies.empty() && t.host_copies.size() != t.blocks.size()) {
        return absl::InternalError(absl::StrCat("sequence ", seq, " layer ", l, ": host copies not sized by blocks"));
      }
      for (size_t i = 0; i < t.host_copies.size(); ++i) {
        if (t.host_copies[i] == LayerTable::kDropped) continue;
        if (t.tiers[i / blocks_per_page_] != Tier::kDevice || t.blocks[i] == LayerTable::kDropped) {
          return absl::InternalError(
              absl::StrCat("sequence ", seq, " layer ", l, ": a host copy of block ", i, ", not a live device block"));
        }
        ++refs[static_cast<int>(Tier::kHost)][t.host_copies[i]];
      }
    }
    int64_t copies = 0;
    for (const LayerTable& t : s.layers) {
      copies += std::ranges::count_if(t.host_copies, [](int32_t id) { return id != LayerTable::kDropped; });
    }
    if (copies != s.host_copies) {
      return absl::InternalError(
          absl::StrCat("sequence ", seq, ": ", s.host_copies, " host copies counted, ", copies, " in the tables"));
    }
    if (held[0] != s.held[0] || held[1] != s.held[1]) {
      return absl::InternalError(absl::StrCat("sequence ", seq, ": block counts ", s.held[0], "/", s.held[1],
                                              " for tables holding ", held[0], "/", held[1]));
    }
  }
  for (const PrefixEntry* e : prefix_.All()) {
    if (static_cast<int64_t>(e->blocks.size()) != int64_t{n_layers_} * blocks_per_page_) {
      return absl::InternalError(absl::StrCat("a cached page of ", e->blocks.size(), " blocks"));
    }
    for (int32_t id : e->blocks) ++refs[static_cast<int>(e->tier)][id];
  }
  int64_t copies = 0;
  for (const auto& [seq, s] : seqs_) copies += s.host_copies;
  if (copies != host_copies_) {
    return absl::InternalError(absl::StrCat(host_copies_, " host copies counted, ", copies, " held by sequences"));
  }
  // Every block is free, referenced exactly as counted, or (host tier) the host
  // row store's; blocks that only plans in flight hold are freed by them, as
  // releasing_ counts (or fewer: a sharer may let go after the plan was made).
  int64_t row_blocks = 0, freeing = 0;
  for (Tier tier : {Tier::kDevice, Tier::kHost}) {
    const BlockPool& p = pool(tier);
    const std::vector<int32_t>& expected = refs[static_cast<int>(tier)];
    const std::vector<int32_t>& pending = pending_[static_cast<int>(tier)];
    for (int32_t id = 0; id < p.num_blocks(); ++id) {
      if (tier == Tier::kHost && expected[id] == 0 && p.ref_count(id) == 1) {
        ++row_blocks;
        continue;
      }
      if (p.ref_count(id) != expected[id]) {
        return absl::InternalError(absl::StrCat(std::string(TierName(tier)), " block ", id, " has ", p.ref_count(id),
                                                " references but ", expected[id],
                                                " table entries, cached pages and plans"));
      }
      freeing += tier == Tier::kDevice && pending[id] > 0 && pending[id] == expected[id];
    }
  }
  if (row_blocks != host_rows_.TotalBlocks()) {
    return absl::InternalError(absl::StrCat(row_blocks, " host blocks owned outside the tables, ",
                                            host_rows_.TotalBlocks(), " in the host row store"));
  }
  if (releasing_ < 0 || releasing_ > freeing) {
    return absl::InternalError(
        absl::StrCat(releasing_, " device blocks counted as being freed, ", freeing, " held by plans alone"));
  }
  for (const int64_t seq : released_) {
    if (InFlight(seq) == 0) return absl::InternalError(absl::StrCat("sequence ", seq, " released and not freed"));
  }
  return absl::OkStatus();
}

}  // namespace ps
