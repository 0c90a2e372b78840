#include "engine/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

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

// RunPrefix for one sequence's BeginStep: a pass over scratch KV under the
// sequence's id complemented (ids of real sequences are >= 0).
class Transformer::PrefixContext final : public StrategyContext {
 public:
  PrefixContext(Transformer& t, KvStore& kv, const SeqInput& seq) : t_(t), kv_(kv), seq_(seq) {}
  absl::Status RunPrefix(std::span<const int32_t> tokens, std::span<const int32_t> positions, int last_layer) override {
    if (last_layer < 0 || last_layer >= t_.model_.config().n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("prefix pass to layer ", last_layer, " of a ",
                                                     t_.model_.config().n_layers, "-layer model"));
    }
    StepRows rows{.tokens = {tokens.begin(), tokens.end()}, .positions = {positions.begin(), positions.end()},
                  .origin = std::vector<int32_t>(tokens.size())};
    std::iota(rows.origin.begin(), rows.origin.end(), 0);
    const StepRows* rows_ptr = &rows;
    const SeqInput in{.seq_id = ~seq_.seq_id, .no_logits = true, .strategy = seq_.strategy};
    ForwardOutput out;
    const absl::Status st = t_.Run(std::span<const SeqInput>(&in, 1), std::span<const StepRows* const>(&rows_ptr, 1),
                                   last_layer, kv_, &out);
    kv_.Release(in.seq_id);
    if (st.ok()) rows_computed_ += out.rows_computed[0];
    return st;
  }
  int64_t rows_computed() const { return rows_computed_; }

 private:
  Transformer& t_;
  KvStore& kv_;
  const SeqInput& seq_;
  int64_t rows_computed_ = 0;
};

absl::Status Transformer::Forward(std::span<const SeqInput> batch, KvStore& kv, ForwardOutput* out) {
  // Strategies see (and may rewrite) their rows first: prefix passes reuse the
  // activation buffers, so they run before this step fills them.
  step_rows_.resize(batch.size());
  std::vector<const StepRows*> rows(batch.size());
  std::vector<int64_t> prefix_rows(batch.size(), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqInput& s = batch[i];
    if (s.seq_id < 0) return absl::InvalidArgumentError(absl::StrCat("negative sequence id ", s.seq_id));
    StepRows& r = step_rows_[i];
    r.tokens.assign(s.tokens.begin(), s.tokens.end());
    r.positions.assign(s.positions.begin(), s.positions.end());
    r.origin.resize(s.tokens.size());
    std::iota(r.origin.begin(), r.origin.end(), 0);
    if (s.strategy != nullptr) {
      PrefixContext ctx(*this, kv, s);
      PS_RETURN_IF_ERROR(s.strategy->BeginStep(&r, ctx));
      if (r.origin.size() != r.tokens.size()) {
        return absl::InternalError(absl::StrCat("strategy ", std::string(s.strategy->name()), " left rows without origins"));
      }
      prefix_rows[i] = ctx.rows_computed();
    }
    rows[i] = &r;
  }
  PS_RETURN_IF_ERROR(Run(batch, rows, -1, kv, out));
  for (size_t i = 0; i < batch.size(); ++i) out->rows_computed[i] += prefix_rows[i];
  return absl::OkStatus();
}

void Transformer::EditRows(int layer, std::span<const SeqInput> batch) {
  const int d = model_.config().n_embd;
  std::vector<Segment>& seg = segments_;
  edits_.resize(batch.size());
  bool changed = false;
  int64_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    RowEdit& e = edits_[i];
    e.keep.assign(seg[i].n, 1);
    e.add_positions.clear();
    e.add_hidden.clear();
    if (batch[i].strategy != nullptr) {
      LayerRows lr{.positions = std::span<const int32_t>(positions_.data() + seg[i].offset, seg[i].n),
                   .hidden = x_.data() + seg[i].offset * d,
                   .n_embd = d,
                   .keep = &e.keep,
                   .add_positions = &e.add_positions,
                   .add_hidden = &e.add_hidden};
      batch[i].strategy->RowsForLayer(layer, lr);
      PS_CHECK(e.keep.size() == static_cast<size_t>(seg[i].n) && e.keep.back())
          << "strategy " << batch[i].strategy->name() << " pruned the newest row or resized keep";
      PS_CHECK(e.add_hidden.size() == e.add_positions.size() * d) << "added rows without hidden states";
      changed = changed || !e.add_positions.empty() || std::find(e.keep.begin(), e.keep.end(), 0) != e.keep.end();
    }
    total += static_cast<int64_t>(e.add_positions.size() + std::count(e.keep.begin(), e.keep.end(), 1));
  }
  if (!changed) return;
  EnsureCapacity(total);
  // Rebuild into tmp_ (free between layers): per sequence, added rows then kept rows.
  new_positions_.clear();
  new_origins_.clear();
  int64_t dst = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const RowEdit& e = edits_[i];
    const int64_t start = dst;
    const int64_t n_add = static_cast<int64_t>(e.add_positions.size());
    if (n_add > 0) std::memcpy(tmp_.data() + dst * d, e.add_hidden.data(), n_add * d * sizeof(float));
    dst += n_add;
    new_positions_.insert(new_positions_.end(), e.add_positions.begin(), e.add_positions.end());
    new_origins_.insert(new_origins_.end(), e.add_positions.size(), -1);
    for (int64_t r = 0; r < seg[i].n; ++r) {
      if (!e.keep[r]) continue;
      const int64_t src = seg[i].offset + r;
      std::memcpy(tmp_.data() + dst * d, x_.data() + src * d, d * sizeof(float));
      new_positions_.push_back(positions_[src]);
      new_origins_.push_back(origins_[src]);
      ++dst;
    }
    seg[i] = Segment{.offset = start, .n = dst - start};
  }
  x_.swap(tmp_);
  positions_.swap(new_positions_);
  origins_.swap(new_origins_);
  n_rows_ = dst;
}

