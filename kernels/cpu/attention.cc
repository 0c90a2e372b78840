#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/vec.h"

namespace ps {
namespace {

constexpr int64_t kQueryTile = 32;

float* Scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Number of leading keys any query of the tile may see.
int64_t VisibleKeys(const KvRows& kv, int32_t max_q_pos) {
  if (!kv.positions_ascending) return kv.n;
  return std::upper_bound(kv.positions, kv.positions + kv.n, max_q_pos) - kv.positions;
}

// Scores of rows [j0, j0 + nb) (inside one block) of one key head against q.
void KeyDots(const KvRows& kv, const float* q, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return DotRows(q, static_cast<const float*>(kv.k(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) out[r] = DotHalf(kv.dtype, static_cast<const uint16_t*>(kv.k(j0 + r, col)), q, hd);
}

// out += p[r] * value row j0 + r of one head, for the nb rows of one block.
void ValueAxpys(const KvRows& kv, const float* p, int64_t j0, int64_t nb, int64_t col, int hd, float* out) {
  if (kv.dtype == DType::kF32) return AxpyRows(p, static_cast<const float*>(kv.v(j0, col)), kv.stride, nb, hd, out);
  for (int64_t r = 0; r < nb; ++r) {
    if (p[r] != 0.0f) AxpyHalf(kv.dtype, p[r], static_cast<const uint16_t*>(kv.v(j0 + r, col)), out, hd);
  }
}

// Rows [j0, j0 + nb) of one head's keys or values (element `col` on) as F32 with
// leading dimension *ld: the block itself for an F32 cache, else converted into scratch.
const float* BlockF32(const KvRows& kv, bool keys, int64_t j0, int64_t nb, int64_t col, int hd, float* scratch,
                      int64_t* ld) {
  const void* first = keys ? kv.k(j0, col) : kv.v(j0, col);
  if (kv.dtype == DType::kF32) {
    *ld = kv.stride;
    return static_cast<const float*>(first);
  }
  for (int64_t r = 0; r < nb; ++r) {
    HalfToF32(kv.dtype, static_cast<const uint16_t*>(first) + r * kv.stride, scratch + r * hd, hd);
  }
  *ld = hd;
  return scratch;
}

}  // namespace

void Attention(const AttentionShape& s, const KvRows& kv, const AttentionArgs& a, ThreadPool& pool) {
  PS_CHECK(s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0) << "bad head counts";
  const int group = s.n_heads / s.n_kv_heads;
  const int hd = s.head_dim;
  const int64_t n_tiles = (a.n_q + kQueryTile - 1) / kQueryTile;
  const int64_t units = n_tiles * s.n_heads;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // The last query's probabilities / scores per head, reduced after the parallel region.
  static thread_local std::vector<float> last_probs_storage, last_logits_storage;
  auto per_head = [&](std::vector<float>& storage, const float* wanted) -> float* {
    if (wanted == nullptr) return nullptr;
    storage.assign(static_cast<size_t>(s.n_heads * kv.n), 0.0f);
    return storage.data();
  };
  float* last_probs = per_head(last_probs_storage, a.last_query_probs);
  float* last_logits = per_head(last_logits_storage, a.last_query_logits);

  pool.ParallelFor(units, 1, [&](int64_t u0, int64_t u1) {
    static thread_local std::vector<float> scores_storage, block_storage;
    float* block_scratch = kv.dtype == DType::kF32 ? nullptr : Scratch(block_storage, kv.block_rows * hd);
    for (int64_t u = u0; u < u1; ++u) {
      const int h = static_cast<int>(u % s.n_heads);
      const int64_t q0 = (u / s.n_heads) * kQueryTile;
      const int64_t nq = std::min(kQueryTile, a.n_q - q0);
      const int kvh = h / group;
      int32_t max_pos = std::numeric_limits<int32_t>::min();
      for (int64_t i = 0; i < nq; ++i) max_pos = std::max(max_pos, a.q_pos[q0 + i]);
      const int64_t nk = VisibleKeys(kv, max_pos);
      if (scores_storage.size() < static_cast<size_t>(nq * std::max<int64_t>(nk, 1))) {
        scores_storage.resize(static_cast<size_t>(nq * std::max<int64_t>(nk, 1)));
      }
      float* sc = scores_storage.data();  // [nq, nk]
      const float* qh = a.q + q0 * a.q_stride + h * hd;
      float* oh = a.out + q0 * a.out_stride + h * hd;
      if (nk == 0) {
        for (int64_t i = 0; i < nq; ++i) std::memset(oh + i * a.out_stride, 0, hd * sizeof(float));
        continue;
      }
      if (nq == 1) {
        for (int64_t j0 = 0; j0 < nk; j0 += kv.block_rows) {
          KeyDots(kv, qh, j0, std::min(kv.block_rows, nk - j0), kvh * hd, hd, sc + j0);
        }
      } else {
        for (int64_t j0 = 0; j0 < nk; j0 += kv.block_rows) {  // S[:, block] = Q K_block^T
          const int64_t nb = std::min(kv.block_rows, nk - j0);
          int64_t ld = 0;
          const float* kb = BlockF32(kv, true, j0, nb, kvh * hd, hd, block_scratch, &ld);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nq), static_cast<int>(nb), hd,
                      1.0f, qh, static_cast<int>(a.q_stride), kb, static_cast<int>(ld), 0.0f, sc + j0,
                      static_cast<int>(nk));
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* row = sc + i * nk;
        const int32_t qp = a.q_pos[q0 + i];
        for (int64_t j = 0; j < nk; ++j) row[j] = kv.positions[j] <= qp ? row[j] * s.scale : neg_inf;
        if (last_logits != nullptr && q0 + i == a.n_q - 1) {
          float* dst = last_logits + h * kv.n;
          std::memcpy(dst, row, nk * sizeof(float));
          std::fill(dst + nk, dst + kv.n, neg_inf);
        }
        SoftmaxInPlace(row, nk);
      }
      if (last_probs != nullptr && q0 + nq == a.n_q) {
        std::memcpy(last_probs + h * kv.n, sc + (nq - 1) * nk, nk * sizeof(float));
      }
      if (nq == 1) {
        std::memset(oh, 0, hd * sizeof(float));
        for (int64_t j0 = 0; j0 < nk; j0 += kv.block_rows) {
          ValueAxpys(kv, sc + j0, j0, std::min(kv.block_rows, nk - j0), kvh * hd, hd, oh);
        }
      } else {
        for (int64_t j0 = 0; j0 < nk; j0 += kv.block_rows) {  // O += P[:, block] V_block
          const int64_t nb = std::min(kv.block_rows, nk - j0);
          int64_t ld = 0;
          const float* vb = BlockF32(kv, false, j0, nb, kvh * hd, hd, block_scratch, &ld);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(nq), hd, static_cast<int>(nb),
                      1.0f, sc + j0, static_cast<int>(nk), vb, static_cast<int>(ld), j0 == 0 ? 0.0f : 1.0f, oh,
                      static_cast<int>(a.out_stride));
        }
      }
    }
  });

  if (a.last_query_probs != nullptr) {
    std::fill(a.last_query_probs, a.last_query_probs + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) AddInPlace(last_probs + h * kv.n, a.last_query_probs, kv.n);
    Scale(1.0f / s.n_heads, a.last_query_probs, kv.n);
  }
  if (a.last_query_logits != nullptr) {
    std::fill(a.last_query_logits, a.last_query_logits + kv.n, 0.0f);
    for (int h = 0; h < s.n_heads; ++h) AddInPlace(last_logits + h * kv.n, a.last_query_logits, kv.n);
  }
}

}  // namespace ps
