// The CPU attention kernel against attention computed directly in doubles: every KV type,
// selections, windows and their merge, tiles at awkward sizes (the AVX-512 tile and
// decode kernels: attention_tiles_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/quant.h"
#include "tests/kernels/compare.h"
#include "tests/kernels/cpu_levels.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::MaxRelErr;
using testing::Randn;

// The bytes of x stored as a KV cache of `dtype` (F32, F16, BF16 or Q8_0); x itself
// rounded to what they hold, so that the reference sees the values the kernel reads.
std::vector<uint8_t> AsKv(DType dtype, std::vector<float>* x) {
  const auto n = static_cast<int64_t>(x->size());
  std::vector<uint8_t> bytes(RowBytes(dtype, n));
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data(), x->data(), bytes.size());
  } else if (dtype == DType::kQ8_0) {
    QuantizeRowQ8_0(x->data(), reinterpret_cast<BlockQ8_0*>(bytes.data()), n);
    reference::DequantizeRow(dtype, bytes.data(), x->data(), n);
  } else {
    F32ToHalf(dtype, x->data(), reinterpret_cast<uint16_t*>(bytes.data()), n);
    HalfToF32(dtype, reinterpret_cast<const uint16_t*>(bytes.data()), x->data(), n);
  }
  return bytes;
}

// Element `first` of a KV cache's bytes (a multiple of 32 for Q8_0).
const void* KvAt(const std::vector<uint8_t>& bytes, DType dtype, int64_t first) {
  return bytes.data() + RowBytes(dtype, first);
}

// The head size the attention tests take for `dtype`: Q8_0 caches need whole blocks of
// 32 values, and BF16 caches take the BF16 tile kernels at multiples of 32; 24 covers
// the vector loops and their tails.
int TestHeadDim(DType dtype) { return dtype == DType::kQ8_0 || dtype == DType::kBF16 ? 32 : 24; }

// Whether nq query rows over a cache of `dtype` multiply on BF16 dot products (the BF16
// tiles, or for one row the decode kernels: kernels/cpu/attention_avx512.h).
bool Bf16Tiles(const AttentionShape& s, DType dtype, int64_t nq) {
  return nq > 1 ? PrefillAttentionOnBf16(s, dtype) : DecodeAttentionOnBf16(s, dtype);
}
// Whether they take the scores on int8 dot products (the Q8_0 tiles, or for one row the Q8_0
// decode kernels: attention_avx512_q8.h).
bool Int8Tiles(const AttentionShape& s, DType dtype, int64_t nq) {
  return nq > 1 ? PrefillAttentionOnInt8(s, dtype) : DecodeAttentionOnInt8(s, dtype);
}

// The queries rounded to what the kernel multiplies (BF16 on the BF16 tiles; on the Q8_0
// tiles each 32 values of a row's head to int8 quants of their largest / 127), as AsKv
// rounds the cache, so that the reference sees the values the kernel reads.
void AsQueries(const AttentionShape& s, DType dtype, int64_t nq, std::vector<float>* q) {
  if (Int8Tiles(s, dtype, nq)) {
    for (size_t b0 = 0; b0 < q->size(); b0 += 32) {
      float* x = q->data() + b0;
      float amax = 0;
      for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[e]));
      const float d = amax / 127.0f, inverse = d > 0 ? 1.0f / d : 0.0f;
      for (int e = 0; e < 32; ++e) x[e] = std::nearbyint(x[e] * inverse) * d;
    }
    return;
  }
  if (!Bf16Tiles(s, dtype, nq)) return;
  for (float& x : *q) x = Bf16ToFp32(Fp32ToBf16(x));
}

// What the attention tests allow against the direct computation: F32 arithmetic agrees to
// 1e-5; the BF16 key-major tiles round their softmax weights to BF16 (8 significant bits:
// a relative error of 2^-9 each; these tests measure up to 1.7e-3). A Q8_0 tile's weights
// are bytes, steps of 1/255 of the tile's largest (times the key's block scale over the
// tile's largest): a weight a tenth of the largest, as most are among random scores, is
// off by up to 2%, and these tests measure up to 2.7e-2.
double AttentionTolerance(const AttentionShape& s, DType dtype, int64_t nq) {
  if (Int8Tiles(s, dtype, nq)) return 3.5e-2;
  return Bf16Tiles(s, dtype, nq) ? 5e-3 : 1e-5;
}

