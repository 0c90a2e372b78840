// The AVX-512 BF16 tile kernels of prefill attention and the decode kernels against
// sums in doubles of the same rounded values. Skips on a CPU without AVX-512 BF16.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fp16.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention_avx512.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/random.h"

namespace ps {
namespace {

using testing::Randn;

// The BF16 tile kernels of prefill attention against sums in doubles of the same BF16
// values (queries: their two BF16 parts): rows packed from anywhere in memory, ragged key
// counts (the packed tiles' zero padding) and query rows (every pass size), head sizes of
// one and several 64-column passes and a 32-column one. Scores past the nt-th key are not
// written; the softmax weights' exp and rounding.
TEST(AttentionTiles, Bf16ProductsEqualSumsOfTheRoundedValues) {
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
  for (int hd : {32, 64, 96, 128})
    for (int64_t nt : {1, 31, 33, 256})
      for (int64_t nq : {1, 7, 9, 64}) {
        const std::string what = absl::StrCat("hd=", hd, " keys=", nt, " rows=", nq);
        const int64_t padded = avx512_bf16::PaddedKeys(nt), q_stride = 2 * hd + 8, s_stride = nt + 3;
        const std::vector<float> qf = Randn(nq * hd, 31);
        std::vector<uint16_t> q(nq * q_stride);
        for (int64_t i = 0; i < nq; ++i) {
          avx512_bf16::SplitQuery(qf.data() + i * hd, hd, q.data() + i * q_stride);
          for (int e = 0; e < hd; ++e) {  // the two parts hold the query to 16 bits
            const float x = qf[i * hd + e];
            ASSERT_EQ(q[i * q_stride + e], Fp32ToBf16(x));
            ASSERT_NEAR(Bf16ToFp32(q[i * q_stride + e]) + Bf16ToFp32(q[i * q_stride + hd + e]), x,
                        std::fabs(x) * 0x1p-16);
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
        std::vector<uint16_t> keys(padded * hd), values(padded * hd);
        avx512_bf16::PackKeys(kp.data(), nt, hd, keys.data());
        avx512_bf16::PackValues(vp.data(), nt, hd, values.data());
        constexpr float kUnwritten = 12345.0f;
        std::vector<float> s(nq * s_stride, kUnwritten);
        avx512_bf16::Scores(q.data(), q_stride, nq, keys.data(), nt, hd, 0.3f, s.data(), s_stride);
        std::vector<uint16_t> p = bf16(Randn(nq * padded, 32));
        for (int64_t i = 0; i < nq; ++i) std::fill(p.begin() + i * padded + nt, p.begin() + (i + 1) * padded, 0);
        if (hd == 32 && nq == 1) {  // the softmax weights of a row, once per key count
          std::vector<float> row = Randn(nt, 34);
          row[0] = -std::numeric_limits<float>::infinity();  // masked
          if (nt > 2) row[2] = -100.0f;                      // underflows to 0
          std::vector<uint16_t> w(padded, 0xFFFF);
          const float sum = avx512_bf16::ExpToBf16(row.data(), nt, 0.5f, w.data());
          double want_sum = 0;
          for (int64_t j = 0; j < padded; ++j) {
            const double e = j < nt ? std::exp(double{row[j]} - 0.5) : 0.0;
            ASSERT_NEAR(Bf16ToFp32(w[j]), e, e * 4e-3 + 1e-30) << what << " weight " << j;
            want_sum += e;
          }
          EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << what;
        }
        const std::vector<float> o0 = Randn(nq * (hd + 5), 33);
        std::vector<float> o = o0;
        avx512_bf16::AddWeightedValues(p.data(), padded, nq, values.data(), nt, hd, o.data(), hd + 5);
        for (int64_t i = 0; i < nq; ++i) {
          for (int64_t j = 0; j < s_stride; ++j) {
            if (j >= nt) {
              ASSERT_EQ(s[i * s_stride + j], kUnwritten) << what << " row " << i << " column " << j;
              continue;
            }
            double want = 0;
            for (int e = 0; e < hd; ++e) {
              const double qe = double{Bf16ToFp32(q[i * q_stride + e])} + Bf16ToFp32(q[i * q_stride + hd + e]);
              want += qe * Bf16ToFp32(k_rows[j][e]);
            }
            want *= 0.3;
            ASSERT_NEAR(s[i * s_stride + j], want, 1e-5 * (1 + std::fabs(want))) << what << " score " << i << "," << j;
          }
          for (int e = 0; e < hd + 5; ++e) {
            double want = o0[i * (hd + 5) + e];
            for (int64_t j = 0; e < hd && j < nt; ++j) {
              want += double{Bf16ToFp32(p[i * padded + j])} * Bf16ToFp32(v_rows[j][e]);
            }
            ASSERT_NEAR(o[i * (hd + 5) + e], want, 1e-5 * (1 + std::fabs(want))) << what << " output " << i << "," << e;
          }
        }
      }
}

// The decode kernels (one query row over BF16 rows read in place, every head of a GQA
// group at once) against sums in doubles: every group size they take (each its own pass
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
                                stride, hd, 0.3f, s.data(), out_step, /*ahead=*/2);
      const std::vector<float> p = Randn(g * out_step, 61);
      const std::vector<float> o0 = Randn(g * hd, 62);
      std::vector<float> o = o0;
      avx512_bf16::DecodeValues(p.data(), out_step, g, v_runs.data(), std::ssize(v_runs), stride, hd, o.data(),
                                /*ahead=*/2);
      for (int h = 0; h < g; ++h) {
        for (int64_t j = 0; j < out_step; ++j) {
          if (j >= n) {
            ASSERT_EQ(s[h * out_step + j], 12345.0f) << what << ": head " << h << " wrote past the rows";
            continue;
          }
          double want = 0, norm = 0;
          for (int e = 0; e < hd; ++e) {
            const double t = double{q[h * hd + e]} * Bf16ToFp32(k_rows[j][e]);
            want += t;
            norm += std::fabs(t);
          }
          ASSERT_NEAR(s[h * out_step + j], 0.3 * want, 1e-6 * (1 + norm)) << what << ": score " << h << "," << j;
        }
        for (int e = 0; e < hd; ++e) {
          double want = o0[h * hd + e], norm = std::fabs(want);
          for (int64_t j = 0; j < n; ++j) {
            const double t = double{p[h * out_step + j]} * Bf16ToFp32(v_rows[j][e]);
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
