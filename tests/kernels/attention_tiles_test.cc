// The AVX-512 BF16 tile kernels of prefill attention and the decode kernels against
// sums in doubles of the same rounded values. Skips on a CPU without AVX-512 BF16.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/attention_avx512_q8.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant.h"
#include "kernels/shared_math.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::Randn;

// The BF16 tile kernels of prefill attention (key-major: scores and outputs transposed)
// against sums in doubles of the same BF16 values (queries rounded to BF16): key rows
// read from anywhere in memory, ragged key counts (the weights' and packed values' zero
// padding) and query rows (every vector count, padded rows), head sizes of one and several
// value passes; each window part's mask against WindowSees; the softmax step (in base 2)
// from rows that saw nothing, rows whose maximum grows and rows whose maximum stays; the
// outputs back to rows.
TEST(AttentionTiles, Bf16TilesEqualSumsOfTheRoundedValues) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 dot products";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  auto bf16 = [](const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = Fp32ToBf16(x[i]);
    return h;
  };
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int hd : {32, 64, 96, 128})
    for (int64_t nt : {1, 2, 31, 33, 256})
      for (int64_t nq : {1, 7, 16, 17, 40, 64}) {
        const std::string what = absl::StrCat("hd=", hd, " keys=", nt, " rows=", nq);
        const int64_t nqp = avx512_bf16::PaddedRows(nq), padded = avx512_bf16::PaddedKeys(nt), q_stride = hd + 8;
        const std::vector<float> qf = Randn(nq * q_stride, 31);
        std::vector<uint16_t> qt(hd * nqp, 0xFFFF);
        avx512_bf16::PackQueries(qf.data(), q_stride, nq, hd, qt.data());
        auto query = [&](int64_t i, int e) { return qt[2 * ((e / 2) * nqp + i) + e % 2]; };  // row i's value e
        for (int64_t i = 0; i < nqp; ++i) {
          for (int e = 0; e < hd; ++e) {
            ASSERT_EQ(query(i, e), i < nq ? Fp32ToBf16(qf[i * q_stride + e]) : 0) << what << " row " << i << "," << e;
          }
        }
        std::vector<std::vector<uint16_t>> k_rows, v_rows;  // each row an allocation of its own
        std::vector<const uint16_t*> kp, vp;
        for (int64_t j = 0; j < nt; ++j) {
          k_rows.push_back(bf16(Randn(hd, 100 + j)));
          v_rows.push_back(bf16(Randn(hd, 1000 + j)));
        }
        for (int64_t j = 0; j < nt; ++j) {
          kp.push_back(k_rows[j].data());
          vp.push_back(v_rows[j].data());
        }
        std::vector<float> s(nt * nqp), row_max(nqp);
        avx512_bf16::Scores(qt.data(), nqp, kp.data(), nt, hd, 0.3f, s.data(), row_max.data());
        for (int64_t i = 0; i < nqp; ++i) {
          double most = -1e300;
          for (int64_t j = 0; j < nt; ++j) {
            double want = 0;
            for (int e = 0; e < hd; ++e) want += double{Bf16ToFp32(query(i, e))} * Bf16ToFp32(k_rows[j][e]);
            want *= 0.3;
            most = std::max(most, double{s[j * nqp + i]});
            ASSERT_NEAR(s[j * nqp + i], want, 1e-5 * (1 + std::fabs(want))) << what << " score " << i << "," << j;
          }
          ASSERT_EQ(row_max[i], most) << what << " row " << i;
        }
        // Positions: keys 10, 13, 16, ...; rows from 5 on, 2 apart (some see no key).
        std::vector<int32_t> key_pos(nt), q_pos(nqp);
        for (int64_t j = 0; j < nt; ++j) key_pos[j] = static_cast<int32_t>(10 + 3 * j);
        for (int64_t i = 0; i < nqp; ++i) q_pos[i] = static_cast<int32_t>(5 + 2 * i + (i % 3 == 0 ? nt : 0));
        for (int window_part : {0, 1, 2}) {
          std::vector<float> masked = s, masked_max(nqp);
          avx512_bf16::Mask(window_part, 14, 20, key_pos.data(), nt, q_pos.data(), nqp, masked.data(),
                            masked_max.data());
          for (int64_t i = 0; i < nqp; ++i) {
            float most = neg_inf;
            for (int64_t j = 0; j < nt; ++j) {
              const bool sees = WindowSees(window_part, 14, 20, key_pos[j], q_pos[i]);
              ASSERT_EQ(masked[j * nqp + i], sees ? s[j * nqp + i] : neg_inf)
                  << what << " part " << window_part << " " << i << "," << j;
              most = std::max(most, masked[j * nqp + i]);
            }
            ASSERT_EQ(masked_max[i], most) << what << " part " << window_part << " row " << i;
          }
          if (window_part != 0) continue;
          // The softmax step in base 2, over the causal mask and (the finite variant) over
          // every score. Rows start with no key seen (m = -inf), a maximum above the tile's
          // or one below it.
          for (const bool finite : {false, true}) {
            const std::vector<float>& sc = finite ? s : masked;
            const std::vector<float>& sc_max = finite ? row_max : masked_max;
            std::vector<float> m(nqp), l(nqp), corr(nqp, 12345.0f);
            for (int64_t i = 0; i < nqp; ++i) {
              m[i] = i % 3 == 1 ? neg_inf : sc_max[i] + (i % 3 == 0 ? 0.7f : -0.9f);
              l[i] = m[i] == neg_inf ? 0.0f : 1.5f + static_cast<float>(i);
            }
            const std::vector<float> m0 = m, l0 = l;
            std::vector<uint16_t> w(padded * nqp, 0xFFFF);
            avx512_bf16::Softmax(sc.data(), nqp, nt, sc_max.data(), finite, m.data(), l.data(), corr.data(), w.data());
            for (int64_t i = 0; i < nqp; ++i) {
              const float m_new = std::max(m0[i], sc_max[i]);
              ASSERT_EQ(m[i], m_new) << what << " row " << i;
              double sum = 0;
              for (int64_t j = 0; j < padded; ++j) {
                const double e = j < nt && m_new != neg_inf ? std::exp2(double{sc[j * nqp + i]} - m_new) : 0.0;
                const float got = Bf16ToFp32(w[2 * ((j / 2) * nqp + i) + j % 2]);
                ASSERT_NEAR(got, e, e * 4e-3 + 1e-30) << what << " finite " << finite << " weight " << i << "," << j;
                sum += e;
              }
              const double c = m0[i] == neg_inf ? 0.0 : std::exp2(double{m0[i]} - m_new);
              ASSERT_NEAR(corr[i], c, 1e-6 * c) << what << " row " << i;
              // The weights' 2^x to 1e-4 (a twentieth of their BF16 rounding), the sum as well.
              ASSERT_NEAR(l[i], l0[i] * c + sum, 1.5e-4 * (l0[i] * c + sum)) << what << " row " << i;
            }
          }
        }
        std::vector<uint16_t> values(padded * hd);
        avx512_bf16::PackValues(vp.data(), nt, hd, values.data());
        std::vector<uint16_t> p = bf16(Randn(padded * nqp, 32));  // weights, keys paired
        for (int64_t j = nt; j < padded; ++j) {
          for (int64_t i = 0; i < nqp; ++i) p[2 * ((j / 2) * nqp + i) + j % 2] = 0;
        }
        const std::vector<float> corr = Randn(nqp, 35), ot0 = Randn(hd * nqp, 33);
        std::vector<float> ot = ot0;
        avx512_bf16::AddValues(p.data(), nqp, values.data(), nt, hd, corr.data(), ot.data());
        for (int64_t i = 0; i < nqp; ++i) {
          for (int e = 0; e < hd; ++e) {
            double want = double{ot0[e * nqp + i]} * corr[i], norm = std::fabs(want);
            for (int64_t j = 0; j < nt; ++j) {
              const double t = double{Bf16ToFp32(p[2 * ((j / 2) * nqp + i) + j % 2])} * Bf16ToFp32(v_rows[j][e]);
              want += t;
              norm += std::fabs(t);
            }
            ASSERT_NEAR(ot[e * nqp + i], want, 1e-6 * (1 + norm)) << what << " output " << i << "," << e;
          }
        }
        // Back to rows, out_stride apart: rows past nq and the columns between rows untouched.
        const int64_t out_stride = hd + 5;
        std::vector<float> rows(nqp * out_stride, 7.0f);
        avx512_bf16::UnpackOutputs(ot.data(), nqp, nq, hd, rows.data(), out_stride);
        for (int64_t i = 0; i < nqp; ++i) {
          for (int64_t e = 0; e < out_stride; ++e) {
            ASSERT_EQ(rows[i * out_stride + e], i < nq && e < hd ? ot[e * nqp + i] : 7.0f)
                << what << " unpacked " << i << "," << e;
          }
        }
      }
}

