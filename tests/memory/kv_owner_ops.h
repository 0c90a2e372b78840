// Operations on the KV owner's tables (KvCacheManager) checked against a reference
// model of the counts, for the random test and the libFuzzer target alike: in the
// reference a block is an identity with a tier and a reference count, held by table
// entries (a sequence's pages) and by plans in flight; a fork shares identities, a
// write to a shared last page, a move or a swap gives the writer or the mover new
// ones. After every operation the owner's verdict (did it fit?), its block counts per
// tier and per sequence, its token counts and its own invariant check must agree
// with the reference. Three bytes make an operation: its kind and two arguments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "memory/kv_cache_manager.h"

namespace ps::testing {

class KvOwnerOps {
 public:
  static constexpr int kLayers = 2, kBlockTokens = 4, kPerPage = 2, kSeqs = 6;
  static constexpr int32_t kDeviceBlocks = 40, kHostBlocks = 24;

  KvOwnerOps()
      : device_(Tier::kDevice, kDeviceBlocks, 64),
        host_(Tier::kHost, kHostBlocks, 64),
        kv_(device_, host_, {.n_layers = kLayers, .block_tokens = kBlockTokens, .blocks_per_page = kPerPage}) {}

  enum Op : uint8_t { kAppend, kFork, kSwapOut, kSwapIn, kMove, kRelease, kComplete, kDrop, kOps };
  // What the operations so far did (a random run must do each).
  struct Counts {
    int64_t forks = 0, copies_on_write = 0, refused = 0, shared_moved = 0, cancels_in_flight = 0, drops = 0;
  };
  const Counts& counts() const { return counts_; }

  // One operation (op % kOps, arguments a and b); an error when the owner and the
  // reference disagree. Operations the owner forbids (on a sequence released with
  // copies in flight, a fork of a sequence with copies in flight) are skipped.
  absl::Status Apply(uint8_t op, uint8_t a, uint8_t b) {
    const int64_t seq = 1 + a % kSeqs;
    Seq& s = seqs_[seq];
    bool fits = true, want = true;
    switch (op % kOps) {
      case kAppend: {
        if (s.released) return absl::OkStatus();
        const int layer = (b >> 4) % kLayers, n = 1 + b % 6;
        want = RefAppend(s, layer, n);
        std::vector<int32_t> positions(n);
        std::iota(positions.begin(), positions.end(), s.layers[layer].tokens - (want ? n : 0));
        std::vector<BlockCopy> cow;
        fits = kv_.Append(seq, layer, positions, &cow);
        s.exists = true;
        if (fits && cow.size() != copied_) {
          return absl::InternalError(absl::StrCat(cow.size(), " pages copied on write, ", copied_, " expected"));
        }
        break;
      }
      case kFork: {
        const int64_t child = 1 + b % kSeqs;
        Seq& c = seqs_[child];
        if (child == seq || s.released || s.in_flight > 0 || c.exists || c.released) return absl::OkStatus();
        kv_.Fork(seq, child);
        ++counts_.forks;
        if (s.exists) {
          c = s;
          c.in_flight = 0;
          ForEntries(c, [&](Tier, int64_t uid) { ++blocks_[uid].refs; });
        }
        break;
      }
      case kSwapOut:
      case kSwapIn: {
        if (s.released) return absl::OkStatus();
        const Tier to = op % kOps == kSwapOut ? Tier::kHost : Tier::kDevice;
        std::vector<std::pair<int, int64_t>> pages;  // (layer, page)
        for (int l = 0; l < kLayers; ++l) {
          for (int64_t p = 0; p < static_cast<int64_t>(s.layers[l].tiers.size()); ++p) pages.emplace_back(l, p);
        }
        want = RefMove(s, pages, to);
        std::optional<SwapPlan> plan = to == Tier::kHost ? kv_.PlanSwapOut(seq) : kv_.PlanSwapIn(seq);
        fits = plan.has_value();
        if (plan) PS_RETURN_IF_ERROR(Issued(seq, s, *plan));
        break;
      }
      case kMove: {  // pages [first, first + count) of one layer to the host tier
        const int layer = (b >> 4) % kLayers;
        const int64_t n_pages = static_cast<int64_t>(s.layers[layer].tiers.size());
        if (s.released || n_pages == 0) return absl::OkStatus();
        const int64_t first = (b & 15) % n_pages, count = 1 + a / kSeqs % 3;
        std::vector<int32_t> ids;
        std::vector<std::pair<int, int64_t>> pages;
        for (int64_t p = first; p < std::min(n_pages, first + count); ++p) {
          ids.push_back(static_cast<int32_t>(p));
          pages.emplace_back(layer, p);
        }
        want = RefMove(s, pages, Tier::kHost);
        std::optional<SwapPlan> plan = kv_.PlanMove(seq, layer, ids, Tier::kHost);
        fits = plan.has_value();
        if (plan) PS_RETURN_IF_ERROR(Issued(seq, s, *plan));
        break;
      }
      case kRelease:
        if (s.released) return absl::OkStatus();
        kv_.Release(seq);
        if (s.in_flight > 0) {
          ++counts_.cancels_in_flight;
          s.released = true;  // a cancel while its copies are in flight: freed when they complete
        } else {
          RefFree(seq);
        }
        break;
      case kComplete: {
        if (plans_.empty()) return absl::OkStatus();
        auto it = plans_.begin() + b % plans_.size();
        PS_RETURN_IF_ERROR(Complete(std::move(*it)));
        plans_.erase(it);
        break;
      }
      case kDrop: {  // block (b % kPerPage) of page (b / kPerPage) of one layer
        const int layer = a / kSeqs % kLayers;
        Layer& t = s.layers[layer];
        const int64_t n_pages = static_cast<int64_t>(t.tiers.size());
        if (n_pages == 0) return absl::OkStatus();
        const int32_t page = static_cast<int32_t>(b / kPerPage % n_pages);
        const int index = b % kPerPage;
        int64_t& uid = t.uids[page * kPerPage + index];
        const int64_t dropped = kv_.Drop(seq, layer, std::span<const int32_t>(&page, 1), index);
        if (dropped != (uid >= 0 ? 1 : 0)) return absl::InternalError(absl::StrCat(dropped, " blocks dropped"));
        if (uid >= 0) {
          Unref(std::exchange(uid, -1));
          ++counts_.drops;
        }
        break;
      }
      default: break;
    }
    counts_.refused += !want;
    if (fits != want) {
      return absl::InternalError(absl::StrCat("operation ", op % kOps, " on sequence ", seq, ": the owner says ",
                                              fits ? "it fits" : "no room", ", the reference the opposite"));
    }
    return Check();
  }

