#include "memory/kv_cache.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/fault.h"
#include "base/status.h"
#include "kernels/plugin.h"

namespace ps {
namespace {

absl::StatusOr<std::unique_ptr<BlockPool>> MakePool(Backend& backend, Tier tier, int64_t blocks, size_t block_bytes) {
  if (blocks < 0 || blocks > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(blocks, " blocks in the ", std::string(TierName(tier)), " tier"));
  }
  PS_ASSIGN_OR_RETURN(MemoryRegion memory, backend.AllocateTier(tier == Tier::kDevice, blocks * block_bytes));
  return std::make_unique<BlockPool>(tier, static_cast<int32_t>(blocks), block_bytes, std::move(memory));
}

absl::StatusOr<std::unique_ptr<SwapEngine>> MakeSwapEngine(Backend& backend, BlockPool& device, BlockPool& host,
                                                           const CpuSwapEngine::CopyFn& copy) {
  if (backend.kind() == DeviceKind::kCuda) {  // the CUDA plug-in's (memory/cuda_swap_engine.h)
    PS_ASSIGN_OR_RETURN(void* create, CudaPluginSymbol(kCudaCreateSwapEngine));
    char error[512] = "";
    std::unique_ptr<SwapEngine> e(reinterpret_cast<SwapEngine* (*)(BlockPool*, BlockPool*, char*, size_t)>(create)(
        &device, &host, error, sizeof(error)));
    if (e == nullptr) return absl::InternalError(error);
    return e;
  }
  return std::unique_ptr<SwapEngine>(new CpuSwapEngine(device, host, copy));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& o, Backend& backend) {
  const KvGeometry& g = o.geometry;
  PS_RETURN_IF_ERROR(g.Validate());
  if (!backend.StoresKv(g.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("the ", std::string(backend.name()), " backend keeps no ",
                                                   std::string(DTypeName(g.dtype)), " KV cache (F32, F16 or BF16",
                                                   g.dtype == DType::kQ8_0 ? "; Q8_0 on the CPU)" : ")"));
  }
  std::unique_ptr<KvCache> kv(new KvCache(g, backend));
  PS_ASSIGN_OR_RETURN(kv->device_, MakePool(backend, Tier::kDevice, o.device_blocks, g.block_bytes()));
  PS_ASSIGN_OR_RETURN(kv->host_, MakePool(backend, Tier::kHost, o.host_blocks, g.block_bytes()));
  kv->manager_ = std::make_unique<KvCacheManager>(*kv->device_, *kv->host_,
                                                  KvCacheManager::Options{.n_layers = g.n_layers,
                                                                          .block_tokens = g.block_tokens,
                                                                          .metered = o.metered,
                                                                          .host_row_bytes = o.host_row_bytes,
                                                                          .blocks_per_page = g.blocks_per_page(),
                                                                          .prefix_cache = o.prefix_cache});
  PS_ASSIGN_OR_RETURN(kv->swap_, MakeSwapEngine(backend, *kv->device_, *kv->host_, o.copy));
  return kv;
}

KvCache::~KvCache() { WaitAllMoves().IgnoreError(); }

absl::Status KvCache::Append(int64_t seq, int layer, std::span<const int32_t> positions, const float* k,
                             const float* v) {
  absl::Status status;
  AppendAll(layer, {{Rows{.seq = seq, .positions = positions}}}, k, v, {&status, 1});
  return status;
}

void KvCache::AppendAll(int layer, std::span<const Rows> rows, const float* k, const float* v,
                        std::span<absl::Status> status) {
  PS_CHECK(status.size() == rows.size()) << "statuses not sized by the caller";
  const size_t bt = geometry_.block_tokens, rb = geometry_.head_row_bytes();
  const int heads = geometry_.n_kv_heads, per_page = geometry_.blocks_per_page();
  const int64_t head_dim = geometry_.head_dim();
  // The rows gathered so far: from row `first` on, the pointers of each row's heads.
  int64_t first = 0, end = 0;
  k_rows_.clear();
  v_rows_.clear();
  auto store = [&] {
    if (k_rows_.empty()) return;
    const int64_t offset = first * heads * head_dim;
    backend_.StoreKv(geometry_.dtype, head_dim, static_cast<int64_t>(k_rows_.size()), k + offset, v + offset,
                     k_rows_.data(), v_rows_.data());
    k_rows_.clear();
    v_rows_.clear();
  };
  for (size_t s = 0; s < rows.size(); ++s) {
    const auto [seq, positions, row] = rows[s];
    if (fault::Hit(fault::Point::kKvAppend)) {
      status[s] = absl::ResourceExhaustedError(
          absl::StrCat("sequence ", seq, " layer ", layer, ": injected fault: a KV block allocation failed"));
      continue;
    }
    const size_t slot0 = manager_->Table(seq, layer).positions.size();
    cow_.clear();
    if (!manager_->Append(seq, layer, positions, &cow_)) {
      const LayerTable& t = manager_->Table(seq, layer);
      if (!t.tiers.empty() && t.positions.size() % bt != 0 && t.tiers.back() != Tier::kDevice) {
        status[s] = absl::FailedPreconditionError(
            absl::StrCat("sequence ", seq, " layer ", layer, ": its last, partly filled page is in the host tier"));
      } else {
        status[s] = absl::ResourceExhaustedError(absl::StrCat(
            "sequence ", seq, ": not enough reserved KV blocks for ", positions.size(), " tokens at layer ", layer,
            " (", manager_->Reserved(KvCacheManager::ScratchOwner(seq)), " left)"));
      }
      continue;
    }
    if (!cow_.empty()) {  // a shared last page: this sequence's rows go into a copy of its own, made now
      const absl::Status copied = swap_->Wait(swap_->Submit(cow_));
      if (!copied.ok()) {
        status[s] = absl::InternalError(absl::StrCat("sequence ", seq, " layer ", layer,
                                                     ": the copy of a shared KV page failed: ", copied.message()));
        continue;
      }
    }
    status[s] = absl::OkStatus();
    if (row != end) store();
    if (k_rows_.empty()) first = row;
    end = row + static_cast<int64_t>(positions.size());
    // Row i's head h goes to its page's K (V) block of head h: the input is n * heads
    // rows of head_dim values.
    const LayerTable& t = manager_->Table(seq, layer);
    for (size_t i = 0; i < positions.size(); ++i) {
      const size_t slot = slot0 + i;
      const int32_t* ids = t.blocks.data() + slot / bt * per_page;
      for (int h = 0; h < heads; ++h) {
        PS_CHECK(ids[h] != LayerTable::kDropped) << "append to a page whose keys were dropped";
        k_rows_.push_back(device_->data(ids[h]) + (slot % bt) * rb);
        v_rows_.push_back(device_->data(ids[heads + h]) + (slot % bt) * rb);
      }
    }
  }
  store();
}

absl::StatusOr<KvRows> KvCache::View(int64_t seq, int layer, const KvSelection* selection, int key_layer,
                                     BlockTable* table) {
  if (table == nullptr) table = &table_;
  // The rule of the cache: a read waits for the copies of the blocks it reads.
  PS_RETURN_IF_ERROR(WaitMoves(seq, layer));
  if (key_layer >= 0 && key_layer != layer) PS_RETURN_IF_ERROR(WaitMoves(seq, key_layer));
  const LayerTable& t = manager_->Table(seq, layer);
  const LayerTable& tk = key_layer >= 0 ? manager_->Table(seq, key_layer) : t;
  if (tk.positions != t.positions) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": layers ", key_layer, " and ", layer,
                                                      " hold different rows; their keys and values cannot pair"));
  }
  // Pointers head-major: head h's block of page p at h * pages + p.
  const int64_t pages = t.pages(), bt = geometry_.block_tokens;
  const int heads = geometry_.n_kv_heads, per_page = geometry_.blocks_per_page();
  std::vector<const void*>& k_blocks = table->k;
  std::vector<const void*>& v_blocks = table->v;
  k_blocks.assign(pages * heads, nullptr);
  v_blocks.assign(pages * heads, nullptr);
  for (int64_t p = 0; p < pages; ++p) {
    if (tk.tiers[p] != Tier::kDevice || t.tiers[p] != Tier::kDevice) continue;
    for (int h = 0; h < heads; ++h) {
      const int32_t k = tk.blocks[p * per_page + h], v = t.blocks[p * per_page + heads + h];
      if (k != LayerTable::kDropped) k_blocks[h * pages + p] = device_->data(k);
      v_blocks[h * pages + p] = device_->data(v);
    }
  }
  auto check = [&](int64_t begin, int64_t end) -> absl::Status {
    for (int64_t p = begin / bt; p * bt < end; ++p) {
      if (tk.tiers[p] != Tier::kDevice || t.tiers[p] != Tier::kDevice) {
        return absl::FailedPreconditionError(absl::StrCat("attention of sequence ", seq, " at layer ", layer,
                                                          " reads KV page ", p, ", which is in the host tier"));
      }
    }
    return absl::OkStatus();
  };
  if (selection == nullptr || selection->all()) {
    PS_RETURN_IF_ERROR(check(0, static_cast<int64_t>(t.positions.size())));
  } else {
    for (const KvSelection::Segment& s : selection->segments) {
      for (const KvRange& r : s.ranges) PS_RETURN_IF_ERROR(check(r.begin, r.end));
    }
  }
  return KvRows{.k_blocks = k_blocks.data(),
                .v_blocks = v_blocks.data(),
                .block_rows = bt,
                .positions = t.positions.data(),
                .n = static_cast<int64_t>(t.positions.size()),
                .stride = geometry_.head_dim(),
                .positions_ascending = t.ascending,
                .dtype = geometry_.dtype,
                .head_cols = geometry_.head_dim(),
                .head_blocks = pages};
}