// Attention computed directly in doubles: query row i's heads of KV head kvh see key j
// when visible(i, kvh, j);
// last-query probabilities (mean over heads) and scaled scores (sum over heads, a
// large negative number where not visible) into *probs and *logits.
template <typename Visible>
std::vector<double> NaiveAttention(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, int64_t nq, int64_t nkv, Visible visible,
                                   std::vector<double>* probs, std::vector<double>* logits) {
  const int hd = s.head_dim, qd = s.n_heads * hd, kvd = s.n_kv_heads * hd;
  std::vector<double> out(nq * qd, 0.0);
  probs->assign(nkv, 0.0);
  logits->assign(nkv, 0.0);
  for (int64_t i = 0; i < nq; ++i) {
    for (int h = 0; h < s.n_heads; ++h) {
      const int kvh = h / (s.n_heads / s.n_kv_heads);
      std::vector<double> sc(nkv);
      double m = -1e300, sum = 0;
      for (int64_t j = 0; j < nkv; ++j) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += double(q[i * qd + h * hd + e]) * k[j * kvd + kvh * hd + e];
        sc[j] = visible(i, kvh, j) ? d * s.scale : -1e300;
        if (i == nq - 1) (*logits)[j] += sc[j];
        m = std::max(m, sc[j]);
      }
      for (auto& x : sc) sum += (x = (x == -1e300 ? 0 : std::exp(x - m)));
      for (int64_t j = 0; j < nkv; ++j) {
        for (int e = 0; e < hd; ++e) out[i * qd + h * hd + e] += sc[j] / sum * v[j * kvd + kvh * hd + e];
        if (i == nq - 1) (*probs)[j] += sc[j] / sum / s.n_heads;
      }
    }
  }
  return out;
}

// Attention over arbitrary (unsorted) KV positions against a direct computation,
// with the cache contiguous (one block) and paged (blocks of 16 and of 7 rows), in
// F32, F16, BF16 and Q8_0 (the reference uses the same rounded keys and values).
void CheckAttentionAgainstNaive() {
  ThreadPool pool(2);
  constexpr int kHeads = 6, kKvHeads = 2;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
    for (int64_t block_rows : {50, 16, 7})
      for (int64_t nq : {1, 5, 40}) {
        const int kHd = TestHeadDim(dtype), kQd = kHeads * kHd, kKvd = kKvHeads * kHd;
        const AttentionShape s{.n_heads = kHeads, .n_kv_heads = kKvHeads, .head_dim = kHd, .scale = 0.2f};
        const int64_t nkv = 50;
        auto q = Randn(nq * kQd, 1), k = Randn(nkv * kKvd, 2), v = Randn(nkv * kKvd, 3);
        const std::vector<uint8_t> kh = AsKv(dtype, &k), vh = AsKv(dtype, &v);
        AsQueries(s, dtype, nq, &q);
        std::vector<int32_t> kv_pos(nkv), q_pos(nq);
        for (int64_t j = 0; j < nkv; ++j) kv_pos[j] = static_cast<int32_t>((j * 7) % nkv);  // a permutation
        for (int64_t i = 0; i < nq; ++i) q_pos[i] = static_cast<int32_t>(nkv - nq + i);
        std::vector<float> out(nq * kQd), probs(nkv);
        // Every block in its own allocation: the kernel must follow the block table.
        std::vector<std::vector<uint8_t>> kb, vb;
        std::vector<const void*> kp, vp;
        for (int64_t b = 0; b * block_rows < nkv; ++b) {
          const size_t first = RowBytes(dtype, b * block_rows * kKvd),
                       last = RowBytes(dtype, std::min(nkv, (b + 1) * block_rows) * kKvd);
          kb.emplace_back(kh.begin() + first, kh.begin() + last);
          vb.emplace_back(vh.begin() + first, vh.begin() + last);
        }
        for (size_t b = 0; b < kb.size(); ++b) {
          kp.push_back(kb[b].data());
          vp.push_back(vb[b].data());
        }
        Attention(s,
                  KvRows{.k_blocks = kp.data(),
                         .v_blocks = vp.data(),
                         .block_rows = block_rows,
                         .positions = kv_pos.data(),
                         .n = nkv,
                         .stride = kKvd,
                         .dtype = dtype},
                  AttentionArgs{.q = q.data(),
                                .q_pos = q_pos.data(),
                                .n_q = nq,
                                .q_stride = kQd,
                                .out = out.data(),
                                .out_stride = kQd,
                                .last_query_probs = probs.data()},
                  pool);
        std::vector<double> want_probs, want_logits;
        const std::vector<double> want = NaiveAttention(
            s, q, k, v, nq, nkv, [&](int64_t i, int, int64_t j) { return kv_pos[j] <= q_pos[i]; }, &want_probs,
            &want_logits);
        const std::string what = absl::StrCat(std::string(DTypeName(dtype)), " nq=", nq, " block_rows=", block_rows);
        const double tol = AttentionTolerance(s, dtype, nq);
        EXPECT_LT(MaxRelErr(out, want), tol) << what;
        EXPECT_LT(MaxRelErr(probs, want_probs), tol) << what;
      }
}