// The Q8_0 tiles' own steps against sums in doubles of the same quants: the queries
// quantised per row and block (a row of zeros among them), the keys' block terms, the scores of keys
// read from anywhere in memory at ragged counts (every pass shape and tail) and query rows
// (every vector count, padded rows), head sizes of one to four blocks and eight; the values packed by
// 4 keys with their scales as gains, the softmax step's byte weights (over every score
// and over a causal mask) and the value products. (The mask and the outputs' unpacking are
// the BF16 tiles' above.)
TEST(AttentionTiles, Q8TilesEqualSumsOfTheQuants) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  constexpr int kBlock = avx512_q8::kQ8Values;
  for (int hd : {32, 64, 96, 128, 256})
    for (int64_t nt : {1, 5, 6, 7, 13, 256})
      for (int64_t nq : {1, 7, 16, 17, 40, 64}) {
        const std::string what = absl::StrCat("hd=", hd, " keys=", nt, " rows=", nq);
        const int64_t nqp = avx512_bf16::PaddedRows(nq), q_stride = hd + 8;
        std::vector<float> qf = Randn(nq * q_stride, 41);
        if (nq > 3) std::fill(qf.begin() + 3 * q_stride, qf.begin() + 3 * q_stride + hd, 0.0f);
        const int nb = hd / kBlock;
        std::vector<uint8_t> qt(hd * nqp, 0xAB);
        std::vector<float> qscale(nb * nqp, 7.0f);
        avx512_q8::PackQueries(qf.data(), q_stride, nq, hd, 0.3f, qt.data(), qscale.data());
        auto quant = [&](int64_t i, int e) {  // row i's value e
          return int{qt[4 * ((e / 4) * nqp + i) + e % 4]} - 128;
        };
        for (int64_t i = 0; i < nqp; ++i) {
          for (int b = 0; b < nb; ++b) {
            const float* x = i < nq ? qf.data() + i * q_stride + b * kBlock : nullptr;
            float amax = 0;
            for (int e = 0; i < nq && e < kBlock; ++e) amax = std::max(amax, std::fabs(x[e]));
            const float d = amax / 127.0f, inverse = d > 0 ? 1.0f / d : 0.0f;
            ASSERT_EQ(qscale[b * nqp + i], d * 0.3f) << what << " row " << i << " block " << b;
            for (int e = 0; e < kBlock; ++e) {
              const int want = i < nq ? static_cast<int>(std::nearbyint(x[e] * inverse)) : 0;
              ASSERT_EQ(quant(i, b * kBlock + e), want) << what << " row " << i << "," << b * kBlock + e;
            }
          }
        }
        std::vector<std::vector<BlockQ8_0>> k_rows, v_rows;  // each row an allocation of its own
        std::vector<const uint8_t*> kp, vp;
        for (int64_t j = 0; j < nt; ++j) {
          k_rows.emplace_back(hd / kBlock);
          v_rows.emplace_back(hd / kBlock);
          QuantizeRowQ8_0(Randn(hd, 200 + j).data(), k_rows.back().data(), hd);
          QuantizeRowQ8_0(Randn(hd, 2000 + j).data(), v_rows.back().data(), hd);
        }
        for (int64_t j = 0; j < nt; ++j) {
          kp.push_back(reinterpret_cast<const uint8_t*>(k_rows[j].data()));
          vp.push_back(reinterpret_cast<const uint8_t*>(v_rows[j].data()));
        }
        std::vector<int32_t> offsets(nt * nb);
        std::vector<float> scales(nt * nb);
        avx512_q8::KeyTerms(kp.data(), nt, hd, offsets.data(), scales.data());
        for (int64_t j = 0; j < nt; ++j) {
          for (int b = 0; b < nb; ++b) {
            int sum = 0;
            for (int8_t x : k_rows[j][b].qs) sum += x;
            ASSERT_EQ(offsets[j * nb + b], -128 * sum) << what << " key " << j << " block " << b;
            ASSERT_EQ(scales[j * nb + b], Fp16ToFp32(k_rows[j][b].d)) << what << " key " << j << " block " << b;
          }
        }
        std::vector<float> s(nt * nqp), row_max(nqp);
        avx512_q8::Scores(qt.data(), qscale.data(), nqp, kp.data(), offsets.data(), scales.data(), nt, hd, s.data(),
                          row_max.data());
        for (int64_t i = 0; i < nqp; ++i) {
          float most = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j < nt; ++j) {
            double want = 0, norm = 0;
            for (int b = 0; b < nb; ++b) {
              int64_t dot = 0;
              for (int e = 0; e < kBlock; ++e) dot += quant(i, b * kBlock + e) * k_rows[j][b].qs[e];
              const double t = double{qscale[b * nqp + i]} * Fp16ToFp32(k_rows[j][b].d) * static_cast<double>(dot);
              want += t;
              norm += std::fabs(t);
            }
            ASSERT_NEAR(s[j * nqp + i], want, 1e-6 * (1e-3 + norm)) << what << " score " << i << "," << j;
            most = std::max(most, s[j * nqp + i]);
          }
          ASSERT_EQ(row_max[i], most) << what << " row " << i;
        }
        // The values: quants by 4 keys, block scales as gains of the tile's largest.
        const int64_t padded = avx512_bf16::PaddedKeys(nt), groups = padded / avx512_q8::kKeyQuad;
        std::vector<int8_t> values(padded * hd, 99);
        std::vector<float> gains(padded * nb, -1.0f), top(nb, -1.0f);
        avx512_q8::PackValues(vp.data(), nt, hd, values.data(), gains.data(), top.data());
        for (int b = 0; b < nb; ++b) {
          float most = 0;
          for (int64_t j = 0; j < nt; ++j) most = std::max(most, Fp16ToFp32(v_rows[j][b].d));
          ASSERT_EQ(top[b], most) << what << " block " << b;
          for (int64_t j = 0; j < padded; ++j) {
            const float want = j < nt ? 255.0f / most * Fp16ToFp32(v_rows[j][b].d) : 0.0f;
            ASSERT_NEAR(gains[j * nb + b], want, 1e-5f * want) << what << " gain " << j << "," << b;
          }
        }
        for (int64_t j = 0; j < padded; ++j) {
          for (int e = 0; e < hd; ++e) {
            const int want = j < nt ? v_rows[j][e / kBlock].qs[e % kBlock] : 0;
            ASSERT_EQ(values[4 * ((j / 4) * hd + e) + j % 4], want) << what << " value " << j << "," << e;
          }
        }
        // The softmax step's byte weights, over every score and over a causal mask (rows
        // from 5 on, 2 apart, some seeing no key), from rows that saw nothing, rows whose
        // maximum grows and rows whose maximum stays.
        std::vector<int32_t> key_pos(nt), q_pos(nqp);
        for (int64_t j = 0; j < nt; ++j) key_pos[j] = static_cast<int32_t>(10 + 3 * j);
        for (int64_t i = 0; i < nqp; ++i) q_pos[i] = static_cast<int32_t>(5 + 2 * i + (i % 3 == 0 ? nt : 0));
        std::vector<float> masked = s, masked_max(nqp);
        avx512_bf16::Mask(0, 0, 0, key_pos.data(), nt, q_pos.data(), nqp, masked.data(), masked_max.data());
        const float neg_inf = -std::numeric_limits<float>::infinity();
        for (const bool finite : {false, true}) {
          const std::vector<float>& sc = finite ? s : masked;
          const std::vector<float>& sc_max = finite ? row_max : masked_max;
          std::vector<float> m(nqp), l(nqp), corr(nqp, 12345.0f), wscale(nb * nqp, 12345.0f);
          for (int64_t i = 0; i < nqp; ++i) {
            m[i] = i % 3 == 1 ? neg_inf : sc_max[i] + (i % 3 == 0 ? 0.7f : -0.9f);
            l[i] = m[i] == neg_inf ? 0.0f : 1.5f + static_cast<float>(i);
          }
          const std::vector<float> m0 = m, l0 = l;
          std::vector<uint8_t> w(nb * padded * nqp, 0xAB);
          avx512_q8::Softmax(sc.data(), nqp, nt, hd, sc_max.data(), finite, gains.data(), top.data(), m.data(),
                             l.data(), corr.data(), wscale.data(), w.data());
          for (int64_t i = 0; i < nqp; ++i) {
            const float m_new = std::max(m0[i], sc_max[i]);
            ASSERT_EQ(m[i], m_new) << what << " row " << i;
            const bool sees = sc_max[i] != neg_inf;
            const double scale = sees ? std::exp2(double{sc_max[i]} - m_new) : 0.0;
            double sum = 0;
            for (int64_t j = 0; j < padded; ++j) {
              const double f = j < nt && sees ? std::exp2(double{sc[j * nqp + i]} - sc_max[i]) : 0.0;
              sum += f;
              for (int b = 0; b < nb; ++b) {
                const double want = f * gains[j * nb + b];
                const int got = w[4 * ((b * groups + j / 4) * nqp + i) + j % 4];
                // 2^x to 1e-4: a weight within a rounding step and that.
                ASSERT_NEAR(got, want, 0.5 + 1e-4 * want)
                    << what << " finite " << finite << " weight " << i << "," << j << " block " << b;
              }
            }
            const double c = m0[i] == neg_inf ? 0.0 : std::exp2(double{m0[i]} - m_new);
            ASSERT_NEAR(corr[i], c, 1e-6 * c) << what << " row " << i;
            ASSERT_NEAR(l[i], l0[i] * c + scale * sum, 1.5e-4 * (l0[i] * c + scale * sum)) << what << " row " << i;
            for (int b = 0; b < nb; ++b) {
              const double want = scale * top[b] / 255.0;
              ASSERT_NEAR(wscale[b * nqp + i], want, 1e-6 * want) << what << " row " << i << " block " << b;
            }
          }
        }
        // The value products of any byte weights (the largest among them), outputs rescaled.
        std::vector<uint8_t> w(nb * padded * nqp);
        for (size_t x = 0; x < w.size(); ++x) w[x] = static_cast<uint8_t>(x % 7 == 0 ? 255 : (x * 37) % 256);
        for (int b = 0; b < nb; ++b) {  // zero weights past the last key, as Softmax leaves them
          for (int64_t j = nt; j < padded; ++j) {
            for (int64_t i = 0; i < nqp; ++i) w[4 * ((b * groups + j / 4) * nqp + i) + j % 4] = 0;
          }
        }
        const std::vector<float> corr = Randn(nqp, 45), ws = Randn(nb * nqp, 46), ot0 = Randn(hd * nqp, 47);
        std::vector<float> ot = ot0;
        avx512_q8::AddValues(w.data(), nqp, values.data(), nt, hd, corr.data(), ws.data(), ot.data());
        for (int64_t i = 0; i < nqp; ++i) {
          for (int e = 0; e < hd; ++e) {
            const int b = e / kBlock;
            int64_t dot = 0;
            for (int64_t j = 0; j < nt; ++j) {
              dot += int64_t{w[4 * ((b * groups + j / 4) * nqp + i) + j % 4]} * v_rows[j][b].qs[e % kBlock];
            }
            const double want = double{ot0[e * nqp + i]} * corr[i] + double{ws[b * nqp + i]} * static_cast<double>(dot);
            ASSERT_NEAR(ot[e * nqp + i], want,
                        1e-6 * (1 + std::fabs(want) + std::fabs(ws[b * nqp + i]) * 255 * 127 * nt))
                << what << " output " << i << "," << e;
          }
        }
      }
}