absl::Status KvCache::DropKeys(int64_t seq, int layer, int kv_head, std::span<const int32_t> pages) {
  PS_CHECK(kv_head >= 0 && kv_head < geometry_.n_kv_heads) << "KV head " << kv_head;
  PS_RETURN_IF_ERROR(WaitMoves(seq, layer));  // a copy may still read or write them
  manager_->Drop(seq, layer, pages, kv_head);
  return absl::OkStatus();
}

absl::Status KvCache::DropHead(int64_t seq, int layer, int kv_head, std::span<const int32_t> pages) {
  PS_RETURN_IF_ERROR(DropKeys(seq, layer, kv_head, pages));
  manager_->Drop(seq, layer, pages, geometry_.n_kv_heads + kv_head);  // the V blocks follow the K blocks
  return absl::OkStatus();
}

void KvCache::Free(int64_t seq) {
  WaitMoves(seq, -1).IgnoreError();  // the blocks may be read or written by a copy until then
  manager_->Free(seq);
}

void KvCache::Fork(int64_t parent, int64_t child) {
  WaitMoves(parent, -1).IgnoreError();  // shared blocks are never a copy's destination
  manager_->Fork(parent, child);
}

void KvCache::FreeLayer(int64_t seq, int layer) {
  WaitMoves(seq, layer).IgnoreError();  // as in Free: the blocks go whatever the copies did
  manager_->FreeLayer(seq, layer);
}