TEST(Attention, MatchesNaiveWithCausalMaskByPosition) { testing::AtEveryCpuLevel(CheckAttentionAgainstNaive); }

// Attention over a KV selection (segments of query rows, each with its row ranges)
// against a direct computation that masks everything else out: F32, F16, BF16 and
// Q8_0 caches,
// paged in blocks of 16 and 7 rows, one query row (the in-place block path) and
// several (the gathered path), ascending positions (keys past the queries skipped)
// and a permutation, the second segment for both KV heads or one per KV head (as
// CritiPrefill selects). Blocks no range reads are not there at all (null, as a block
// in the host tier), and the last query's statistics are 0 / -inf outside the selection.
TEST(Attention, ReadsExactlyTheSelection) {
  ThreadPool pool(2);
  constexpr int kHeads = 4, kKvHeads = 2;
  const int64_t nkv = 50;
  // Rows 14..20 are read by no segment.
  const std::vector<KvRange> first = {{0, 10}, {21, 22}, {30, 45}}, second = {{3, 4}, {24, 50}},
                             second_head1 = {{0, 2}, {40, 50}};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
    for (bool ascending : {true, false})
      for (bool per_head : {false, true})
        for (int64_t block_rows : {16, 7})
          for (int64_t nq : {1, 5, 40}) {
            const int kHd = TestHeadDim(dtype), kQd = kHeads * kHd, kKvd = kKvHeads * kHd;
            const AttentionShape s{.n_heads = kHeads, .n_kv_heads = kKvHeads, .head_dim = kHd, .scale = 0.2f};
            auto q = Randn(nq * kQd, 11), k = Randn(nkv * kKvd, 12), v = Randn(nkv * kKvd, 13);
            const std::vector<uint8_t> kh = AsKv(dtype, &k), vh = AsKv(dtype, &v);
            AsQueries(s, dtype, nq, &q);
            std::vector<int32_t> kv_pos(nkv), q_pos(nq);
            for (int64_t j = 0; j < nkv; ++j) kv_pos[j] = static_cast<int32_t>(ascending ? j : (j * 7) % nkv);
            for (int64_t i = 0; i < nq; ++i) q_pos[i] = static_cast<int32_t>(nkv - nq + i);
            KvSelection sel;
            const int32_t split = nq >= 2 ? static_cast<int32_t>(nq / 2) : static_cast<int32_t>(nq);
            sel.segments.push_back({.q_begin = 0, .q_end = split, .ranges = first});
            if (split < nq && !per_head) {
              sel.segments.push_back({.q_begin = split, .q_end = static_cast<int32_t>(nq), .ranges = second});
            } else if (split < nq) {
              sel.segments.push_back(
                  {.q_begin = split, .q_end = static_cast<int32_t>(nq), .ranges = second, .kv_head = 0});
              sel.segments.push_back(
                  {.q_begin = split, .q_end = static_cast<int32_t>(nq), .ranges = second_head1, .kv_head = 1});
            }
            ASSERT_TRUE(sel.Validate(nq, nkv, kKvHeads).ok()) << sel.Validate(nq, nkv, kKvHeads);
            auto selected = [&](int64_t i, int kvh, int64_t j) {
              for (const KvRange& r : i < split ? first : per_head && kvh == 1 ? second_head1 : second) {
                if (j >= r.begin && j < r.end) return true;
              }
              return false;
            };
            std::vector<const void*> kp, vp;
            for (int64_t b = 0; b * block_rows < nkv; ++b) {
              bool read = false;
              for (int64_t j = b * block_rows; j < std::min(nkv, (b + 1) * block_rows); ++j) {
                for (int64_t i = 0; i < nq; ++i) read = read || selected(i, 0, j) || selected(i, 1, j);
              }
              kp.push_back(read ? KvAt(kh, dtype, b * block_rows * kKvd) : nullptr);
              vp.push_back(read ? KvAt(vh, dtype, b * block_rows * kKvd) : nullptr);
            }
            std::vector<float> out(nq * kQd), probs(nkv), logits(nkv);
            Attention(s,
                      KvRows{.k_blocks = kp.data(),
                             .v_blocks = vp.data(),
                             .block_rows = block_rows,
                             .positions = kv_pos.data(),
                             .n = nkv,
                             .stride = kKvd,
                             .positions_ascending = ascending,
                             .dtype = dtype},
                      AttentionArgs{.q = q.data(),
                                    .q_pos = q_pos.data(),
                                    .n_q = nq,
                                    .q_stride = kQd,
                                    .out = out.data(),
                                    .out_stride = kQd,
                                    .selection = &sel,
                                    .last_query_probs = probs.data(),
                                    .last_query_logits = logits.data()},
                      pool);
            std::vector<double> want_probs, want_logits;
            const std::vector<double> want = NaiveAttention(
                s, q, k, v, nq, nkv,
                [&](int64_t i, int kvh, int64_t j) { return selected(i, kvh, j) && kv_pos[j] <= q_pos[i]; },
                &want_probs, &want_logits);
            const std::string what = absl::StrCat(std::string(DTypeName(dtype)), " nq=", nq, " block_rows=", block_rows,
                                                  ascending ? " ascending" : " permuted", per_head ? " per head" : "");
            const double tol = AttentionTolerance(s, dtype, nq);
            EXPECT_LT(MaxRelErr(out, want), tol) << what;
            EXPECT_LT(MaxRelErr(probs, want_probs), tol) << what;
            for (int64_t j = 0; j < nkv; ++j) {
              if (want_logits[j] < -1e299) {
                EXPECT_TRUE(std::isinf(logits[j]) && logits[j] < 0) << what << " row " << j;
              } else {
                EXPECT_NEAR(logits[j], want_logits[j], 1e-4 * (1 + std::fabs(want_logits[j]))) << what << " row " << j;
              }
            }
          }
  KvSelection bad;
  bad.segments.push_back({.q_begin = 0, .q_end = 3, .ranges = {{5, 9}, {8, 12}}});
  EXPECT_FALSE(bad.Validate(3, 50, 2).ok()) << "overlapping ranges";
  bad.segments[0].ranges = {{5, 60}};
  EXPECT_FALSE(bad.Validate(3, 50, 2).ok()) << "past the rows";
  bad.segments[0].ranges = {{5, 9}};
  EXPECT_FALSE(bad.Validate(4, 50, 2).ok()) << "a query row left out";
  bad.segments[0].kv_head = 0;
  EXPECT_FALSE(bad.Validate(3, 50, 2).ok()) << "KV head 1 missing";
  bad.segments.push_back({.q_begin = 0, .q_end = 3, .ranges = {{1, 2}}, .kv_head = 1});
  EXPECT_TRUE(bad.Validate(3, 50, 2).ok()) << bad.Validate(3, 50, 2);
  EXPECT_FALSE(bad.Validate(3, 50, 3).ok()) << "KV head 2 missing";
  bad.segments[1].q_end = 2;
  EXPECT_FALSE(bad.Validate(3, 50, 2).ok()) << "the heads' query rows differ";
  bad.segments[1] = {.q_begin = 0, .q_end = 3, .ranges = {{1, 2}}, .kv_head = 2};
  EXPECT_FALSE(bad.Validate(3, 50, 2).ok()) << "no such KV head";
}

