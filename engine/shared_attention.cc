#include "engine/shared_attention.h"

#include <cmath>
#include <vector>

#include "base/status.h"

namespace ps {
namespace {

// The rows of one KV head of `kv`: block pointers offset to the head's columns (rows
// keep the cache's width), for a call with one KV head.
KvRows HeadView(const KvRows& kv, int head, int head_dim, std::vector<const void*>* k, std::vector<const void*>* v) {
  const int64_t n_blocks = kv.block_rows > 0 ? (kv.n + kv.block_rows - 1) / kv.block_rows : 0;
  const size_t offset = static_cast<size_t>(head) * head_dim * kv.elem_bytes();
  k->resize(n_blocks);
  v->resize(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    (*k)[b] = kv.k_blocks[b] != nullptr ? static_cast<const uint8_t*>(kv.k_blocks[b]) + offset : nullptr;
    (*v)[b] = kv.v_blocks[b] != nullptr ? static_cast<const uint8_t*>(kv.v_blocks[b]) + offset : nullptr;
  }
  KvRows out = kv;
  out.k_blocks = k->data();
  out.v_blocks = v->data();
  return out;
}

}  // namespace

float ProximalGate(float lse_p, float lse_d) { return 1.0f / (1.0f + std::exp(lse_d - lse_p)); }

void MergeByGate(int64_t n, int heads, int hd, float* o_p, int64_t p_stride, const float* o_d, int64_t d_stride,
                 const float* lse_p, const float* lse_d, int64_t lse_stride) {
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      const float g = ProximalGate(lse_p[i * lse_stride + h], lse_d[i * lse_stride + h]);
      float* p = o_p + i * p_stride + static_cast<int64_t>(h) * hd;
      const float* d = o_d + i * d_stride + static_cast<int64_t>(h) * hd;
      for (int c = 0; c < hd; ++c) p[c] = g * p[c] + (1.0f - g) * d[c];
    }
  }
}

absl::Status SharedAttention(Backend& backend, KvCache& kv, const SharedScores& share, const SharedAttentionArgs& a) {
  const AttentionShape& s = a.shape;
  const int group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
  PS_CHECK(static_cast<int>(share.base.size()) == s.n_kv_heads && share.base_q.size() == share.base.size())
      << "shared scores name " << share.base.size() << " KV heads";
  const AttentionShape head_shape{.n_heads = group, .n_kv_heads = 1, .head_dim = hd, .scale = s.scale};
  static thread_local std::vector<const void*> k_blocks, v_blocks;
  static thread_local std::vector<float> lse_p, lse_d, o_d;
  lse_p.resize(a.n_q * group);
  lse_d.resize(a.n_q * group);
  o_d.resize(a.n_q * group * hd);
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
    const KvRows head = HeadView(rows, h, hd, &k_blocks, &v_blocks);
    if (base == a.layer) {  // this head's own group starts here: ordinary attention
      backend.Attention(head_shape, head, own);
      continue;
    }
    own.lse = lse_p.data();
    own.lse_stride = group;
    own.window = {.part = PositionWindow::Part::kProximal, .sinks = share.sinks, .recent = share.recent};
    backend.Attention(head_shape, head, own);
    const bool one_row = a.n_q == 1 && share.distant_lse != nullptr;
    if (one_row && share.gate_skip > 0 && share.distant_lse_valid[h]) {
      bool skip = true;
      for (int g = 0; g < group && skip; ++g) {
        skip = ProximalGate(lse_p[g], share.distant_lse[h * group + g]) >= share.gate_skip;
      }
      if (skip) {
        if (share.distant_skipped != nullptr) ++*share.distant_skipped;
        continue;  // the proximal part alone
      }
    }
    PS_ASSIGN_OR_RETURN(const KvRows shared, kv.View(a.seq, a.layer, nullptr, base));
    const KvRows distant = HeadView(shared, h, hd, &k_blocks, &v_blocks);
    backend.Attention(
        head_shape, distant,
        AttentionArgs{
            .q = share.base_q[h] + col,
            .q_pos = a.q_pos,
            .n_q = a.n_q,
            .q_stride = share.q_stride,
            .out = o_d.data(),
            .out_stride = group * hd,
            .lse = lse_d.data(),
            .lse_stride = group,
            .window = {.part = PositionWindow::Part::kDistant, .sinks = share.sinks, .recent = share.recent}});
    if (one_row) {  // the same scores at every layer of the group: its later layers may skip
      std::copy(lse_d.begin(), lse_d.begin() + group, share.distant_lse + h * group);
      share.distant_lse_valid[h] = 1;
    }
    MergeByGate(a.n_q, group, hd, a.out + col, a.out_stride, o_d.data(), group * hd, lse_p.data(), lse_d.data(), group);
  }
  return absl::OkStatus();
}

}  // namespace ps