// The decode kernels (one query row over BF16 rows read in place, every head of a GQA
// group at once) against sums in doubles of the same rounded values (queries and weights
// rounded to BF16): every group size they take (each its own pass
// shape), head sizes of one to four 32-column chunks, runs of ragged lengths (the passes'
// tails) with rows further apart than a head, the scores' heads `out_step` apart and the
// outputs added to what was there. Prefetching past the last run reads `then`'s rows.
TEST(AttentionTiles, DecodeKernelsEqualSumsInDoubles) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  const std::vector<int64_t> lengths = {1, 2, 3, 5, 16, 7, 4};
  for (int g = 1; g <= avx512_bf16::kMaxDecodeHeads; ++g)
    for (int hd : {32, 64, 96, 128}) {
      const std::string what = absl::StrCat(g, " heads of ", hd);
      const int64_t stride = hd + 32;  // elements from a row to the next
      std::vector<std::vector<uint16_t>> k_store, v_store;
      std::vector<avx512_bf16::RowRun> k_runs, v_runs;
      std::vector<const uint16_t*> k_rows, v_rows;  // every row, numbered across the runs
      for (size_t u = 0; u < lengths.size(); ++u) {
        for (auto* store : {&k_store, &v_store}) {
          const std::vector<float> x =
              Randn(lengths[u] * stride, static_cast<uint32_t>(store == &k_store ? u : 50 + u));
          std::vector<uint16_t> h(x.size());
          for (size_t i = 0; i < x.size(); ++i) h[i] = Fp32ToBf16(x[i]);
          store->push_back(std::move(h));
        }
        k_runs.push_back({k_store.back().data(), lengths[u]});
        v_runs.push_back({v_store.back().data(), lengths[u]});
        for (int64_t r = 0; r < lengths[u]; ++r) {
          k_rows.push_back(k_store.back().data() + r * stride);
          v_rows.push_back(v_store.back().data() + r * stride);
        }
      }
      const auto n = static_cast<int64_t>(k_rows.size()), out_step = n + 3;
      const std::vector<float> q = Randn(g * hd, 60);
      std::vector<float> s(g * out_step, 12345.0f);
      avx512_bf16::DecodeScores(q.data(), g, k_runs.data(), std::ssize(k_runs), v_runs.data(), std::ssize(v_runs),
                                stride, hd, 0.3f, s.data(), out_step, /*ahead=*/20);
      const std::vector<float> p = Randn(g * out_step, 61);
      const std::vector<float> o0 = Randn(g * hd, 62);
      std::vector<float> o = o0;
      avx512_bf16::DecodeValues(p.data(), out_step, g, v_runs.data(), std::ssize(v_runs), stride, hd, o.data(),
                                /*ahead=*/20);
      for (int h = 0; h < g; ++h) {
        for (int64_t j = 0; j < out_step; ++j) {
          if (j >= n) {
            ASSERT_EQ(s[h * out_step + j], 12345.0f) << what << ": head " << h << " wrote past the rows";
            continue;
          }
          double want = 0, norm = 0;
          for (int e = 0; e < hd; ++e) {
            const double t = double{Bf16ToFp32(Fp32ToBf16(q[h * hd + e]))} * Bf16ToFp32(k_rows[j][e]);
            want += t;
            norm += std::fabs(t);
          }
          ASSERT_NEAR(s[h * out_step + j], 0.3 * want, 1e-6 * (1 + norm)) << what << ": score " << h << "," << j;
        }
        for (int e = 0; e < hd; ++e) {
          double want = o0[h * hd + e], norm = std::fabs(want);
          for (int64_t j = 0; j < n; ++j) {
            const double t = double{Bf16ToFp32(Fp32ToBf16(p[h * out_step + j]))} * Bf16ToFp32(v_rows[j][e]);
            want += t;
            norm += std::fabs(t);
          }
          ASSERT_NEAR(o[h * hd + e], want, 1e-6 * (1 + norm)) << what << ": output " << h << "," << e;
        }
      }
    }
}