  // Completes every plan and releases every sequence: every block must be free.
  absl::Status Drain() {
    while (!plans_.empty()) {
      PS_RETURN_IF_ERROR(Complete(std::move(plans_.front())));
      plans_.pop_front();
    }
    for (auto& [seq, s] : seqs_) {
      if (s.released) return absl::InternalError(absl::StrCat("sequence ", seq, " released and never freed"));
      kv_.Release(seq);
      RefFree(seq);
    }
    PS_RETURN_IF_ERROR(Check());
    if (kv_.UsedBlocks(Tier::kDevice) != 0 || kv_.UsedBlocks(Tier::kHost) != 0 || device_.num_free() != kDeviceBlocks ||
        host_.num_free() != kHostBlocks) {
      return absl::InternalError("blocks still in use after every sequence let go");
    }
    return absl::OkStatus();
  }

 private:
  struct Layer {
    int tokens = 0;
    std::vector<Tier> tiers;    // per page
    std::vector<int64_t> uids;  // [pages, kPerPage]; -1: dropped
  };
  struct Seq {
    std::vector<Layer> layers = std::vector<Layer>(kLayers);
    bool exists = false;    // the owner has an entry (even an empty one)
    bool released = false;  // released with copies in flight
    int in_flight = 0;
  };
  struct Block {
    Tier tier = Tier::kDevice;
    int refs = 0;
  };
  struct Plan {
    int64_t seq = 0;
    SwapPlan plan;
    std::vector<int64_t> releases;  // the identities the plan holds
  };

  template <typename Fn>
  static void ForEntries(Seq& s, Fn&& fn) {
    for (Layer& t : s.layers) {
      for (size_t i = 0; i < t.uids.size(); ++i) {
        if (t.uids[i] >= 0) fn(t.tiers[i / kPerPage], t.uids[i]);
      }
    }
  }
  int64_t New(Tier tier) {
    blocks_[next_uid_] = {.tier = tier, .refs = 1};
    return next_uid_++;
  }
  void Unref(int64_t uid) {
    if (--blocks_[uid].refs == 0) blocks_.erase(uid);
  }
  int64_t Used(Tier tier) const {
    return std::ranges::count_if(blocks_, [&](const auto& b) { return b.second.tier == tier; });
  }
  int64_t Free(Tier tier) const { return (tier == Tier::kDevice ? kDeviceBlocks : kHostBlocks) - Used(tier); }

