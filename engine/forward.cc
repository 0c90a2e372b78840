#include "engine/forward.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/fault.h"
#include "base/status.h"
#include "engine/shared_attention.h"

namespace ps {

absl::Status Transformer::EnsureCapacity(int64_t rows) {
  const ModelConfig& c = model_.config();
  const std::pair<Activations*, int> buffers[] = {{&x_, c.n_embd},   {&xn_, c.n_embd},  {&q_, c.q_dim()},
                                                  {&k_, c.kv_dim()}, {&v_, c.kv_dim()}, {&att_, c.q_dim()},
                                                  {&tmp_, c.n_embd}, {&gate_, c.n_ff},  {&up_, c.n_ff}};
  for (const auto& [buffer, width] : buffers) PS_RETURN_IF_ERROR(buffer->Reserve(backend_, rows * width));
  return absl::OkStatus();
}

// The engine services of one sequence during a step (SeqContext). A prefix pass
// runs under the sequence's id complemented (scratch KV; ids of real sequences are
// >= 0) and shares the sequence's parked rows.
class Transformer::Context final : public SeqContext {
 public:
  Context(Transformer& t, KvCache& kv, const SeqInput& in) : t_(t), kv_(kv), in_(in) {}

  absl::Status RunPrefix(std::span<const int32_t> tokens, std::span<const int32_t> positions, int last_layer) override {
    if (last_layer < 0 || last_layer >= t_.model_.config().n_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefix pass to layer ", last_layer, " of a ", t_.model_.config().n_layers, "-layer model"));
    }
    StepRows rows{.tokens = {tokens.begin(), tokens.end()},
                  .positions = {positions.begin(), positions.end()},
                  .origin = std::vector<int32_t>(tokens.size())};
    std::iota(rows.origin.begin(), rows.origin.end(), 0);
    const StepRows* rows_ptr = &rows;
    const SeqInput in{.seq_id = ~in_.seq_id, .no_logits = true, .strategy = in_.strategy};
    Context ctx(t_, kv_, in);
    Context* ctx_ptr = &ctx;
    ForwardOutput out;
    out.status.assign(1, absl::OkStatus());
    absl::Status st = t_.Run(std::span<const SeqInput>(&in, 1), std::span<const StepRows* const>(&rows_ptr, 1),
                             std::span<Context* const>(&ctx_ptr, 1), last_layer, kv_, &out);
    if (st.ok()) st = out.status[0];
    kv_.Free(in.seq_id);
    if (st.ok()) rows_computed_ += out.rows_computed[0];
    if (!out.host_bytes.empty()) host_bytes_ += out.host_bytes[0];
    return st;
  }
  bool AuxPut(int32_t position, const float* hidden) override {
    return kv_.manager().host_rows().Put(owner(), position, hidden);
  }
  bool AuxTake(int32_t position, float* hidden) override {
    return kv_.manager().host_rows().Take(owner(), position, hidden);
  }
  const LayerTable& Kv(int layer) const override { return kv_.manager().Table(in_.seq_id, layer); }
  int KvBlockTokens() const override { return kv_.manager().block_tokens(); }
  absl::Status MovePages(int layer, std::span<const int32_t> pages, Tier to) override {
    return kv_.Move(in_.seq_id, layer, pages, to);
  }
  absl::Status DropHeadPages(int layer, int kv_head, std::span<const int32_t> pages) override {
    return kv_.DropHead(in_.seq_id, layer, kv_head, pages);
  }

  int64_t rows_computed() const { return rows_computed_; }
  int64_t host_bytes() const { return host_bytes_; }