// PoD's pieces: a position window (proximal: sinks and the recent keys; distant: the
// rest) and each row's log-sum-exp, against a direct computation; the proximal and
// distant parts merged by their log-sum-exps (PoD's gate) give the whole attention;
// and a view of one KV head (blocks offset to the head, rows still the cache's width)
// gives that head's output of the whole call, as do views whose heads have blocks of
// their own (the KV cache's), whose proximal part reads no key distant to every query
// (PoD drops them). One query row over 3000 keys takes the split (flash-decoding)
// path, 40 rows the gathered one. F32, F16, BF16 and Q8_0 caches.
// A tile needs no mask exactly when every (key, query) pair of its position boxes is
// visible: SeesAll against Sees over every box of small positions.
TEST(Attention, WindowSeesAllIsEveryPairSeen) {
  using Part = PositionWindow::Part;
  constexpr int32_t kMax = 24;
  for (Part part : {Part::kAll, Part::kProximal, Part::kDistant}) {
    const PositionWindow w{.part = part, .sinks = 3, .recent = 5};
    int64_t seen_all = 0;
    for (int32_t k_lo = 0; k_lo < kMax; ++k_lo)
      for (int32_t k_hi = k_lo; k_hi < kMax; ++k_hi)
        for (int32_t q_lo = 0; q_lo < kMax; ++q_lo)
          for (int32_t q_hi = q_lo; q_hi < kMax; ++q_hi) {
            bool want = true;
            for (int32_t k = k_lo; k <= k_hi && want; ++k) {
              for (int32_t q = q_lo; q <= q_hi && want; ++q) want = w.Sees(k, q);
            }
            ASSERT_EQ(w.SeesAll(k_lo, k_hi, q_lo, q_hi), want)
                << "part " << static_cast<int>(part) << " keys [" << k_lo << ", " << k_hi << "] queries [" << q_lo
                << ", " << q_hi << "]";
            seen_all += want;
          }
    EXPECT_GT(seen_all, 0) << static_cast<int>(part);
  }
}

