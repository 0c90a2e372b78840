// MatMul paths against batch rows, on matrices of a real model: F32 activations by
// GEMV (weights decoded in registers) and by GEMM (dequantised tiles + sgemm), and int8
// activations by the packed kernels (kernels/cpu/packed.h; weights packed once, as
// PrepareWeights does) and, for a few rows, by per-row dot products on the GGUF layout;
// BF16 weights (a Hugging Face folder) in place and packed for oneDNN's BF16 kernels.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "base/flags.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul.h"
#include "model/model.h"

namespace {

// Milliseconds per call of fn (best of enough calls for ~0.2 s of work at 100 GFLOP/s).
double Millis(double flops, const std::function<void()>& fn) {
  fn();
  const int reps = static_cast<int>(std::max(3.0, 2e10 / flops));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int64_t threads = 2;
  std::vector<int64_t> rows_list = {1, 2, 4, 16, 64, 512};
  FlagParser flags("ps_bench_matmul", "MatMul paths (F32 GEMV / GEMM, BF16 or int8 packed) against batch rows.");
  flags.AddString("model", &model_path, "model file");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddIntList("rows", &rows_list, "activation rows (batch sizes)");
  if (auto st = flags.Parse(argc, argv); !st.ok() || flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return st.ok() ? 0 : 1;
  }
  auto model = Model::Load(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "ps_bench_matmul: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  ThreadPool pool(static_cast<int>(threads));
  const std::vector<LayerWeights>& layers = (*model)->layers;
  const LayerWeights& l0 = layers[0];
  const LayerWeights& l1 = layers[std::min<size_t>(1, layers.size() - 1)];
  const std::pair<const char*, const MatrixView*> matrices[] = {
      {"attn_q.0", &l0.wq},       {"attn_k.0", &l0.wk},       {"ffn_gate.0", &l0.w_gate},
      {"ffn_down.0", &l0.w_down}, {"ffn_down.1", &l1.w_down}, {"output", &(*model)->output}};
  std::printf("CPU level %s, %lld threads; GFLOP/s (int8: GOP/s)\n", DescribeCpuIsa().c_str(),
              static_cast<long long>(threads));
  // The layout start-up packs w in (PrepareWeights through the CPU backend), if any.
  CpuBackend backend(pool);
  auto pack = [&](const MatrixView& w) {
    std::vector<uint8_t> layout(backend.PackedWeightBytes(w));
    if (!layout.empty()) backend.PackWeights(w, layout.data());
    return layout;
  };
  for (const auto& [name, w] : matrices) {
    const std::vector<uint8_t> packed = pack(*w);
    MatrixView pw = *w;
    pw.packed = packed.empty() ? nullptr : packed.data();
    for (int64_t m : rows_list) {
      if (std::string(name) == "output" && m > 16) continue;  // logits are for a few rows
      std::vector<float> x(m * w->cols), y(m * w->rows);
      std::mt19937 g(1);
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(g);
      const double flops = 2.0 * m * w->rows * w->cols;
      std::printf("%-10s %-5s %6lldx%-5lld m=%3lld", name, std::string(DTypeName(w->type)).c_str(),
                  static_cast<long long>(w->rows), static_cast<long long>(w->cols), static_cast<long long>(m));
      auto column = [&](const char* label, const std::function<void()>& fn) {
        std::printf("  %s %6.1f", label, flops / Millis(flops, fn) / 1e6);
      };
      if (m <= 16) column("f32-gemv", [&] { MatMulWithPath(*w, x.data(), m, y.data(), pool, MatMulPath::kGemv); });
      column("f32-gemm", [&] { MatMulWithPath(*w, x.data(), m, y.data(), pool, MatMulPath::kGemm); });
      if (m <= 4) {
        column("int8-gguf", [&] { MatMulWithPath(*w, x.data(), m, y.data(), pool, MatMulPath::kGemv, true); });
      }
      if (pw.packed != nullptr && PacksBf16(pw)) {
        column("bf16-packed", [&] { MatMul(pw, x.data(), m, y.data(), pool); });
      } else if (pw.packed != nullptr) {
        column("int8-packed", [&] { MatMul(pw, x.data(), m, y.data(), pool, true); });
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  // A decode step's products: every matrix of the model once, in the forward pass's order, its
  // weights streamed from memory (the model is larger than the caches), as they are and packed.
  std::vector<MatrixView*> all = (*model)->Matrices();
  std::rotate(all.begin(), all.begin() + 1, all.end());  // the output matrix last
  std::vector<std::vector<uint8_t>> layouts(all.size());
  std::vector<MatrixView> packed_all;
  size_t bytes = 0;
  int64_t params = 0, max_dim = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const MatrixView& w = *all[i];
    bytes += w.row_bytes() * static_cast<size_t>(w.rows);
    params += w.rows * w.cols;
    max_dim = std::max({max_dim, w.rows, w.cols});
    packed_all.push_back(w);
    layouts[i] = pack(w);
    packed_all.back().packed = layouts[i].empty() ? nullptr : layouts[i].data();
  }
  const bool int8 = !PacksBf16(*all[0]);
  std::printf(
      "\nall %zu matrices once (%.0f MB as stored), ms a pass, GFLOP/s (int8: GOP/s) and GB/s of the stored weights:\n",
      all.size(), bytes / 1e6);
  for (int64_t m : rows_list) {
    if (m > 16) continue;
    std::vector<float> x(m * max_dim, 0.5f), y(m * max_dim);
    std::printf("m=%3lld", static_cast<long long>(m));
    auto pass = [&](const char* label, bool use_packed) {
      const double ms = Millis(2.0 * m * params, [&] {
        for (size_t i = 0; i < all.size(); ++i) {
          MatMul(use_packed ? packed_all[i] : *all[i], x.data(), m, y.data(), pool, int8);
        }
      });
      std::printf("  %s %7.2f ms %6.1f %5.1f GB/s", label, ms, 2.0 * m * params / ms / 1e6, bytes / ms / 1e6);
    };
    pass("as stored", false);
    if (!layouts[0].empty()) pass("packed", true);
    std::printf("\n");
  }
  return 0;
}