 private:
  int64_t owner() const { return KvCacheManager::ScratchOwner(in_.seq_id); }
  Transformer& t_;
  KvCache& kv_;
  const SeqInput& in_;
  int64_t rows_computed_ = 0;  // of prefix passes
  int64_t host_bytes_ = 0;     // read by the strategy's hooks during prefix passes
};

absl::Status Transformer::Forward(std::span<const SeqInput> batch, KvCache& kv, ForwardOutput* out) {
  // Strategies see (and may rewrite) their rows first: prefix passes reuse the
  // activation buffers, so they run before this step fills them.
  const size_t n = batch.size();
  out->status.assign(n, absl::OkStatus());
  step_rows_.resize(n);
  std::vector<std::unique_ptr<Context>> contexts(n);
  std::vector<Context*> context_ptrs(n);
  std::vector<const StepRows*> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const SeqInput& s = batch[i];
    contexts[i] = std::make_unique<Context>(*this, kv, s);
    context_ptrs[i] = contexts[i].get();
    rows[i] = &step_rows_[i];
    StepRows& r = step_rows_[i];
    r.tokens.assign(s.tokens.begin(), s.tokens.end());
    r.positions.assign(s.positions.begin(), s.positions.end());
    r.origin.resize(s.tokens.size());
    std::iota(r.origin.begin(), r.origin.end(), 0);
    if (s.seq_id < 0) {
      out->status[i] = absl::InvalidArgumentError(absl::StrCat("negative sequence id ", s.seq_id));
    } else if (s.strategy != nullptr) {
      out->status[i] = s.strategy->BeginStep(&r, *contexts[i]);
      if (out->status[i].ok() && fault::Hit(fault::Point::kStrategy)) {
        out->status[i] =
            absl::InternalError(absl::StrCat("strategy ", std::string(s.strategy->name()), ": injected fault"));
      }
      if (out->status[i].ok() && r.origin.size() != r.tokens.size()) {
        out->status[i] = absl::InternalError(
            absl::StrCat("strategy ", std::string(s.strategy->name()), " left rows without origins"));
      }
    }
  }
  PS_RETURN_IF_ERROR(Run(batch, rows, context_ptrs, -1, kv, out));
  for (size_t i = 0; i < n; ++i) {
    out->rows_computed[i] += contexts[i]->rows_computed();
    out->host_bytes[i] += contexts[i]->host_bytes();
  }
  return absl::OkStatus();
}

absl::Status Transformer::EditRows(int layer, std::span<const SeqInput> batch, std::span<Context* const> contexts,
                                   std::vector<absl::Status>& status, std::vector<HostReads>& reads) {
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
    if (!status[i].ok()) {  // a failed sequence leaves the batch
      std::fill(e.keep.begin(), e.keep.end(), 0);
      changed = changed || seg[i].n > 0;
    } else if (batch[i].strategy != nullptr) {
      hidden_rows_.View(x_.data() + seg[i].offset * d, seg[i].n, d, &reads[i]);
      LayerRows lr{.positions = std::span<const int32_t>(positions_.data() + seg[i].offset, seg[i].n),
                   .hidden = &hidden_rows_,
                   .keep = &e.keep,
                   .add_positions = &e.add_positions,
                   .add_hidden = &e.add_hidden};
      batch[i].strategy->RowsForLayer(layer, lr, *contexts[i]);
      PS_CHECK(e.keep.size() == static_cast<size_t>(seg[i].n) && e.keep.back())
          << "strategy " << batch[i].strategy->name() << " pruned the newest row or resized keep";
      PS_CHECK(e.add_hidden.size() == e.add_positions.size() * d) << "added rows without hidden states";
      if (!reads[i].error.ok()) {  // the hook could not read its rows: the sequence leaves the batch
        status[i] = reads[i].error;
        std::fill(e.keep.begin(), e.keep.end(), 0);
        e.add_positions.clear();
        e.add_hidden.clear();
      }
      changed = changed || !e.add_positions.empty() || std::find(e.keep.begin(), e.keep.end(), 0) != e.keep.end();
    }
    total += static_cast<int64_t>(e.add_positions.size() + std::count(e.keep.begin(), e.keep.end(), 1));
  }
  if (!changed) return absl::OkStatus();
  // Rebuild into tmp_ (free between layers): per sequence, added rows (from the
  // host) then kept rows (gathered from x_).
  PS_RETURN_IF_ERROR(tmp_.Reserve(backend_, total * d));
  new_positions_.clear();
  new_origins_.clear();
  gather_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const RowEdit& e = edits_[i];
    const auto start = static_cast<int64_t>(gather_.size());
    gather_.insert(gather_.end(), e.add_positions.size(), -1);
    new_positions_.insert(new_positions_.end(), e.add_positions.begin(), e.add_positions.end());
    new_origins_.insert(new_origins_.end(), e.add_positions.size(), -1);
    for (int64_t r = 0; r < seg[i].n; ++r) {
      if (!e.keep[r]) continue;
      const int64_t src = seg[i].offset + r;
      gather_.push_back(static_cast<int32_t>(src));
      new_positions_.push_back(positions_[src]);
      new_origins_.push_back(origins_[src]);
    }
    seg[i] = Segment{.offset = start, .n = static_cast<int64_t>(gather_.size()) - start};
  }
  backend_.GatherRows(x_.data(), gather_, d, tmp_.data());
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<float>& add = edits_[i].add_hidden;
    if (!add.empty()) backend_.CopyFromHost(add.data(), tmp_.data() + seg[i].offset * d, add.size() * sizeof(float));
  }
  x_.swap(tmp_);
  positions_.swap(new_positions_);
  origins_.swap(new_origins_);
  n_rows_ = total;
  return EnsureCapacity(total);  // x_ holds `total` rows already: kept
}