// The Q8_0 decode kernels (one query row over Q8_0 rows read in place, every head of a GQA
// group at once) against sums in doubles of the same quants (the query quantised block by
// block as PackQueries does, the weights times the rows' block scales rounded to BF16): every group
// size, head sizes of one to eight blocks (odd counts: a lone block's transposes), runs of
// ragged lengths with rows further apart than a head, more rows than a call of the value
// kernels takes at once (2,048), the scores' heads `out_step` apart and the outputs added to
// what was there.
TEST(AttentionTiles, Q8DecodeKernelsEqualSumsOfTheQuants) {
  const std::vector<CpuIsa> levels = SupportedCpuIsas();
  if (std::find(levels.begin(), levels.end(), CpuIsa::kAvx512Bf16) == levels.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  }
  ScopedCpuIsa level(CpuIsa::kAvx512Bf16);
  constexpr int kBlock = avx512_q8::kQ8Values;
  for (int g = 1; g <= avx512_bf16::kMaxDecodeHeads; ++g)
    for (int hd : {32, 64, 96, 256}) {
      const std::string what = absl::StrCat(g, " heads of ", hd);
      const int nb = hd / kBlock;
      const int64_t stride = (nb + 1) * avx512_q8::kQ8BlockBytes;  // bytes from a row to the next
      const std::vector<int64_t> lengths = {1, 2, 3, 5, 16, 7, hd == 64 ? 2053 : 4};
      std::vector<std::vector<uint8_t>> k_store, v_store;
      std::vector<avx512_q8::ByteRun> k_runs, v_runs;
      std::vector<const BlockQ8_0*> k_rows, v_rows;  // every row, numbered across the runs
      for (size_t u = 0; u < lengths.size(); ++u) {
        for (auto* store : {&k_store, &v_store}) {
          std::vector<uint8_t> bytes(lengths[u] * stride, 0xCD);
          for (int64_t r = 0; r < lengths[u]; ++r) {
            const std::vector<float> x = Randn(hd, static_cast<uint32_t>((store == &k_store ? 0 : 5000) + 100 * u + r));
            std::vector<BlockQ8_0> blocks(nb);
            QuantizeRowQ8_0(x.data(), blocks.data(), hd);
            std::memcpy(bytes.data() + r * stride, blocks.data(), nb * sizeof(BlockQ8_0));
          }
          store->push_back(std::move(bytes));
        }
        k_runs.push_back({k_store.back().data(), lengths[u]});
        v_runs.push_back({v_store.back().data(), lengths[u]});
        for (int64_t r = 0; r < lengths[u]; ++r) {
          k_rows.push_back(reinterpret_cast<const BlockQ8_0*>(k_store.back().data() + r * stride));
          v_rows.push_back(reinterpret_cast<const BlockQ8_0*>(v_store.back().data() + r * stride));
        }
      }
      const auto n = static_cast<int64_t>(k_rows.size()), out_step = n + 3;
      const std::vector<float> q = Randn(g * hd, 70);
      std::vector<float> s(g * out_step, 12345.0f);
      avx512_q8::DecodeScores(q.data(), g, k_runs.data(), std::ssize(k_runs), v_runs.data(), std::ssize(v_runs), stride,
                              hd, 0.3f, s.data(), out_step, /*ahead=*/20);
      const std::vector<float> p = Randn(g * out_step, 71);
      const std::vector<float> o0 = Randn(g * hd, 72);
      std::vector<float> o = o0;
      avx512_q8::DecodeValues(p.data(), out_step, g, v_runs.data(), std::ssize(v_runs), stride, hd, o.data(),
                              /*ahead=*/20);
      for (int h = 0; h < g; ++h) {
        std::vector<int> quants(hd);
        std::vector<float> dq(nb);
        for (int b = 0; b < nb; ++b) {
          const float* x = q.data() + h * hd + b * kBlock;
          float amax = 0;
          for (int e = 0; e < kBlock; ++e) amax = std::max(amax, std::fabs(x[e]));
          dq[b] = amax / 127.0f;
          const float inverse = dq[b] > 0 ? 1.0f / dq[b] : 0.0f;
          for (int e = 0; e < kBlock; ++e) quants[b * kBlock + e] = static_cast<int>(std::nearbyint(x[e] * inverse));
        }
        for (int64_t j = 0; j < out_step; ++j) {
          if (j >= n) {
            ASSERT_EQ(s[h * out_step + j], 12345.0f) << what << ": head " << h << " wrote past the rows";
            continue;
          }
          double want = 0, norm = 0;
          for (int b = 0; b < nb; ++b) {
            int64_t dot = 0;
            for (int e = 0; e < kBlock; ++e) dot += quants[b * kBlock + e] * k_rows[j][b].qs[e];
            const double t = 0.3 * dq[b] * Fp16ToFp32(k_rows[j][b].d) * static_cast<double>(dot);
            want += t;
            norm += std::fabs(t);
          }
          ASSERT_NEAR(s[h * out_step + j], want, 1e-6 * (1e-3 + norm)) << what << ": score " << h << "," << j;
        }
        for (int e = 0; e < hd; ++e) {
          double want = o0[h * hd + e], norm = std::fabs(want);
          for (int64_t j = 0; j < n; ++j) {
            const BlockQ8_0& blk = v_rows[j][e / kBlock];
            const double w = Bf16ToFp32(Fp32ToBf16(p[h * out_step + j] * Fp16ToFp32(blk.d)));
            const double t = w * blk.qs[e % kBlock];
            want += t;
            norm += std::fabs(t);
          }
          ASSERT_NEAR(o[h * hd + e], want, 1e-6 * (1 + norm)) << what << ": output " << h << "," << e;
        }
      }
    }
}

}  // namespace
}  // namespace ps