// One case of the test below: attention with each window part (sinks 4, `recent`
// newest) against the direct computation, the parts' merge against the whole, and the
// KV cache's layouts.
void CheckWindowParts(ThreadPool& pool, DType dtype, int64_t nq, int64_t nkv, int32_t recent) {
  constexpr int kHeads = 4, kKvHeads = 2;
  constexpr int64_t kBlock = 16;
  const int kHd = dtype == DType::kQ8_0 || dtype == DType::kBF16 ? 32 : 16, kQd = kHeads * kHd, kKvd = kKvHeads * kHd;
  const AttentionShape s{.n_heads = kHeads, .n_kv_heads = kKvHeads, .head_dim = kHd, .scale = 0.25f};
  const double tol = AttentionTolerance(s, dtype, nq);
  const std::string what = absl::StrCat(std::string(DTypeName(dtype)), " nq=", nq, " nkv=", nkv, " recent=", recent);
  auto q = Randn(nq * kQd, 21), k = Randn(nkv * kKvd, 22), v = Randn(nkv * kKvd, 23);
  const std::vector<uint8_t> kh = AsKv(dtype, &k), vh = AsKv(dtype, &v);
  AsQueries(s, dtype, nq, &q);
  std::vector<int32_t> kv_pos(nkv), q_pos(nq);
  std::iota(kv_pos.begin(), kv_pos.end(), 0);
  for (int64_t i = 0; i < nq; ++i) q_pos[i] = static_cast<int32_t>(nkv - nq + i);
  const int64_t n_blocks = (nkv + kBlock - 1) / kBlock;
  std::vector<const void*> kp(n_blocks), vp(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    kp[b] = KvAt(kh, dtype, b * kBlock * kKvd);
    vp[b] = KvAt(vh, dtype, b * kBlock * kKvd);
  }
  const KvRows kv{.k_blocks = kp.data(),
                  .v_blocks = vp.data(),
                  .block_rows = kBlock,
                  .positions = kv_pos.data(),
                  .n = nkv,
                  .stride = kKvd,
                  .positions_ascending = true,
                  .dtype = dtype};
  struct Part {
    std::vector<float> out, lse;
  };
  auto run = [&](PositionWindow::Part part, const KvRows& view) {
    Part r{std::vector<float>(nq * kQd), std::vector<float>(nq * kHeads)};
    Attention(s, view,
              AttentionArgs{.q = q.data(),
                            .q_pos = q_pos.data(),
                            .n_q = nq,
                            .q_stride = kQd,
                            .out = r.out.data(),
                            .out_stride = kQd,
                            .lse = r.lse.data(),
                            .lse_stride = kHeads,
                            .window = {.part = part, .sinks = 4, .recent = recent}},
              pool);
    return r;
  };
  const Part all = run(PositionWindow::Part::kAll, kv), prox = run(PositionWindow::Part::kProximal, kv),
             dist = run(PositionWindow::Part::kDistant, kv);
  for (auto [part, got] : {std::pair{PositionWindow::Part::kProximal, &prox},
                           {PositionWindow::Part::kDistant, &dist},
                           {PositionWindow::Part::kAll, &all}}) {
    const PositionWindow w{.part = part, .sinks = 4, .recent = recent};
    auto sees = [&](int64_t i, int, int64_t j) { return w.Sees(kv_pos[j], q_pos[i]); };
    std::vector<double> probs, logits;
    EXPECT_LT(MaxRelErr(got->out, NaiveAttention(s, q, k, v, nq, nkv, sees, &probs, &logits)), tol) << what;
    std::vector<double> want_lse(nq * kHeads);
    for (int64_t i = 0; i < nq; ++i) {
      for (int h = 0; h < kHeads; ++h) {
        const int kvh = h / (kHeads / kKvHeads);
        double m = -1e300, sum = 0;
        std::vector<double> sc;
        for (int64_t j = 0; j < nkv; ++j) {
          if (!sees(i, kvh, j)) continue;
          double d = 0;
          for (int e = 0; e < kHd; ++e) d += double(q[i * kQd + h * kHd + e]) * k[j * kKvd + kvh * kHd + e];
          sc.push_back(d * s.scale);
          m = std::max(m, sc.back());
        }
        for (double x : sc) sum += std::exp(x - m);
        want_lse[i * kHeads + h] = m + std::log(sum);
      }
    }
    for (size_t x = 0; x < want_lse.size(); ++x) EXPECT_NEAR(got->lse[x], want_lse[x], 1e-4) << what;
  }
  // The gate g = 1 / (1 + exp(lse_D - lse_P)) merges the parts into the whole.
  std::vector<double> merged(nq * kQd);
  for (int64_t i = 0; i < nq; ++i) {
    for (int h = 0; h < kHeads; ++h) {
      const double lp = prox.lse[i * kHeads + h], ld = dist.lse[i * kHeads + h];
      const double g = 1.0 / (1.0 + std::exp(ld - lp));
      EXPECT_NEAR(all.lse[i * kHeads + h], std::max(lp, ld) + std::log1p(std::exp(-std::fabs(lp - ld))), 1e-4);
      for (int e = 0; e < kHd; ++e) {
        const int64_t x = i * kQd + h * kHd + e;
        merged[x] = g * prox.out[x] + (1 - g) * dist.out[x];
      }
    }
  }
  EXPECT_LT(MaxRelErr(all.out, merged), tol) << what;
  // KV head 1 alone: its two query heads, the blocks offset to the head.
  std::vector<const void*> kp1(n_blocks), vp1(n_blocks);
  const size_t head_bytes = RowBytes(dtype, kHd);
  for (int64_t b = 0; b < n_blocks; ++b) {
    kp1[b] = static_cast<const uint8_t*>(kp[b]) + head_bytes;
    vp1[b] = static_cast<const uint8_t*>(vp[b]) + head_bytes;
  }
  KvRows head1 = kv;
  head1.k_blocks = kp1.data();
  head1.v_blocks = vp1.data();
  std::vector<float> out1(nq * kQd, 0.0f);
  Attention(AttentionShape{.n_heads = 2, .n_kv_heads = 1, .head_dim = kHd, .scale = s.scale}, head1,
            AttentionArgs{.q = q.data() + 2 * kHd,
                          .q_pos = q_pos.data(),
                          .n_q = nq,
                          .q_stride = kQd,
                          .out = out1.data() + 2 * kHd,
                          .out_stride = kQd},
            pool);
  // Alone or beside another, a single row's keys split among the threads alike (each
  // split takes every KV head of the view), so the head's output is the same.
  std::vector<float> got1;
  std::vector<double> want1;
  for (int64_t i = 0; i < nq; ++i) {
    for (int e = 0; e < 2 * kHd; ++e) {
      got1.push_back(out1[i * kQd + 2 * kHd + e]);
      want1.push_back(all.out[i * kQd + 2 * kHd + e]);
    }
  }
  EXPECT_LT(MaxRelErr(got1, want1), 1e-5) << what;
  // The KV cache's layout: each head in blocks of its own (pointers head-major),
  // the same results; in the proximal window the key blocks distant to every query
  // (dropped by PoD) are never read: null here.
  std::vector<std::vector<uint8_t>> k_heads(kKvHeads), v_heads(kKvHeads);
  std::vector<const void*> ks(kKvHeads * n_blocks), vs(kKvHeads * n_blocks), ks_dropped;
  for (int h = 0; h < kKvHeads; ++h) {
    k_heads[h].resize(nkv * head_bytes);
    v_heads[h].resize(nkv * head_bytes);
    for (int64_t j = 0; j < nkv; ++j) {
      std::memcpy(k_heads[h].data() + j * head_bytes, kv.k(j, h * kHd), head_bytes);
      std::memcpy(v_heads[h].data() + j * head_bytes, kv.v(j, h * kHd), head_bytes);
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
      ks[h * n_blocks + b] = k_heads[h].data() + b * kBlock * head_bytes;
      vs[h * n_blocks + b] = v_heads[h].data() + b * kBlock * head_bytes;
    }
  }
  ks_dropped = ks;
  int64_t dropped = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t last = std::min(nkv, (b + 1) * kBlock) - 1;
    if (kv_pos[b * kBlock] >= 4 && kv_pos[last] <= q_pos[0] - recent) {
      for (int h = 0; h < kKvHeads; ++h) ks_dropped[h * n_blocks + b] = nullptr;
      ++dropped;
    }
  }
  if (q_pos[0] - recent >= 2 * kBlock) {
    EXPECT_GT(dropped, 0) << what;
  }
  KvRows split = kv;
  split.stride = kHd;
  split.head_cols = kHd;
  split.head_blocks = n_blocks;
  split.k_blocks = ks.data();
  split.v_blocks = vs.data();
  KvRows split_dropped = split;
  split_dropped.k_blocks = ks_dropped.data();
  for (auto [part, view, want] : {std::tuple{PositionWindow::Part::kAll, &split, &all},
                                  {PositionWindow::Part::kProximal, &split_dropped, &prox}}) {
    const Part r = run(part, *view);
    EXPECT_LT(MaxRelErr(r.out, std::vector<double>(want->out.begin(), want->out.end())), 1e-6)
        << what << " heads in blocks of their own";
    for (size_t x = 0; x < r.lse.size(); ++x) EXPECT_NEAR(r.lse[x], want->lse[x], 1e-5) << what;
  }
}