absl::Status KvCache::Finish(SwapTicket ticket, const SwapPlan& plan) {
  absl::Status st = swap_->Wait(ticket);
  manager_->Complete(plan);  // the source blocks: read by the copy until now
  if (st.ok() && fault::Hit(fault::Point::kSwapCopy)) st = absl::DataLossError("injected fault: a swap copy failed");
  if (!st.ok() && st.code() != absl::StatusCode::kDataLoss) st = absl::DataLossError(st.message());
  return st;
}

absl::Status KvCache::Move(int64_t seq, int layer, std::span<const int32_t> pages, Tier to) {
  // A page moves again only once its earlier copy has landed.
  const bool busy = std::ranges::any_of(moves_, [&](const PendingMove& m) {
    return m.seq == seq && m.layer == layer &&
           std::ranges::any_of(pages, [&](int32_t p) { return std::ranges::find(m.pages, p) != m.pages.end(); });
  });
  if (busy) PS_RETURN_IF_ERROR(WaitMoves(seq, layer));
  std::optional<SwapPlan> plan = manager_->PlanMove(seq, layer, pages, to);
  if (!plan && to == Tier::kDevice) {
    // Device blocks given back by this sequence's moves in flight are credited to
    // its reservation once they complete.
    PS_RETURN_IF_ERROR(WaitMoves(seq, -1));
    plan = manager_->PlanMove(seq, layer, pages, to);
  }
  if (!plan) {
    return absl::ResourceExhaustedError(absl::StrCat("sequence ", seq, " layer ", layer, ": no room to move ",
                                                     pages.size(), " pages to the ", std::string(TierName(to)),
                                                     " tier"));
  }
  // A plan of releases only (pages with clean host copies) goes through the queue
  // too: its device blocks are released once earlier work on them is fenced.
  if (plan->copies.empty() && plan->release_after.empty()) return absl::OkStatus();
  const SwapTicket ticket = swap_->Submit(plan->copies);
  moves_.push_back(
      {.seq = seq, .layer = layer, .pages = {pages.begin(), pages.end()}, .ticket = ticket, .plan = std::move(*plan)});
  return absl::OkStatus();
}

template <typename Pick>
absl::Status KvCache::WaitWhere(Pick&& pick) {
  if (std::ranges::none_of(moves_, pick)) return absl::OkStatus();
  absl::Status first;
  const auto start = std::chrono::steady_clock::now();
  // In submission order: a later move may read the blocks an earlier one wrote.
  for (PendingMove& m : moves_) {
    if (pick(m)) first.Update(Finish(m.ticket, m.plan));
  }
  std::erase_if(moves_, pick);
  move_wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return first;
}

absl::Status KvCache::WaitMoves(int64_t seq, int layer) {
  return WaitWhere([&](const PendingMove& m) { return m.seq == seq && (layer < 0 || m.layer == layer); });
}

absl::Status KvCache::WaitAllMoves() {
  return WaitWhere([](const PendingMove&) { return true; });
}

}  // namespace ps
