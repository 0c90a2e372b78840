#include "engine/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

void Grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
}

constexpr int kMaxRopeDims = 1024;  // ValidateConfig bounds head_dim by this

}  // namespace

void Transformer::EnsureCapacity(int64_t rows) {
  if (rows <= capacity_) return;
  const ModelConfig& c = model_.config();
  Grow(x_, rows * c.n_embd);
  Grow(xn_, rows * c.n_embd);
  Grow(q_, rows * c.q_dim());
  Grow(k_, rows * c.kv_dim());
  Grow(v_, rows * c.kv_dim());
  Grow(att_, rows * c.q_dim());
  Grow(tmp_, rows * c.n_embd);
  Grow(gate_, rows * c.n_ff);
  Grow(up_, rows * c.n_ff);
  capacity_ = rows;
}

absl::Status Transformer::Forward(std::span<const SeqInput> batch, KvStore& kv, ForwardOutput* out) {
  const ModelConfig& c = model_.config();
  const int d = c.n_embd;
  int64_t n_rows = 0;
  for (const SeqInput& s : batch) {
    if (s.tokens.empty() || s.tokens.size() != s.positions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, ": tokens and positions must be non-empty and of equal length"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.n_vocab) return absl::InvalidArgumentError(absl::StrCat("token id ", t, " out of range"));
    }
    for (int32_t p : s.positions) {
      if (p < 0) return absl::InvalidArgumentError(absl::StrCat("negative position ", p));
    }
    n_rows += static_cast<int64_t>(s.tokens.size());
  }
  EnsureCapacity(n_rows);
  tokens_.clear();
  positions_.clear();
  std::vector<Segment>& seg = segments_;
  seg.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    seg[i].offset = static_cast<int64_t>(tokens_.size());
    seg[i].rows.resize(batch[i].tokens.size());
    for (size_t r = 0; r < batch[i].tokens.size(); ++r) seg[i].rows[r] = static_cast<int32_t>(r);
    tokens_.insert(tokens_.end(), batch[i].tokens.begin(), batch[i].tokens.end());
    positions_.insert(positions_.end(), batch[i].positions.begin(), batch[i].positions.end());
  }
  out->rows_computed.assign(batch.size(), 0);

  // Embedding lookup.
  pool_.ParallelFor(n_rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      DequantizeRow(model_.tok_embd.type, model_.tok_embd.Row(tokens_[r]), x_.data() + r * d, d);
    }
  });

  const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                             .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  const int qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<float>& probs = probs_;
  std::vector<int32_t>& new_positions = new_positions_;

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    // Pruning hook: strategies may drop rows before this layer; compact in place.
    if (l > 0) {
      int64_t dst = 0;
      new_positions.clear();
      for (size_t i = 0; i < batch.size(); ++i) {
        std::vector<int32_t>& rows = kept_rows_;
        rows = seg[i].rows;
        if (batch[i].strategy != nullptr) batch[i].strategy->RowsForLayer(l, &rows);
        PS_CHECK(!rows.empty() && rows.back() == seg[i].rows.back()) << "a strategy dropped the last row";
        size_t k = 0;
        for (int32_t r : rows) {
          while (k < seg[i].rows.size() && seg[i].rows[k] != r) ++k;
          PS_CHECK(k < seg[i].rows.size()) << "a strategy added or reordered rows";
          const int64_t src = seg[i].offset + static_cast<int64_t>(k);
          if (src != dst) std::memmove(x_.data() + dst * d, x_.data() + src * d, d * sizeof(float));
          new_positions.push_back(positions_[src]);
          ++dst;
        }
        seg[i].offset = dst - static_cast<int64_t>(rows.size());
        seg[i].rows.swap(rows);
      }
      positions_.swap(new_positions);
      n_rows = dst;
    }
    for (size_t i = 0; i < batch.size(); ++i) out->rows_computed[i] += static_cast<int64_t>(seg[i].rows.size());

    pool_.ParallelFor(n_rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) RmsNorm(x_.data() + r * d, w.attn_norm.data(), xn_.data() + r * d, d, c.rms_eps);
    });
    MatMul(w.wq, xn_.data(), n_rows, q_.data(), pool_, matmul_);
    MatMul(w.wk, xn_.data(), n_rows, k_.data(), pool_, matmul_);
    MatMul(w.wv, xn_.data(), n_rows, v_.data(), pool_, matmul_);
    pool_.ParallelFor(n_rows, 4, [&](int64_t r0, int64_t r1) {
      float cs[kMaxRopeDims];
      for (int64_t r = r0; r < r1; ++r) {
        if (!w.bq.empty()) {
          AddInPlace(w.bq.data(), q_.data() + r * qd, qd);
          AddInPlace(w.bk.data(), k_.data() + r * kvd, kvd);
          AddInPlace(w.bv.data(), v_.data() + r * kvd, kvd);
        }
        RopeCache(c.rope, positions_[r], cs);
        RopeApply(c.rope, cs, q_.data() + r * qd, c.n_heads, c.head_dim);
        RopeApply(c.rope, cs, k_.data() + r * kvd, c.n_kv_heads, c.head_dim);
      }
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      const Segment& s = seg[i];
      const int64_t n = static_cast<int64_t>(s.rows.size());
      std::span<const int32_t> pos(positions_.data() + s.offset, n);
      PS_RETURN_IF_ERROR(kv.Append(batch[i].seq_id, l, pos, k_.data() + s.offset * kvd, v_.data() + s.offset * kvd));
      const KvRows rows = kv.View(batch[i].seq_id, l);
      PruningStrategy* strat = batch[i].strategy;
      const bool want_probs = strat != nullptr && strat->WantsLastQueryProbs(l);
      if (want_probs) probs.assign(rows.n, 0.0f);
      Attention(shape, rows,
                AttentionArgs{.q = q_.data() + s.offset * qd, .q_pos = pos.data(), .n_q = n, .q_stride = qd,
                              .out = att_.data() + s.offset * qd, .out_stride = qd,
                              .last_query_probs = want_probs ? probs.data() : nullptr},
                pool_);
      if (want_probs) strat->AfterAttention(l, probs, std::span<const int32_t>(rows.positions, rows.n));
    }
    MatMul(w.wo, att_.data(), n_rows, tmp_.data(), pool_, matmul_);
    pool_.ParallelFor(n_rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        AddInPlace(tmp_.data() + r * d, x_.data() + r * d, d);
        RmsNorm(x_.data() + r * d, w.ffn_norm.data(), xn_.data() + r * d, d, c.rms_eps);
      }
    });
    MatMul(w.w_gate, xn_.data(), n_rows, gate_.data(), pool_, matmul_);
    MatMul(w.w_up, xn_.data(), n_rows, up_.data(), pool_, matmul_);
    pool_.ParallelFor(n_rows, 4, [&](int64_t r0, int64_t r1) {
      SiluMul(gate_.data() + r0 * c.n_ff, up_.data() + r0 * c.n_ff, (r1 - r0) * c.n_ff);
    });
    MatMul(w.w_down, gate_.data(), n_rows, tmp_.data(), pool_, matmul_);
    pool_.ParallelFor(n_rows, 8, [&](int64_t r0, int64_t r1) {
      AddInPlace(tmp_.data() + r0 * d, x_.data() + r0 * d, (r1 - r0) * d);
    });
  }

  // Final norm and output projection, only for the rows that need logits.
  out->row_offset.assign(batch.size(), 0);
  out->row_count.assign(batch.size(), 0);
  int64_t n_out = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t count = batch[i].no_logits ? 0 : (batch[i].all_logits ? static_cast<int64_t>(seg[i].rows.size()) : 1);
    out->row_offset[i] = n_out;
    out->row_count[i] = count;
    const int64_t first = seg[i].offset + static_cast<int64_t>(seg[i].rows.size()) - count;
    for (int64_t r = 0; r < count; ++r) {
      RmsNorm(x_.data() + (first + r) * d, model_.output_norm.data(), xn_.data() + (n_out + r) * d, d, c.rms_eps);
    }
    n_out += count;
  }
  out->logits.resize(static_cast<size_t>(n_out) * c.n_vocab);
  if (n_out > 0) MatMul(model_.output, xn_.data(), n_out, out->logits.data(), pool_, matmul_);
  return absl::OkStatus();
}

}  // namespace ps