// At every ISA level the machine has; windows of 10 recent keys, and of 600 (with 700
// and 1200 keys, 256-key tiles wholly inside one part: the unmasked path).
TEST(Attention, WindowPartsAndLogSumExpMergeToTheWhole) {
  ThreadPool pool(2);
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      for (auto [nq, nkv, recent] : {std::tuple<int64_t, int64_t, int32_t>{1, 3000, 10},
                                     {1, 60, 10},
                                     {5, 60, 10},
                                     {40, 60, 10},
                                     {40, 200, 10},
                                     {40, 700, 10},
                                     {70, 1200, 600}}) {
        CheckWindowParts(pool, dtype, nq, nkv, recent);
      }
    }
  }
}

// The tiled online-softmax kernel at awkward sizes against the direct computation:
// 1, 17, 511 and 4097 keys (several key tiles, partial tiles), 1, 17 and 64 query
// rows (one or several query tiles), head size 64 (the AVX2 group loops) and 24,
// GQA 4:1 and, for one query row (the grouped decode loops, which take the heads
// three or four at a time), 7:1 as Qwen2.5-0.5B's; F32/F16/BF16/Q8_0 rows (Q8_0 at head
// size 64 only: it takes whole blocks of 32), positions with
// gaps (as left by pruning) in pages of 16, with and without a selection that drops
// every third block of 16 rows.
TEST(Attention, TiledKernelMatchesNaiveAtAwkwardSizes) {
  ThreadPool pool(2);
  for (int hd : {64, 24})
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0})
      for (int64_t nkv : {1, 17, 511, 4097})
        for (int64_t nq : {1, 17, 64})
          for (bool with_selection : {false, true})
            for (int kHeads : {8, 14}) {
              if (nq > nkv || (hd == 24 && nkv == 4097 && dtype != DType::kF32)) continue;
              if (hd % 32 != 0 && dtype == DType::kQ8_0) continue;
              if (kHeads == 14 && nq > 1) continue;
              constexpr int kKvHeads = 2, kBlock = 16;
              const int qd = kHeads * hd, kvd = kKvHeads * hd;
              const AttentionShape s{.n_heads = kHeads, .n_kv_heads = kKvHeads, .head_dim = hd, .scale = 0.125f};
              auto q = Randn(nq * qd, 21), k = Randn(nkv * kvd, 22), v = Randn(nkv * kvd, 23);
              const std::vector<uint8_t> kh = AsKv(dtype, &k), vh = AsKv(dtype, &v);
              AsQueries(s, dtype, nq, &q);
              std::vector<int32_t> kv_pos(nkv), q_pos(nq);
              for (int64_t j = 0, p = 0; j < nkv; ++j) kv_pos[j] = static_cast<int32_t>(p += 1 + (j * 13) % 3);
              for (int64_t i = 0; i < nq; ++i) q_pos[i] = kv_pos[nkv - nq + i];  // the last rows are the queries
              std::vector<KvRange> ranges;
              for (int32_t b = 0; b * kBlock < nkv; ++b) {
                if (with_selection && b % 3 == 1 && (b + 1) * kBlock < nkv) continue;
                ranges.push_back({b * kBlock, static_cast<int32_t>(std::min<int64_t>(nkv, (b + 1) * kBlock))});
              }
              KvSelection sel;
              sel.segments.push_back({.q_begin = 0, .q_end = static_cast<int32_t>(nq), .ranges = ranges});
              auto selected = [&](int64_t j) {
                for (const KvRange& r : ranges) {
                  if (j >= r.begin && j < r.end) return true;
                }
                return false;
              };
              std::vector<const void*> kp, vp;
              for (int64_t b = 0; b * kBlock < nkv; ++b) {
                kp.push_back(KvAt(kh, dtype, b * kBlock * kvd));
                vp.push_back(KvAt(vh, dtype, b * kBlock * kvd));
              }
              std::vector<float> out(nq * qd), probs(nkv);
              Attention(s,
                        KvRows{.k_blocks = kp.data(),
                               .v_blocks = vp.data(),
                               .block_rows = kBlock,
                               .positions = kv_pos.data(),
                               .n = nkv,
                               .stride = kvd,
                               .positions_ascending = true,
                               .dtype = dtype},
                        AttentionArgs{.q = q.data(),
                                      .q_pos = q_pos.data(),
                                      .n_q = nq,
                                      .q_stride = qd,
                                      .out = out.data(),
                                      .out_stride = qd,
                                      .selection = with_selection ? &sel : nullptr,
                                      .last_query_probs = probs.data()},
                        pool);
              std::vector<double> want_probs, want_logits;
              const std::vector<double> want = NaiveAttention(
                  s, q, k, v, nq, nkv,
                  [&](int64_t i, int, int64_t j) { return (!with_selection || selected(j)) && kv_pos[j] <= q_pos[i]; },
                  &want_probs, &want_logits);
              const std::string what = absl::StrCat(std::string(DTypeName(dtype)), " hd=", hd, " heads=", kHeads,
                                                    " keys=", nkv, " queries=", nq, with_selection ? " selection" : "");
              const double tol = AttentionTolerance(s, dtype, nq);
              EXPECT_LT(MaxRelErr(out, want), tol) << what;
              EXPECT_LT(MaxRelErr(probs, want_probs), tol) << what;
            }
}