int64_t Transformer::KeepLogitRows(std::span<const SeqInput> batch, const std::vector<absl::Status>& status) {
  const ModelConfig& c = model_.config();
  logit_rows_.resize(batch.size());
  gather_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    const Segment& s = segments_[i];
    const int64_t count = !status[i].ok() || batch[i].no_logits ? 0 : (batch[i].all_logits ? s.n : 1);
    logit_rows_[i] = Segment{.offset = s.offset + s.n - count, .n = count};
    for (int64_t r = s.offset + s.n - count; r < s.offset + s.n; ++r) gather_.push_back(static_cast<int32_t>(r));
  }
  const auto kept = static_cast<int64_t>(gather_.size());
  if (kept == n_rows_) return kept;  // every row gives logits: they stay where they are
  for (size_t i = 0, next = 0; i < batch.size(); next += logit_rows_[i++].n) logit_rows_[i].offset = next;
  backend_.GatherRows(att_.data(), gather_, c.q_dim(), q_.data());  // q_ is free once attention ran
  backend_.GatherRows(x_.data(), gather_, c.n_embd, tmp_.data());
  x_.swap(tmp_);
  return kept;
}

AttentionShape Transformer::Shape() const {
  const ModelConfig& c = model_.config();
  return AttentionShape{.n_heads = c.n_heads,
                        .n_kv_heads = c.n_kv_heads,
                        .head_dim = c.head_dim,
                        .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
}

absl::Status Transformer::Attend(int layer, int stop_layer, size_t i, const SeqInput& in, Context& ctx, KvCache& kv,
                                 HostReads& reads) {
  const ModelConfig& c = model_.config();
  const int qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t offset = segments_[i].offset, n = segments_[i].n;
  // A prefix pass ends with the last row's attention at its last layer.
  const int64_t q_first = layer == stop_layer ? offset + n - 1 : offset;
  const int64_t n_q = offset + n - q_first;
  PruningStrategy* strategy = in.strategy;
  const AttentionShape shape = Shape();
  KvSelection& selection = selections_[i];
  selection.segments.clear();
  if (strategy != nullptr) {
    q_rows_.View(q_.data() + q_first * qd, n_q, qd, &reads);
    k_rows_.View(k_.data() + offset * kvd, n, kvd, &reads);
    strategy->SelectKv(layer,
                       LayerAttention{.q_positions = std::span<const int32_t>(positions_.data() + q_first, n_q),
                                      .q = &q_rows_,
                                      .new_positions = std::span<const int32_t>(positions_.data() + offset, n),
                                      .k = &k_rows_,
                                      .shape = shape},
                       ctx, &selection);
    PS_RETURN_IF_ERROR(reads.error);
  }
  const LastQueryStat stat = strategy != nullptr ? strategy->WantsLastQuery(layer) : LastQueryStat::kNone;
  if (const SharedScores* share = strategy != nullptr ? strategy->ShareScores(layer) : nullptr; share != nullptr) {
    if (!selection.all() || stat != LastQueryStat::kNone) {
      return absl::InternalError(absl::StrCat("strategy ", std::string(strategy->name()), " shares scores at layer ",
                                              layer, " with a KV selection or last-query statistics"));
    }
    return SharedAttention(backend_, kv, *share,
                           SharedAttentionArgs{.seq = in.seq_id,
                                               .layer = layer,
                                               .shape = shape,
                                               .q = q_.data() + q_first * qd,
                                               .q_pos = positions_.data() + q_first,
                                               .n_q = n_q,
                                               .q_stride = qd,
                                               .out = att_.data() + q_first * qd,
                                               .out_stride = qd,
                                               .layers = model_.layers},
                           shared_);
  }
  PS_ASSIGN_OR_RETURN(const KvRows rows, kv.View(in.seq_id, layer, &selection, -1, &tables_[i]));
  PS_RETURN_IF_ERROR(selection.Validate(n_q, rows.n, c.n_kv_heads));
  if (stat != LastQueryStat::kNone) {
    PS_RETURN_IF_ERROR(stat_.Reserve(backend_, rows.n));
  }
  const AttentionCall call{
      .kv = rows,
      .args = AttentionArgs{.q = q_.data() + q_first * qd,
                            .q_pos = positions_.data() + q_first,
                            .n_q = n_q,
                            .q_stride = qd,
                            .out = att_.data() + q_first * qd,
                            .out_stride = qd,
                            .selection = selection.all() ? nullptr : &selection,
                            .last_query_probs = stat == LastQueryStat::kProbs ? stat_.data() : nullptr,
                            .last_query_logits = stat == LastQueryStat::kLogits ? stat_.data() : nullptr}};
  if (stat == LastQueryStat::kNone) {
    calls_.push_back(call);
    return absl::OkStatus();
  }
  backend_.Attention(shape, call.kv, call.args);
  reads.bytes += rows.n * static_cast<int64_t>(sizeof(float));
  const float* values = HostView(backend_, stat_.data(), rows.n, host_stat_);
  strategy->AfterAttention(layer, std::span<const float>(values, rows.n),
                           std::span<const int32_t>(rows.positions, rows.n), ctx);
  return absl::OkStatus();
}

absl::Status Transformer::Run(std::span<const SeqInput> batch, std::span<const StepRows* const> step_rows,
                              std::span<Context* const> contexts, int last_layer, KvCache& kv, ForwardOutput* out) {
  const ModelConfig& c = model_.config();
  const int d = c.n_embd;
  const bool prefix = last_layer >= 0;
  const int n_layers = prefix ? last_layer + 1 : c.n_layers;
  std::vector<absl::Status>& status = out->status;
  PS_CHECK(status.size() == batch.size()) << "statuses not sized by the caller";
  bool any_strategy = false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepRows& s = *step_rows[i];
    if (!status[i].ok()) continue;
    if (s.tokens.empty() || s.tokens.size() != s.positions.size()) {
      status[i] = absl::InvalidArgumentError(
          absl::StrCat("sequence ", batch[i].seq_id, ": tokens and positions must be non-empty and of equal length"));
    }
    for (int32_t t : s.tokens) {
      if (status[i].ok() && (t < 0 || t >= c.n_vocab)) {
        status[i] = absl::InvalidArgumentError(absl::StrCat("token id ", t, " out of range"));
      }
    }
    for (int32_t p : s.positions) {
      if (status[i].ok() && p < 0) status[i] = absl::InvalidArgumentError(absl::StrCat("negative position ", p));
    }
    any_strategy = any_strategy || batch[i].strategy != nullptr;
  }
  std::vector<HostReads> reads(batch.size());
  tokens_.clear();
  positions_.clear();
  origins_.clear();
  std::vector<Segment>& seg = segments_;
  seg.resize(batch.size());
  selections_.resize(batch.size());
  tables_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepRows& s = *step_rows[i];
    const int64_t n = status[i].ok() ? static_cast<int64_t>(s.tokens.size()) : 0;
    seg[i] = Segment{.offset = static_cast<int64_t>(tokens_.size()), .n = n};
    tokens_.insert(tokens_.end(), s.tokens.begin(), s.tokens.begin() + n);
    positions_.insert(positions_.end(), s.positions.begin(), s.positions.begin() + n);
    origins_.insert(origins_.end(), s.origin.begin(), s.origin.begin() + n);
  }
  n_rows_ = static_cast<int64_t>(tokens_.size());
  logit_rows_.clear();  // set at the last layer
  PS_RETURN_IF_ERROR(EnsureCapacity(n_rows_));
  out->rows_computed.assign(batch.size(), 0);
  out->layer_rows.assign(batch.size() * c.n_layers, 0);
  backend_.Embed(model_.tok_embd, tokens_, x_.data());

  for (int l = 0; l < n_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    bool edit = any_strategy;
    for (size_t i = 0; i < batch.size() && !edit; ++i) edit = !status[i].ok() && seg[i].n > 0;
    // Rows leave, revived ones come back.
    if (l > 0 && edit) PS_RETURN_IF_ERROR(EditRows(l, batch, contexts, status, reads));
    int64_t n_rows = n_rows_;
    if (n_rows == 0) break;  // every sequence failed
    for (size_t i = 0; i < batch.size(); ++i) {
      out->rows_computed[i] += seg[i].n;
      out->layer_rows[i * c.n_layers + l] = static_cast<int32_t>(seg[i].n);
    }

    backend_.RmsNorm(x_.data(), w.attn_norm.data(), xn_.data(), n_rows, d, c.rms_eps);
    const MatMulOutput qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
    backend_.MatMuls(qkv, xn_.data(), n_rows);
    const QkvBias bias = w.bq.empty() ? QkvBias{}
                                      : QkvBias{.q = w.bq.data(),
                                                .k = w.bk.data(),
                                                .v = w.bv.data(),
                                                .k_shift = w.bk_shift.empty() ? nullptr : w.bk_shift.data()};
    backend_.BiasRope(c.rope, std::span<const int32_t>(positions_.data(), n_rows), bias, q_.data(), k_.data(),
                      v_.data(), c.n_heads, c.n_kv_heads, c.head_dim);
    // Every sequence's K and V (one store for the batch), then its attention: those
    // whose strategies do not read the result at this layer run together.
    appends_.clear();
    appended_.clear();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (seg[i].n == 0 || !status[i].ok()) continue;
      appends_.push_back({.seq = batch[i].seq_id,
                          .positions = std::span<const int32_t>(positions_.data() + seg[i].offset, seg[i].n),
                          .row = seg[i].offset});
      appended_.push_back(i);
    }
    append_status_.resize(appends_.size());
    kv.AppendAll(l, appends_, k_.data(), v_.data(), append_status_);
    calls_.clear();
    for (size_t j = 0; j < appended_.size(); ++j) {
      const size_t i = appended_[j];
      status[i] = append_status_[j];
      if (status[i].ok()) status[i] = Attend(l, last_layer, i, batch[i], *contexts[i], kv, reads[i]);
    }
    backend_.Attentions(Shape(), calls_);
    if (prefix) {
      // A prefix pass runs its prompt in this one step: no later layer reads this
      // layer's scratch KV, so it goes now (the pass holds one layer's at a time).
      for (const SeqInput& in : batch) kv.FreeLayer(in.seq_id, l);
      if (l == last_layer) break;
    }
    const float* att = att_.data();
    if (l == n_layers - 1) {  // the rest of the layer only for the rows that give logits
      n_rows = KeepLogitRows(batch, status);
      if (n_rows == 0) break;
      att = n_rows < n_rows_ ? q_.data() : att;
    }
    backend_.MatMul(w.wo, att, n_rows, tmp_.data());
    backend_.AddRmsNorm(tmp_.data(), x_.data(), w.ffn_norm.data(), xn_.data(), n_rows, d, c.rms_eps);
    const MatMulOutput gate_up[] = {{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}};
    backend_.MatMuls(gate_up, xn_.data(), n_rows);
    backend_.SiluMul(gate_.data(), up_.data(), n_rows, c.n_ff);
    backend_.MatMul(w.w_down, gate_.data(), n_rows, tmp_.data());
    backend_.Add(tmp_.data(), x_.data(), n_rows, d);
  }

  out->next_position.assign(batch.size(), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    int32_t next = 0;  // the newest row is last at every layer; revived rows sit before it
    for (int32_t p : std::span<const int32_t>(positions_.data() + seg[i].offset, seg[i].n))
      next = std::max(next, p + 1);
    out->next_position[i] = next;
  }
  out->host_bytes.clear();
  for (const HostReads& r : reads) out->host_bytes.push_back(r.bytes);
  out->row_offset.assign(batch.size(), 0);
  out->row_count.assign(batch.size(), 0);
  out->kept_rows.resize(batch.size());
  if (prefix) {
    out->logits.clear();
    return backend_.Synchronize();
  }
  // Final norm and output projection, only for the rows that need logits.
  int64_t n_out = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    out->kept_rows[i].clear();
    if (!status[i].ok()) continue;
    if (batch[i].report_kept) {
      for (int64_t r = 0; r < seg[i].n; ++r) {
        if (const int32_t o = origins_[seg[i].offset + r]; o >= 0) out->kept_rows[i].push_back(o);
      }
    }
    PS_CHECK(logit_rows_.size() == batch.size()) << "the last layer did not run";
    const int64_t count = logit_rows_[i].n;
    out->row_offset[i] = n_out;
    out->row_count[i] = count;
    backend_.RmsNorm(x_.data() + logit_rows_[i].offset * d, model_.output_norm.data(), xn_.data() + n_out * d, count, d,
                     c.rms_eps);
    n_out += count;
  }
  out->logits.resize(static_cast<size_t>(n_out) * c.n_vocab);
  if (n_out > 0) {
    PS_RETURN_IF_ERROR(logits_.Reserve(backend_, n_out * c.n_vocab));
    backend_.MatMul(model_.output, xn_.data(), n_out, logits_.data());
    backend_.CopyToHost(logits_.data(), out->logits.data(), out->logits.size() * sizeof(float));
  }
  return backend_.Synchronize();
}

}  // namespace ps
