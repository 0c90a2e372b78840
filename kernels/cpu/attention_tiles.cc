#include "kernels/cpu/attention_tiles.h"

#include <algorithm>
#include <limits>

#include "base/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_avx512_q8.h"

namespace ps::attention_internal {
namespace {

constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

}  // namespace

thread_local KeyMajorTiles::TileUnit KeyMajorTiles::unit_;

KeyMajorTiles::KeyMajorTiles(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg, int kvh,
                             int64_t q0, int64_t nq)
    : s_(s),
      a_(a),
      seg_(seg),
      kv_(*seg.kv),
      group_(s.n_heads / s.n_kv_heads),
      hd_(s.head_dim),
      kvh_(kvh),
      nq_(nq),
      q8_(kv_.dtype == DType::kQ8_0) {
  PS_CHECK(PrefillAttentionOnBf16(s, kv_.dtype) || PrefillAttentionOnInt8(s, kv_.dtype))
      << "no key-major tiles for a " << DTypeName(kv_.dtype) << " cache at this CPU level";
  TileUnit& u = unit_;
  const int64_t nqp = avx512_bf16::PaddedRows(nq);
  u.nqp = nqp;
  u.ot.assign(group_ * hd_ * nqp, 0.0f);
  u.m.assign(group_ * nqp, -std::numeric_limits<float>::infinity());
  u.l.assign(group_ * nqp, 0.0f);
  u.q_pos.resize(nqp);  // padding rows (zero queries) at the last row's position
  for (int64_t i = 0; i < nqp; ++i) u.q_pos[i] = a_.q_pos[q0 + std::min(i, nq - 1)];
  if (q8_) {
    u.qt8.resize(group_ * hd_ * nqp);
    u.qscale.resize(group_ * hd_ / avx512_q8::kQ8Values * nqp);
  } else {
    u.qt.resize(group_ * hd_ * nqp);
  }
  for (int h = 0; h < group_; ++h) {
    const float* q = a_.q + q0 * a_.q_stride + (kvh * group_ + h) * hd_;
    if (q8_) {
      avx512_q8::PackQueries(q, a_.q_stride, nq, hd_, s_.scale * kLog2e, u.qt8.data() + h * hd_ * nqp,
                             u.qscale.data() + h * hd_ / avx512_q8::kQ8Values * nqp);
    } else {
      avx512_bf16::PackQueries(q, a_.q_stride, nq, hd_, u.qt.data() + h * hd_ * nqp);
    }
  }
}

void KeyMajorTiles::Attend(std::span<const Chunk> pieces, int64_t nt, int32_t min_pos, int32_t max_pos,
                           bool last_tile) {
  const int kvh = kvh_;
  const int64_t nq = nq_;
  TileUnit& u = unit_;
  const int64_t nqp = u.nqp;
  u.keys.clear();
  u.values.clear();
  u.keys8.clear();
  u.values8.clear();
  u.key_pos.clear();
  for (const Chunk& p : pieces) {
    for (int64_t r = 0; r < p.nb; ++r) {
      const void* k = kv_.k(p.j0 + r, kvh * hd_);
      const void* v = kv_.v(p.j0 + r, kvh * hd_);
      if (q8_) {
        u.keys8.push_back(static_cast<const uint8_t*>(k));
        u.values8.push_back(static_cast<const uint8_t*>(v));
      } else {
        u.keys.push_back(static_cast<const uint16_t*>(k));
        u.values.push_back(static_cast<const uint16_t*>(v));
      }
      u.key_pos.push_back(kv_.positions[p.j0 + r]);
    }
  }
  const int64_t padded = avx512_bf16::PaddedKeys(nt);
  if (q8_) {  // the keys' block terms; the values' quants by 4 keys, their scales as gains
    const int nb = hd_ / avx512_q8::kQ8Values;
    u.key_offsets.resize(nt * nb);
    u.key_scales.resize(nt * nb);
    avx512_q8::KeyTerms(u.keys8.data(), nt, hd_, u.key_offsets.data(), u.key_scales.data());
    u.packed_values8.resize(padded * hd_);
    u.gains.resize(padded * nb);
    u.top.resize(nb);
    avx512_q8::PackValues(u.values8.data(), nt, hd_, u.packed_values8.data(), u.gains.data(), u.top.data());
    u.p8.resize(nb * padded * nqp);
    u.wscale.resize(nb * nqp);
  } else {
    u.packed_values.resize(padded * hd_);
    avx512_bf16::PackValues(u.values.data(), nt, hd_, u.packed_values.data());
    u.p.resize(padded * nqp);
  }
  u.s.resize(nt * nqp);
  u.row_max.resize(nqp);
  u.corr.resize(nqp);
  const auto [k_lo, k_hi] = std::minmax_element(u.key_pos.begin(), u.key_pos.end());
  const bool unmasked = a_.window.SeesAll(*k_lo, *k_hi, min_pos, max_pos);  // every key of the tile to every row
  for (int h = 0; h < group_; ++h) {
    if (q8_) {
      avx512_q8::Scores(u.qt8.data() + h * hd_ * nqp, u.qscale.data() + h * hd_ / avx512_q8::kQ8Values * nqp, nqp,
                        u.keys8.data(), u.key_offsets.data(), u.key_scales.data(), nt, hd_, u.s.data(),
                        u.row_max.data());
    } else {
      avx512_bf16::Scores(u.qt.data() + h * hd_ * nqp, nqp, u.keys.data(), nt, hd_, s_.scale * kLog2e, u.s.data(),
                          u.row_max.data());
    }
    if (!unmasked) {
      avx512_bf16::Mask(static_cast<int>(a_.window.part), a_.window.sinks, a_.window.recent, u.key_pos.data(), nt,
                        u.q_pos.data(), nqp, u.s.data(), u.row_max.data());
    }
    if (last_tile) {  // the last query row's scores
      float* dst = seg_.last_logits + (kvh * group_ + h) * seg_.stats_n;
      int64_t j = 0;
      for (const Chunk& p : pieces) {
        for (int64_t r = 0; r < p.nb; ++r, ++j)
          dst[(seg_.row_ids != nullptr ? seg_.row_ids[p.j0 + r] : p.j0 + r)] = u.s[j * nqp + nq - 1] * kLn2;
      }
    }
    if (q8_) {
      avx512_q8::Softmax(u.s.data(), nqp, nt, hd_, u.row_max.data(), unmasked, u.gains.data(), u.top.data(),
                         u.m.data() + h * nqp, u.l.data() + h * nqp, u.corr.data(), u.wscale.data(), u.p8.data());
      avx512_q8::AddValues(u.p8.data(), nqp, u.packed_values8.data(), nt, hd_, u.corr.data(), u.wscale.data(),
                           u.ot.data() + h * hd_ * nqp);
    } else {
      avx512_bf16::Softmax(u.s.data(), nqp, nt, u.row_max.data(), unmasked, u.m.data() + h * nqp, u.l.data() + h * nqp,
                           u.corr.data(), u.p.data());
      avx512_bf16::AddValues(u.p.data(), nqp, u.packed_values.data(), nt, hd_, u.corr.data(),
                             u.ot.data() + h * hd_ * nqp);
    }
  }
}

void KeyMajorTiles::End(float* out, int64_t out_stride, float* m, float* l) const {
  const int64_t nq = nq_;
  const TileUnit& u = unit_;
  for (int h = 0; h < group_; ++h) {
    const float* ot = u.ot.data() + h * hd_ * u.nqp;
    for (int64_t i = 0; i < nq; ++i) {
      m[h * nq + i] = u.m[h * u.nqp + i] * kLn2;
      l[h * nq + i] = u.l[h * u.nqp + i];
    }
    avx512_bf16::UnpackOutputs(ot, u.nqp, nq, hd_, out + h * hd_, out_stride);
  }
}

}  // namespace ps::attention_internal