// A decode batch's attentions in one call (Attentions: the short single rows share a
// parallel region, a call to a thread) equal call-by-call Attention bit for bit: single
// rows over few keys, over enough keys to split, a row with the last query's statistics,
// and a segment of several rows among them; every KV type, every CPU level.
TEST(Attention, AttentionsOfABatchEqualCallByCall) {
  ThreadPool pool(4);
  constexpr int kHeads = 6, kKvHeads = 2;
  // Many short calls, so that every thread of the pool takes some.
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {1, 17}, {1, 300}, {1, 511}, {1, 900}, {5, 64}};
  for (int64_t i = 0; i < 40; ++i) shapes.push_back({1, 2 + 12 * i});
  testing::AtEveryCpuLevel([&] {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      const int hd = TestHeadDim(dtype), qd = kHeads * hd, kvd = kKvHeads * hd;
      const AttentionShape s{.n_heads = kHeads, .n_kv_heads = kKvHeads, .head_dim = hd, .scale = 0.2f};
      struct Seq {
        std::vector<float> q, out, probs;
        std::vector<uint8_t> k, v;
        std::vector<const void*> kp, vp;
        std::vector<int32_t> kv_pos, q_pos;
      };
      std::vector<Seq> seqs(shapes.size());
      std::vector<AttentionCall> calls;
      for (size_t c = 0; c < shapes.size(); ++c) {
        const auto [nq, nkv] = shapes[c];
        Seq& q = seqs[c];
        q.q = Randn(nq * qd, static_cast<uint32_t>(10 + c));
        std::vector<float> k = Randn(nkv * kvd, static_cast<uint32_t>(40 + c)), v = Randn(nkv * kvd, 70 + c);
        q.k = AsKv(dtype, &k);
        q.v = AsKv(dtype, &v);
        constexpr int64_t kBlock = 16;
        for (int64_t b = 0; b * kBlock < nkv; ++b) {
          q.kp.push_back(KvAt(q.k, dtype, b * kBlock * kvd));
          q.vp.push_back(KvAt(q.v, dtype, b * kBlock * kvd));
        }
        q.kv_pos.resize(nkv);
        std::iota(q.kv_pos.begin(), q.kv_pos.end(), 0);
        for (int64_t i = 0; i < nq; ++i) q.q_pos.push_back(static_cast<int32_t>(nkv - nq + i));
        q.probs.resize(nkv);
        calls.push_back({.kv = KvRows{.k_blocks = q.kp.data(),
                                      .v_blocks = q.vp.data(),
                                      .block_rows = kBlock,
                                      .positions = q.kv_pos.data(),
                                      .n = nkv,
                                      .stride = kvd,
                                      .positions_ascending = true,
                                      .dtype = dtype},
                         .args = AttentionArgs{.q = q.q.data(),
                                               .q_pos = q.q_pos.data(),
                                               .n_q = nq,
                                               .q_stride = qd,
                                               .out_stride = qd,
                                               .last_query_probs = c == 2 ? q.probs.data() : nullptr}});
      }
      std::vector<std::vector<float>> one_by_one(shapes.size()), batched(shapes.size());
      for (size_t c = 0; c < shapes.size(); ++c) {
        one_by_one[c].assign(shapes[c].first * qd, 0.0f);
        calls[c].args.out = one_by_one[c].data();
        Attention(s, calls[c].kv, calls[c].args, pool);
      }
      const std::vector<float> probs_one = seqs[2].probs;
      for (size_t c = 0; c < shapes.size(); ++c) {
        batched[c].assign(shapes[c].first * qd, -1.0f);
        calls[c].args.out = batched[c].data();
      }
      std::fill(seqs[2].probs.begin(), seqs[2].probs.end(), -1.0f);
      Attentions(s, calls, pool);
      for (size_t c = 0; c < shapes.size(); ++c) {
        EXPECT_EQ(batched[c], one_by_one[c]) << DTypeName(dtype) << " call " << c;
      }
      EXPECT_EQ(seqs[2].probs, probs_one) << DTypeName(dtype);
    }
  });
}

}  // namespace
}  // namespace ps
