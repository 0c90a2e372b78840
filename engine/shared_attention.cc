#include "engine/shared_attention.h"

#include <vector>

#include "base/status.h"
#include "kernels/cpu/vec.h"
#include "kernels/shared_math.h"

namespace ps {
namespace {

// The rows of one KV head of a view of the cache (whose heads have blocks of their
// own), for a call with one KV head.
KvRows HeadView(const KvRows& kv, int head) {
  PS_CHECK(kv.head_cols > 0) << "a KV view whose heads share blocks";
  KvRows out = kv;
  out.k_blocks += head * kv.head_blocks;
  out.v_blocks += head * kv.head_blocks;
  return out;
}

// Frees the keys of `layer` that no query to come reads: for each KV head that scores
// its distant keys with another layer's, the full pages whose positions are all
// distant to a query after the newest cached position.
absl::Status DropDistantKeys(KvCache& kv, const SharedScores& share, int64_t seq, int layer,
                             std::vector<int32_t>* pages) {
  const LayerTable& t = kv.manager().Table(seq, layer);
  if (!share.drop_distant_keys || !t.ascending || t.positions.empty()) return absl::OkStatus();
  const int64_t bt = kv.manager().block_tokens(), per_page = kv.manager().blocks_per_page();
  const int64_t distant_to = static_cast<int64_t>(t.positions.back()) + 1 - share.recent;
  for (int h = 0; h < static_cast<int>(share.base.size()); ++h) {
    if (share.base[h] == layer) continue;
    pages->clear();
    for (int64_t p = 0; p + 1 < t.pages(); ++p) {  // the last page takes the rows to come
      if (t.positions[(p + 1) * bt - 1] > distant_to) break;
      if (t.positions[p * bt] >= share.sinks && t.blocks[p * per_page + h] != LayerTable::kDropped) {
        pages->push_back(static_cast<int32_t>(p));
      }
    }
    if (!pages->empty()) PS_RETURN_IF_ERROR(kv.DropKeys(seq, layer, h, *pages));
  }
  return absl::OkStatus();
}

// Takes scale x q . shift (per query row and head of the group) off a part's
// log-sum-exps `lse` ([n_q][group], activation memory) over keys stored with `shift` (the
// KV head's, null: none); q: the group's queries, q_stride apart (activation memory, or
// host memory when q_on_host).
void Unshift(Backend& backend, const float* q, bool q_on_host, int64_t n_q, int64_t q_stride, int group, int hd,
             float scale, const float* shift, float* lse, SharedAttentionScratch& scratch) {
  if (shift == nullptr) return;
  const int64_t n = n_q * group;
  const float* qh = q_on_host ? q : HostView(backend, q, (n_q - 1) * q_stride + group * hd, scratch.host_q);
  // Where the backend is not host-addressable, HostView's copy is scratch.host itself.
  float* l = backend.host_addressable() ? lse : (HostView(backend, lse, n, scratch.host), scratch.host.data());
  std::vector<float> dots(group);
  for (int64_t i = 0; i < n_q; ++i) {
    DotRows(shift, qh + i * q_stride, hd, group, hd, dots.data());  // the group's heads, hd apart
    for (int g = 0; g < group; ++g) l[i * group + g] -= scale * dots[g];
  }
  if (!backend.host_addressable()) backend.CopyFromHost(l, lse, static_cast<size_t>(n) * sizeof(float));
}

// Layer `layer`'s KV head h's key shift, or null.
const float* KeyShift(std::span<const LayerWeights> layers, int layer, int h, int hd) {
  if (layers.empty() || layers[layer].bk_shift.empty()) return nullptr;
  return layers[layer].bk_shift.data() + static_cast<int64_t>(h) * hd;
}

}  // namespace

absl::Status SharedAttention(Backend& backend, KvCache& kv, const SharedScores& share, const SharedAttentionArgs& a,
                             SharedAttentionScratch& scratch) {
  const AttentionShape& s = a.shape;
  const int group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
  PS_CHECK(static_cast<int>(share.base.size()) == s.n_kv_heads && share.base_q.size() == share.base.size())
      << "shared scores name " << share.base.size() << " KV heads";
  const AttentionShape head_shape{.n_heads = group, .n_kv_heads = 1, .head_dim = hd, .scale = s.scale};
  PS_RETURN_IF_ERROR(scratch.lse_p.Reserve(backend, a.n_q * group));
  PS_RETURN_IF_ERROR(scratch.lse_d.Reserve(backend, a.n_q * group));
  PS_RETURN_IF_ERROR(scratch.o_d.Reserve(backend, a.n_q * group * hd));
  float* const lse_p = scratch.lse_p.data();
  float* const lse_d = scratch.lse_d.data();
  const float* staged = nullptr;  // the host queries now in scratch.base_q
  for (int h = 0; h < s.n_kv_heads; ++h) {
    const int base = share.base[h];
    const int64_t col = static_cast<int64_t>(h) * group * hd;
    AttentionArgs own{.q = a.q + col,
                      .q_pos = a.q_pos,
                      .n_q = a.n_q,
                      .q_stride = a.q_stride,
                      .out = a.out + col,
                      .out_stride = a.out_stride};
    PS_ASSIGN_OR_RETURN(const KvRows rows, kv.View(a.seq, a.layer, nullptr));
    const KvRows head = HeadView(rows, h);
    if (base == a.layer) {  // this head's own group starts here: ordinary attention
      backend.Attention(head_shape, head, own);
      continue;
    }
    own.lse = lse_p;
    own.lse_stride = group;
    own.window = {.part = PositionWindow::Part::kProximal, .sinks = share.sinks, .recent = share.recent};
    backend.Attention(head_shape, head, own);
    Unshift(backend, own.q, false, a.n_q, a.q_stride, group, hd, s.scale, KeyShift(a.layers, a.layer, h, hd), lse_p,
            scratch);
    const bool one_row = a.n_q == 1 && share.distant_lse != nullptr;
    if (one_row && share.gate_skip > 0 && share.distant_lse_valid[h]) {
      const float* gate_lse = HostView(backend, lse_p, group, scratch.host);
      bool skip = true;
      for (int g = 0; g < group && skip; ++g) {
        skip = ProximalGate(gate_lse[g], share.distant_lse[h * group + g]) >= share.gate_skip;
      }
      if (skip) {
        if (share.distant_skipped != nullptr) ++*share.distant_skipped;
        continue;  // the proximal part alone
      }
    }
    const float* base_q = share.base_q[h];
    const float* const base_q_host = base_q + col;
    if (!backend.host_addressable()) {  // the strategy's host copy, staged for the kernel
      if (base_q != staged) {
        const int64_t n = (a.n_q - 1) * share.q_stride + s.n_heads * hd;
        PS_RETURN_IF_ERROR(scratch.base_q.Reserve(backend, n));
        backend.CopyFromHost(base_q, scratch.base_q.data(), static_cast<size_t>(n) * sizeof(float));
        staged = base_q;
      }
      base_q = scratch.base_q.data();
    }
    PS_ASSIGN_OR_RETURN(const KvRows shared, kv.View(a.seq, a.layer, nullptr, base));
    const KvRows distant = HeadView(shared, h);
    backend.Attention(
        head_shape, distant,
        AttentionArgs{
            .q = base_q + col,
            .q_pos = a.q_pos,
            .n_q = a.n_q,
            .q_stride = share.q_stride,
            .out = scratch.o_d.data(),
            .out_stride = group * hd,
            .lse = lse_d,
            .lse_stride = group,
            .window = {.part = PositionWindow::Part::kDistant, .sinks = share.sinks, .recent = share.recent}});
    Unshift(backend, base_q_host, true, a.n_q, share.q_stride, group, hd, s.scale, KeyShift(a.layers, base, h, hd),
            lse_d, scratch);
    if (one_row) {  // the same scores at every layer of the group: its later layers may skip
      backend.CopyToHost(lse_d, share.distant_lse + h * group, group * sizeof(float));
      share.distant_lse_valid[h] = 1;
    }
    backend.MergeByGate(a.n_q, group, hd, a.out + col, a.out_stride, scratch.o_d.data(), group * hd, lse_p, lse_d,
                        group);
  }
  return DropDistantKeys(kv, share, a.seq, a.layer, &scratch.pages);
}

}  // namespace ps