absl::Status Transformer::Run(std::span<const SeqInput> batch, std::span<const StepRows* const> step_rows,
                              int last_layer, KvStore& kv, ForwardOutput* out) {
  const ModelConfig& c = model_.config();
  const int d = c.n_embd;
  const bool prefix = last_layer >= 0;
  const int n_layers = prefix ? last_layer + 1 : c.n_layers;
  int64_t n_rows = 0;
  bool any_strategy = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepRows& s = *step_rows[i];
    if (s.tokens.empty() || s.tokens.size() != s.positions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", batch[i].seq_id, ": tokens and positions must be non-empty and of equal length"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= c.n_vocab) return absl::InvalidArgumentError(absl::StrCat("token id ", t, " out of range"));
    }
    for (int32_t p : s.positions) {
      if (p < 0) return absl::InvalidArgumentError(absl::StrCat("negative position ", p));
    }
    n_rows += static_cast<int64_t>(s.tokens.size());
    any_strategy = any_strategy || batch[i].strategy != nullptr;
  }
  EnsureCapacity(n_rows);
  tokens_.clear();
  positions_.clear();
  origins_.clear();
  std::vector<Segment>& seg = segments_;
  seg.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepRows& s = *step_rows[i];
    seg[i] = Segment{.offset = static_cast<int64_t>(tokens_.size()), .n = static_cast<int64_t>(s.tokens.size())};
    tokens_.insert(tokens_.end(), s.tokens.begin(), s.tokens.end());
    positions_.insert(positions_.end(), s.positions.begin(), s.positions.end());
    origins_.insert(origins_.end(), s.origin.begin(), s.origin.end());
  }
  n_rows_ = n_rows;
  out->rows_computed.assign(batch.size(), 0);
  out->layer_rows.assign(batch.size() * c.n_layers, 0);
  // Embedding lookup.
  pool_.ParallelFor(n_rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      DequantizeRow(model_.tok_embd.type, model_.tok_embd.Row(tokens_[r]), x_.data() + r * d, d);
    }
  });

  const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim,
                             .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  const int qd = c.q_dim(), kvd = c.kv_dim();
  for (int l = 0; l < n_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    if (l > 0 && any_strategy) EditRows(l, batch);  // pruning hook: rows leave, revived rows come back
    n_rows = n_rows_;
    for (size_t i = 0; i < batch.size(); ++i) {
      out->rows_computed[i] += seg[i].n;
      out->layer_rows[i * c.n_layers + l] = static_cast<int32_t>(seg[i].n);
    }

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
    const bool stop = prefix && l == last_layer;  // a prefix pass ends with the last row's attention here
    for (size_t i = 0; i < batch.size(); ++i) {
      const Segment& s = seg[i];
      std::span<const int32_t> pos(positions_.data() + s.offset, s.n);
      PS_RETURN_IF_ERROR(kv.Append(batch[i].seq_id, l, pos, k_.data() + s.offset * kvd, v_.data() + s.offset * kvd));
      const KvRows rows = kv.View(batch[i].seq_id, l);
      PruningStrategy* strat = batch[i].strategy;
      const LastQueryStat stat = strat != nullptr ? strat->WantsLastQuery(l) : LastQueryStat::kNone;
      if (stat != LastQueryStat::kNone) stat_.assign(rows.n, 0.0f);
      const int64_t q_first = stop ? s.offset + s.n - 1 : s.offset;
      Attention(shape, rows,
                AttentionArgs{.q = q_.data() + q_first * qd, .q_pos = positions_.data() + q_first,
                              .n_q = s.offset + s.n - q_first, .q_stride = qd,
                              .out = att_.data() + q_first * qd, .out_stride = qd,
                              .last_query_probs = stat == LastQueryStat::kProbs ? stat_.data() : nullptr,
                              .last_query_logits = stat == LastQueryStat::kLogits ? stat_.data() : nullptr},
                pool_);
      if (stat != LastQueryStat::kNone) strat->AfterAttention(l, stat_, std::span<const int32_t>(rows.positions, rows.n));
    }
    if (stop) break;
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

  out->next_position.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    int32_t next = 0;  // the newest row is last at every layer; revived rows sit before it
    for (int32_t p : std::span<const int32_t>(positions_.data() + seg[i].offset, seg[i].n)) next = std::max(next, p + 1);
    out->next_position[i] = next;
  }
  out->row_offset.assign(batch.size(), 0);
  out->row_count.assign(batch.size(), 0);
  out->kept_rows.resize(batch.size());
  if (prefix) {
    out->logits.clear();
    return absl::OkStatus();
  }
  // Final norm and output projection, only for the rows that need logits.
  int64_t n_out = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    out->kept_rows[i].clear();
    if (batch[i].report_kept) {
      for (int64_t r = 0; r < seg[i].n; ++r) {
        if (const int32_t o = origins_[seg[i].offset + r]; o >= 0) out->kept_rows[i].push_back(o);
      }
    }
    const int64_t count = batch[i].no_logits ? 0 : (batch[i].all_logits ? seg[i].n : 1);
    out->row_offset[i] = n_out;
    out->row_count[i] = count;
    const int64_t first = seg[i].offset + seg[i].n - count;
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