  // The reference's append of n tokens to one layer; false (nothing changed) when
  // the owner must refuse it. copied_: the blocks copied on write.
  bool RefAppend(Seq& s, int layer, int n) {
    Layer& t = s.layers[layer];
    const int64_t pages = static_cast<int64_t>(t.tiers.size()), capacity = pages * kBlockTokens;
    copied_ = 0;
    if (t.tokens < capacity && t.tiers.back() != Tier::kDevice) return false;
    const int64_t after = t.tokens + n;
    const int64_t more = after > capacity ? (after - capacity + kBlockTokens - 1) / kBlockTokens : 0;
    std::vector<int64_t*> shared;
    if (t.tokens < capacity) {
      for (int64_t i = (pages - 1) * kPerPage; i < pages * kPerPage; ++i) {
        if (t.uids[i] >= 0 && blocks_[t.uids[i]].refs > 1) shared.push_back(&t.uids[i]);
      }
    }
    if (more * kPerPage + static_cast<int64_t>(shared.size()) > Free(Tier::kDevice)) return false;
    for (int64_t* uid : shared) {
      Unref(*uid);
      *uid = New(Tier::kDevice);
    }
    copied_ = shared.size();
    counts_.copies_on_write += static_cast<int64_t>(copied_);
    for (int64_t i = 0; i < more; ++i) {
      t.tiers.push_back(Tier::kDevice);
      for (int k = 0; k < kPerPage; ++k) t.uids.push_back(New(Tier::kDevice));
    }
    t.tokens = static_cast<int>(after);
    return true;
  }
  // The reference's move of pages to `to`: each live block of theirs not there gets
  // a new identity, the old one held by the plan; false when the tier is short.
  bool RefMove(Seq& s, const std::vector<std::pair<int, int64_t>>& pages, Tier to) {
    pending_.clear();
    int64_t need = 0;
    for (auto [l, p] : pages) {
      const Layer& t = s.layers[l];
      if (t.tiers[p] == to) continue;
      for (int k = 0; k < kPerPage; ++k) need += t.uids[p * kPerPage + k] >= 0;
    }
    if (need > Free(to)) return false;
    for (auto [l, p] : pages) {
      Layer& t = s.layers[l];
      if (t.tiers[p] == to) continue;
      t.tiers[p] = to;
      for (int k = 0; k < kPerPage; ++k) {
        int64_t& uid = t.uids[p * kPerPage + k];
        if (uid < 0) continue;
        counts_.shared_moved += blocks_[uid].refs > 1;
        pending_.push_back(uid);
        uid = New(to);
      }
    }
    return true;
  }
  absl::Status Issued(int64_t seq, Seq& s, SwapPlan& plan) {
    if (plan.release_after.size() != pending_.size() || plan.copies.size() != pending_.size()) {
      return absl::InternalError(absl::StrCat("a plan of ", plan.copies.size(), " copies and ",
                                              plan.release_after.size(), " releases, ", pending_.size(), " expected"));
    }
    if (pending_.empty()) return absl::OkStatus();  // nothing in flight
    ++s.in_flight;
    plans_.push_back({.seq = seq, .plan = std::move(plan), .releases = pending_});
    return absl::OkStatus();
  }
  absl::Status Complete(Plan p) {
    kv_.Complete(p.plan);
    for (int64_t uid : p.releases) Unref(uid);
    Seq& s = seqs_[p.seq];
    if (--s.in_flight == 0 && s.released) RefFree(p.seq);
    return absl::OkStatus();
  }
  void RefFree(int64_t seq) {
    Seq& s = seqs_[seq];
    ForEntries(s, [&](Tier, int64_t uid) { Unref(uid); });
    s = Seq{};
  }

  absl::Status Check() {
    PS_RETURN_IF_ERROR(kv_.VerifyIntegrity());
    for (Tier tier : {Tier::kDevice, Tier::kHost}) {
      if (kv_.UsedBlocks(tier) != Used(tier)) {
        return absl::InternalError(absl::StrCat(kv_.UsedBlocks(tier), " ", std::string(TierName(tier)),
                                                " blocks used, ", Used(tier), " in the reference"));
      }
    }
    for (auto& [seq, s] : seqs_) {
      int64_t held[2] = {0, 0};
      ForEntries(s, [&](Tier tier, int64_t) { ++held[static_cast<int>(tier)]; });
      for (Tier tier : {Tier::kDevice, Tier::kHost}) {
        if (kv_.BlocksIn(seq, tier) != held[static_cast<int>(tier)]) {
          return absl::InternalError(absl::StrCat("sequence ", seq, " holds ", kv_.BlocksIn(seq, tier), " ",
                                                  std::string(TierName(tier)), " blocks, ",
                                                  held[static_cast<int>(tier)], " in the reference"));
        }
      }
      for (int l = 0; l < kLayers; ++l) {
        if (kv_.Table(seq, l).positions.size() != static_cast<size_t>(s.layers[l].tokens)) {
          return absl::InternalError(absl::StrCat("sequence ", seq, " layer ", l, ": token counts differ"));
        }
      }
      if (kv_.InFlight(seq) != s.in_flight) {
        return absl::InternalError(absl::StrCat("sequence ", seq, ": ", kv_.InFlight(seq), " plans in flight, ",
                                                s.in_flight, " in the reference"));
      }
    }
    return absl::OkStatus();
  }

  BlockPool device_, host_;
  KvCacheManager kv_;
  std::map<int64_t, Seq> seqs_;
  std::map<int64_t, Block> blocks_;  // live identities
  int64_t next_uid_ = 0;
  std::deque<Plan> plans_;
  std::vector<int64_t> pending_;  // the last RefMove's released identities
  size_t copied_ = 0;             // the last RefAppend's copies on write
  Counts counts_;
};

}  // namespace ps::testing
