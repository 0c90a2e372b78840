// MatMul paths against batch rows: the GEMV path (weights decoded in registers)
// and the GEMM path (dequantised tiles + sgemm), on matrices of a real model.
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "base/flags.h"
#include "engine/model.h"
#include "kernels/cpu/matmul.h"

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  int64_t threads = 2;
  FlagParser flags("ps_bench_matmul", "GEMV vs GEMM path of MatMul for 1..128 rows.");
  flags.AddString("model", &model_path, "model file");
  flags.AddInt("threads", &threads, "compute threads");
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
  const std::pair<const char*, const MatrixView*> matrices[] = {{"ffn_gate.0", &(*model)->layers[0].w_gate},
                                                                {"output", &(*model)->output}};
  std::printf("auto path switches to GEMM above %lld rows for %s\n",
              static_cast<long long>(GemvMaxRows(matrices[0].second->type)),
              std::string(DTypeName(matrices[0].second->type)).c_str());
  for (const auto& [name, w] : matrices) {
    for (int m : {1, 2, 4, 8, 16, 32, 64, 128}) {
      std::vector<float> x(m * w->cols), y(m * w->rows);
      std::mt19937 g(1);
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(g);
      std::printf("%-10s %-5s %5lldx%-5lld m=%3d", name, std::string(DTypeName(w->type)).c_str(),
                  static_cast<long long>(w->rows), static_cast<long long>(w->cols), m);
      for (MatMulPath p : {MatMulPath::kGemv, MatMulPath::kGemm}) {
        const int reps = std::max<int64_t>(3, 2e9 / (2.0 * m * w->rows * w->cols));
        MatMulWithPath(*w, x.data(), m, y.data(), pool, p);
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) MatMulWithPath(*w, x.data(), m, y.data(), pool, p);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
        std::printf("  %s %8.3f ms %6.1f GFLOP/s", p == MatMulPath::kGemv ? "gemv" : "gemm", s * 1e3,
                    2.0 * m * w->rows * w->cols / s / 1e9);
      }
      std::printf("\n");
    }
  }
  return 0;
}
