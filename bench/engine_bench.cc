// Engine benchmark: prefill tokens/s at given prompt lengths, decode tokens/s and
// peak memory, for one model and thread count, each figure also as a share of the
// machine's own ceiling (bench/machine_peak.h: FMA and int8 dot-product rates,
// streaming-read bandwidth). With --llamacpp it also runs llama.cpp's llama-bench
// (bench/llamacpp.sh) on the same file and threads and prints ratios.
// With --synthetic llama3-8b it builds LLaMA-3-8B's shape in memory (random BF16
// weights, 16 GB) instead of loading a file, for `--device cuda`; on a GPU it
// prints each figure as a share of the H100's limits instead.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/flags.h"
#include "base/fp16.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "bench/machine_peak.h"
#include "engine/generator.h"
#include "engine/pruning/calibration.h"
#include "engine/pruning/registry.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "memory/kv_geometry.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double PeakRssMiB() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "ps_bench_engine: %s\n", m.c_str());
  return 1;
}

// The H100 SXM's limits the GPU figures are measured against, named in the output: on
// another GPU (an H200 has the same BF16 peak and 4.8 TB/s) the share is of the H100's.
constexpr double kPeakBf16Flops = 990e12;
constexpr double kPeakBytesPerS = 3.35e12;

// LLaMA-3-8B's shape with random BF16 weights (norms 1): 32 layers, 4096 wide, 32
// query and 8 KV heads of 128, FFN 14336, vocabulary 128256, 32k context.
absl::StatusOr<std::unique_ptr<ps::Model>> SyntheticLlama3_8B(ps::ThreadPool& pool) {
  using namespace ps;
  ModelConfig c{.arch = Arch::kLlama,
                .arch_name = "llama",
                .name = "synthetic LLaMA-3-8B shape",
                .n_vocab = 128256,
                .n_embd = 4096,
                .n_layers = 32,
                .n_heads = 32,
                .n_kv_heads = 8,
                .head_dim = 128,
                .n_ff = 14336,
                .n_ctx = 32768,
                .rms_eps = 1e-5f};
  c.rope = RopeParams{.n_dims = 128, .freq_base = 500000.0f};
  c.rope.freq_factors = Llama3FreqFactors(128, 500000.0f, 8.0f, 1.0f, 4.0f, 8192);
  struct Storage {
    std::vector<std::vector<uint16_t>> matrices;
    std::vector<std::vector<float>> vectors;
  };
  auto storage = std::make_shared<Storage>();
  TensorMap t;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    std::vector<uint16_t>& m = storage->matrices.emplace_back(static_cast<size_t>(rows * cols));
    // BF16 values of about +-1/sqrt(cols) from a per-chunk xorshift (fast, reproducible).
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    pool.ParallelFor(rows, 64, [&](int64_t r0, int64_t r1) {
      uint32_t x = static_cast<uint32_t>(r0 * 2654435761u + rows) | 1u;
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        m[i] = Fp32ToBf16(scale * (static_cast<float>(x >> 8) / 8388608.0f - 1.0f));
      }
    });
    t[name] = TensorRef{.type = DType::kBF16,
                        .dims = {cols, rows},
                        .data = reinterpret_cast<const uint8_t*>(m.data()),
                        .nbytes = m.size() * sizeof(uint16_t)};
  };
  auto ones = [&](const std::string& name, int64_t n) {
    std::vector<float>& v = storage->vectors.emplace_back(static_cast<size_t>(n), 1.0f);
    t[name] = TensorRef{.type = DType::kF32,
                        .dims = {n},
                        .data = reinterpret_cast<const uint8_t*>(v.data()),
                        .nbytes = v.size() * sizeof(float)};
  };
  matrix("token_embd.weight", c.n_vocab, c.n_embd);
  matrix("output.weight", c.n_vocab, c.n_embd);
  ones("output_norm.weight", c.n_embd);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ones(p + "attn_norm.weight", c.n_embd);
    ones(p + "ffn_norm.weight", c.n_embd);
    matrix(p + "attn_q.weight", c.q_dim(), c.n_embd);
    matrix(p + "attn_k.weight", c.kv_dim(), c.n_embd);
    matrix(p + "attn_v.weight", c.kv_dim(), c.n_embd);
    matrix(p + "attn_output.weight", c.n_embd, c.q_dim());
    matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd);
    matrix(p + "ffn_up.weight", c.n_ff, c.n_embd);
    matrix(p + "ffn_down.weight", c.n_embd, c.n_ff);
  }
  return Model::Build(std::move(c), t, nullptr, storage);
}

// FLOPs (2 per multiply-add) of one token through the layers' matrices (a prefill
// computes logits for its last row only), and of the causal attention of an n-token
// prompt (QK and PV over half the pairs).
double MatmulFlopsPerToken(const ps::ModelConfig& c) {
  return c.n_layers * 2.0 * c.n_embd * (2.0 * c.q_dim() + 2.0 * c.kv_dim() + 3.0 * c.n_ff);
}
double AttentionFlops(const ps::ModelConfig& c, int64_t n) {
  return 2.0 * 2.0 * c.n_layers * c.q_dim() * (static_cast<double>(n) * n / 2);
}

// Bytes one decode step reads: every weight matrix as the kernels read it (the packed
// layout where there is one) and, at context depth d, the KV cache's keys and values.
double DecodeBytesPerToken(ps::Model& m, int64_t depth, ps::DType kv_dtype) {
  double bytes = 0;
  for (const ps::MatrixView* w : m.Matrices()) bytes += static_cast<double>(w->row_bytes()) * w->rows;
  const ps::ModelConfig& c = m.config();
  return bytes +
         2.0 * c.n_layers * static_cast<double>(ps::RowBytes(kv_dtype, c.kv_dim())) * static_cast<double>(depth);
}

// Runs llama.cpp's llama-bench (bench/llamacpp.sh builds it) with `args` and returns
// its figures by this benchmark's names: prefill_N_tok_per_s for a prompt of N tokens,
// decode_tok_per_s or decode_at_D_tok_per_s for generation at context depth D.
std::map<std::string, double> LlamaBench(const std::string& args) {
  std::map<std::string, double> out;
  const std::string cmd = "bench/llamacpp.sh -o csv " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char line[4096];
  std::vector<std::string> header;
  while (fgets(line, sizeof(line), p) != nullptr) {
    std::vector<std::string> cells = absl::StrSplit(absl::StripTrailingAsciiWhitespace(line), ',');
    for (std::string& c : cells) c = std::string(absl::StripPrefix(absl::StripSuffix(c, "\""), "\""));
    if (header.empty()) {
      if (std::find(cells.begin(), cells.end(), "avg_ts") != cells.end()) header = cells;
      continue;
    }
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < cells.size() && i < header.size(); ++i) row[header[i]] = cells[i];
    const long prompt = std::atol(row["n_prompt"].c_str()), gen = std::atol(row["n_gen"].c_str()),
               depth = std::atol(row["n_depth"].c_str());
    const double ts = std::atof(row["avg_ts"].c_str());
    if (prompt > 0 && gen == 0) out["prefill_" + std::to_string(prompt) + "_tok_per_s"] = ts;
    if (gen > 0 && prompt == 0)
      out[depth == 0 ? "decode_tok_per_s" : "decode_at_" + std::to_string(depth) + "_tok_per_s"] = ts;
  }
  pclose(p);
  return out;
}

// Runs bench/vllm.sh (vLLM's CPU backend on the same weights, a BF16 folder) with `args`
// and returns its `vllm NAME VALUE` lines by name.
std::map<std::string, double> VllmBench(const std::string& args) {
  std::map<std::string, double> out;
  FILE* p = popen(("bench/vllm.sh " + args).c_str(), "r");
  if (p == nullptr) return out;
  char line[1024], name[256];
  double v = 0;
  while (fgets(line, sizeof(line), p) != nullptr) {
    if (std::sscanf(line, "vllm %255s %lf", name, &v) == 2) out[name] = v;
  }
  pclose(p);
  return out;
}

// One peer's figures next to ours, with the ratios.
void PrintPeer(const char* peer, const std::map<std::string, double>& theirs,
               const std::map<std::string, double>& ours) {
  for (const auto& [name, v] : theirs) {
    const auto o = ours.find(name);
    if (o == ours.end()) {  // a figure of theirs with none of ours in this run (vLLM's depth-0 decode)
      std::printf("%s %s %.1f\n", peer, name.c_str(), v);
    } else {
      std::printf("%s %s %.1f   ours/%s %.2fx\n", peer, name.c_str(), v, peer, o->second / v);
    }
  }
}

// The KV caches the benchmark makes: --kv-block-size tokens per block of --kv-dtype.
struct KvChoice {
  int block_tokens = 16;
  ps::DType dtype = ps::DType::kF32;
};

// Decode steps of `streams` sequences batched in one forward pass each, after a
// prompt of `depth` tokens per sequence (token ids from `ids`); returns the best
// aggregate tokens/s over `repeats` runs, or an error.
absl::StatusOr<double> DecodeTokPerS(const ps::Model& model, ps::Backend& backend, ps::Transformer& tf,
                                     const std::vector<int32_t>& ids, int depth, int streams, int steps, int repeats,
                                     const KvChoice& kv_choice) {
  using namespace ps;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    PS_ASSIGN_OR_RETURN(auto kv, OfflineKvCache(model, backend, int64_t{streams} * (depth + steps + 1),
                                                kv_choice.block_tokens, kv_choice.dtype));
    ForwardOutput out;
    std::vector<int32_t> pos(depth);
    for (int i = 0; i < depth; ++i) pos[i] = i;
    for (int s = 0; s < streams; ++s) {  // prompts one at a time: a long prompt's scratch stays bounded
      SeqInput in{.seq_id = s + 1, .tokens = {ids.data(), static_cast<size_t>(depth)}, .positions = pos};
      PS_RETURN_IF_ERROR(tf.Forward({&in, 1}, *kv, &out));
      PS_RETURN_IF_ERROR(out.status[0]);
    }
    std::vector<int32_t> tok(streams), p(streams);
    std::vector<SeqInput> batch(streams);
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) {
      for (int s = 0; s < streams; ++s) {
        tok[s] = ((i * 31 + s * 7) % 1000 + 500) % model.config().n_vocab;
        p[s] = depth + i;
        batch[s] = SeqInput{.seq_id = s + 1, .tokens = {&tok[s], 1}, .positions = {&p[s], 1}};
      }
      PS_RETURN_IF_ERROR(tf.Forward(batch, *kv, &out));
      for (const absl::Status& st : out.status) PS_RETURN_IF_ERROR(st);
    }
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return static_cast<double>(streams) * steps / best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string text_path = "../shared/testdata/haystack/paul_graham_essays";
  std::vector<int64_t> prefill_list = {512, 2048};
  std::vector<int64_t> depth_list = {0};
  int64_t threads = 2, decode = 128, repeats = 2, block_tokens = 16, streams = 16;
  bool llamacpp = false, vllm = false, peak = true;
  std::string strategy, sweep, device = "cpu", synthetic, kv_dtype = kDefaultKvDTypeName, activations = "int8", cpu_isa,
                               calibration_path;
  std::vector<std::string> strategy_args;
  FlagParser flags("ps_bench_engine",
                   "Prefill and decode throughput of the engine: one sequence at given prompt lengths and decode\n"
                   "depths, and the aggregate of a batch of decode streams; with --llamacpp, llama.cpp's figures\n"
                   "for the same file and threads in the same run, with the ratios.");
  flags.AddString("model", &model_path, "model file");
  flags.AddString("text", &text_path, "folder or file of text used as the prompt");
  flags.AddIntList("prefill", &prefill_list, "prompt lengths (0: none)");
  flags.AddIntList("decode-depth", &depth_list, "context depths at which one sequence's decode is measured");
  flags.AddInt("decode", &decode, "decode steps (0: no decode figures)");
  flags.AddInt("streams", &streams, "decode streams batched together (0 = skip)");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddInt("repeats", &repeats,
               "best of this many runs (prefill: after an untimed warm-up run, for prompts up to 8,192 tokens)");
  flags.AddInt("kv-block-size", &block_tokens, "tokens per KV block (the server's default: 16)");
  flags.AddString("kv-dtype", &kv_dtype,
                  "f32 | f16 | bf16 | q8_0: the KV cache's element type (16-bit KV takes the GPU's "
                  "tensor-core attention; q8_0 is CPU only)");
  flags.AddString("activations", &activations,
                  "int8 | f32: activations of products with quantised weights (as the server's --activations)");
  flags.AddString("cpu-isa", &cpu_isa, "scalar | avx2 | avx512 | avx512_bf16: cap the CPU kernels' level");
  flags.AddBool("peak", &peak, "measure the machine's ceilings first and print each figure as a share of them");
  flags.AddString("strategy", &strategy,
                  "S1,S2,...: also measure prefill with these pruning strategies (each one's time to the first "
                  "token, next to full's)");
  flags.AddStringList("strategy-arg", &strategy_args,
                      "KEY=VALUE parameter of --strategy's strategies (repeatable; each must know it)");
  flags.AddString("calibration", &calibration_path,
                  "the model's calibration for --strategy (PoD's groups, GemFilter's and LazyLLM's layers), as the "
                  "server's; default: MODEL.calibration.json beside the model when there is one");
  flags.AddString("sweep", &sweep,
                  "KEY=V1,V2,...: measure one --strategy's prefill at each value of one parameter "
                  "(e.g. budget=256,512,1024 for critiprefill)");
  flags.AddBool("llamacpp", &llamacpp,
                "also run llama.cpp's llama-bench on the same file and threads (bench/llamacpp.sh builds it from "
                "PyPI's llama-cpp-python sources on first use; its F16 KV, or its Q8_0 one with --kv-dtype q8_0) "
                "and print ratios");
  flags.AddBool("vllm", &vllm,
                "also run vLLM's CPU backend on the same weights as a BF16 folder (bench/vllm.sh installs it on first "
                "use, several GB; a GGUF --model is converted once to models/NAME-bf16) and print ratios");
  flags.AddString("device", &device, "cpu | cuda: the backend (cuda: libps_cuda.so next to this program)");
  flags.AddString("synthetic", &synthetic,
                  "llama3-8b: LLaMA-3-8B's shape with random BF16 weights built in memory, instead of --model "
                  "(token ids instead of --text; for --device cuda)");
  if (auto s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (!synthetic.empty() && synthetic != "llama3-8b") return Fail("--synthetic knows llama3-8b only");
  const absl::StatusOr<DType> parsed_kv_dtype = ParseKvDType(kv_dtype);
  if (!parsed_kv_dtype.ok()) return Fail(std::string(parsed_kv_dtype.status().message()));
  const KvChoice kv_choice{.block_tokens = static_cast<int>(block_tokens), .dtype = *parsed_kv_dtype};
  if (!synthetic.empty() && (llamacpp || vllm)) return Fail("--llamacpp and --vllm need a model, not --synthetic");
  const absl::StatusOr<bool> int8 = ParseActivations(activations);
  if (!int8.ok()) return Fail(std::string(int8.status().message()));
  if (!cpu_isa.empty()) {
    if (absl::Status s = CapCpuKernels(cpu_isa); !s.ok()) return Fail(absl::StrCat("--cpu-isa: ", s.message()));
  }
  ThreadPool pool(static_cast<int>(threads));
  auto model = synthetic.empty() ? Model::Load(model_path) : SyntheticLlama3_8B(pool);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const ModelConfig& c = (*model)->config();

  std::vector<int32_t> all_ids;
  if (synthetic.empty()) {
    const absl::StatusOr<std::string> text = ReadTextCorpus(text_path);
    if (!text.ok()) return Fail(std::string(text.status().message()));
    all_ids = (*model)->tokenizer()->Encode(*text, true, false);
  } else {
    all_ids.resize(static_cast<size_t>(c.n_ctx));
    for (size_t i = 0; i < all_ids.size(); ++i) all_ids[i] = static_cast<int32_t>((i * 7919 + 11) % c.n_vocab);
  }
  std::erase_if(prefill_list, [](int64_t n) { return n <= 0; });
  if (decode <= 0) {  // no decode steps: no decode figures
    depth_list.clear();
    streams = 0;
  }
  const int64_t longest =
      std::max(prefill_list.empty() ? 0 : *std::max_element(prefill_list.begin(), prefill_list.end()),
               depth_list.empty() ? 0 : *std::max_element(depth_list.begin(), depth_list.end()) + decode);
  if (static_cast<int64_t>(all_ids.size()) < longest || longest > c.n_ctx) {
    return Fail("text too short or prompt longer than the context");
  }

  // The pruning settings whose prefill is measured after full's: one per strategy, or one
  // per sweep value of a single strategy.
  std::vector<std::pair<std::string, PruningParams>> pruned;
  if (!strategy.empty()) {
    CalibrationPtr calibration;
    if (calibration_path.empty() && synthetic.empty() && std::filesystem::exists(model_path + ".calibration.json")) {
      calibration_path = model_path + ".calibration.json";
    }
    if (!calibration_path.empty()) {
      absl::StatusOr<Calibration> loaded = LoadCalibration(calibration_path, c);
      if (!loaded.ok()) return Fail(absl::StrCat("--calibration: ", loaded.status().message()));
      calibration = std::make_shared<const Calibration>(*std::move(loaded));
      std::printf("calibration: %s\n", calibration_path.c_str());
    }
    const absl::StatusOr<StrategyDefaults> defaults = StrategyDefaults::ForModel(c, {}, calibration);
    if (!defaults.ok()) return Fail(std::string(defaults.status().message()));
    const std::vector<std::string> names = absl::StrSplit(strategy, ',');
    std::vector<std::string> values = {""};
    std::string key;
    if (!sweep.empty()) {
      const size_t eq = sweep.find('=');
      if (eq == std::string::npos) return Fail("--sweep wants KEY=V1,V2,...");
      if (names.size() != 1) return Fail("--sweep varies one --strategy, not several");
      key = sweep.substr(0, eq);
      values = absl::StrSplit(sweep.substr(eq + 1), ',');
    }
    for (const std::string& name : names) {
      for (const std::string& v : values) {
        std::vector<std::string> args = strategy_args;
        if (!key.empty()) args.push_back(key + "=" + v);
        absl::StatusOr<PruningParams> p = defaults->WithArgs(name, args, "--strategy-arg");
        if (!p.ok()) return Fail(std::string(p.status().message()));
        pruned.emplace_back(key.empty() ? name : name + "_" + key + "_" + v, *std::move(p));
      }
    }
  }

  std::string note;
  absl::StatusOr<std::unique_ptr<Backend>> made =
      CreateBackend(device, pool, CpuBackendOptions{.int8_activations = *int8}, &note);
  if (!made.ok()) return Fail(std::string(made.status().message()));
  Backend& backend = **made;
  const bool gpu = backend.kind() == DeviceKind::kCuda;
  const auto w0 = Clock::now();
  const absl::StatusOr<size_t> packed = PrepareWeights(**model, backend);
  if (!packed.ok()) return Fail(std::string(packed.status().message()));
  Transformer tf(**model, backend);
  // The device's figures count only if its answers are the CPU's: the last token's
  // logits of an 8-token pass on both (which also makes the weights' device copies,
  // outside the timed runs), worst difference relative to the largest logit. BF16
  // rounding differs between the two; a wrong kernel is off by O(1).
  constexpr double kDeviceTolerance = 0.1;
  double device_error = 0;
  if (gpu) {
    auto last_logits = [&](Backend& b, Transformer& t) -> absl::StatusOr<std::vector<float>> {
      PS_ASSIGN_OR_RETURN(auto kv, OfflineKvCache(**model, b, 8, kv_choice.block_tokens, kv_choice.dtype));
      std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + 8), pos = {0, 1, 2, 3, 4, 5, 6, 7};
      SeqInput in{.seq_id = 1, .tokens = ids, .positions = pos};
      ForwardOutput out;
      PS_RETURN_IF_ERROR(t.Forward({&in, 1}, *kv, &out));
      PS_RETURN_IF_ERROR(out.status[0]);
      return out.logits;
    };
    const absl::StatusOr<std::vector<float>> on_device = last_logits(backend, tf);
    if (!on_device.ok()) return Fail(absl::StrCat("the pass on the device failed: ", on_device.status().message()));
    std::string cpu_note;
    absl::StatusOr<std::unique_ptr<Backend>> cpu = CreateBackend("cpu", pool, {}, &cpu_note);
    if (!cpu.ok()) return Fail(std::string(cpu.status().message()));
    Transformer cpu_tf(**model, **cpu);
    const absl::StatusOr<std::vector<float>> on_cpu = last_logits(**cpu, cpu_tf);
    if (!on_cpu.ok()) return Fail(absl::StrCat("the pass on the CPU failed: ", on_cpu.status().message()));
    double largest = 0, worst = 0;
    for (size_t i = 0; i < on_cpu->size(); ++i) {
      largest = std::max(largest, std::fabs(double{(*on_cpu)[i]}));
      worst = std::max(worst, std::fabs(double{(*on_device)[i]} - (*on_cpu)[i]));
    }
    device_error = largest > 0 ? worst / largest : worst;
    std::printf(
        "device check: the last token's logits within %.4f of the CPU's (relative to the largest, %.2f; "
        "bound %.2f)%s\n",
        device_error, largest, kDeviceTolerance, device_error <= kDeviceTolerance ? "" : ": FAILED");
  }
  std::map<std::string, double> ours;
  auto report = [&](const std::string& key, double v) {
    ours[key] = v;
    std::printf("ours %s %.1f\n", key.c_str(), v);
    std::fflush(stdout);
  };
  std::printf("model %s (%s), %s, %lld threads, %s activations for quantised weights, %s KV; CPU kernels %s\n",
              c.name.c_str(), synthetic.empty() ? model_path.c_str() : "in memory", note.c_str(),
              static_cast<long long>(threads), activations.c_str(), kv_dtype.c_str(), DescribeCpuKernels().c_str());
  if (*packed > 0) {
    std::printf("weights repacked for the CPU kernels (int8 or BF16): %.0f MiB in %.2f s\n", *packed / 1048576.0,
                Seconds(w0, Clock::now()));
  }
  bench::MachinePeak ceiling;
  auto print_ceiling = [&](const char* which) {
    std::printf("machine (%lld threads, %s), %s: FP32 FMA %.1f GFLOP/s, int8 dot products %.1f GOP/s",
                static_cast<long long>(threads), ceiling.isa.c_str(), which, ceiling.fp32_flops / 1e9,
                ceiling.int8_ops / 1e9);
    if (ceiling.bf16_flops > 0) std::printf(", BF16 dot products %.1f GFLOP/s", ceiling.bf16_flops / 1e9);
    std::printf(", streaming read %.1f GB/s\n", ceiling.read_bytes_per_s / 1e9);
  };
  const bool measure_peak = peak && !gpu;
  if (measure_peak) {
    ceiling = bench::MeasureMachinePeak(static_cast<int>(threads));
    print_ceiling("first reading");
  }
  // Read again after each figure: its shares are of the highest reading so far.
  auto read_ceiling_again = [&] {
    if (measure_peak) ceiling = bench::Higher(ceiling, bench::MeasureMachinePeak(static_cast<int>(threads)));
  };
  // Prefill arithmetic as a share of the ceilings: the matrices' products run on the
  // int8 peak when quantised weights are packed, on the BF16 one for BF16 weights on a CPU with
  // BF16 dot products, on the FP32 one otherwise; attention on the BF16 one where its
  // tiles take BF16 dot products (on the int8 one over a Q8_0 cache), on FP32 otherwise.
  auto prefill_share = [&](int64_t n, double seconds) {
    const double mm = n * MatmulFlopsPerToken(c), att = AttentionFlops(c, n);
    if (gpu) {
      std::printf("ours prefill_%lld %.1f TFLOP/s, %.1f%% of the H100 SXM's %.0f\n", static_cast<long long>(n),
                  (mm + att) / seconds / 1e12, 100 * (mm + att) / seconds / kPeakBf16Flops, kPeakBf16Flops / 1e12);
    } else if (ceiling.fp32_flops > 0) {
      const bool bf16_weights = (*model)->layers[0].wq.type == DType::kBF16;  // packed for BF16 products
      const bool int8_mm = *packed > 0 && !bf16_weights && ceiling.int8_ops > 0;
      const bool bf16_mm = !int8_mm && bf16_weights && ceiling.bf16_flops > 0;
      const double mm_peak = int8_mm ? ceiling.int8_ops : bf16_mm ? ceiling.bf16_flops : ceiling.fp32_flops;
      // Time the peak rates would take; achieved share = that / measured.
      const AttentionShape shape{.n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim};
      const bool bf16_att = PrefillAttentionOnBf16(shape, kv_choice.dtype) && ceiling.bf16_flops > 0;
      const bool int8_att = PrefillAttentionOnInt8(shape, kv_choice.dtype) && ceiling.int8_ops > 0;
      const double att_time = int8_att   ? att / ceiling.int8_ops
                              : bf16_att ? att / ceiling.bf16_flops
                                         : att / ceiling.fp32_flops;
      const double ideal = mm / mm_peak + att_time;
      std::printf("ours prefill_%lld %.1f GFLOP/s (%.0f%% attention): %.0f%% of the machine's peak (%s products)\n",
                  static_cast<long long>(n), (mm + att) / seconds / 1e9, 100 * att / (mm + att), 100 * ideal / seconds,
                  int8_mm   ? "int8"
                  : bf16_mm ? "BF16"
                            : "FP32");
    }
  };
  auto decode_share = [&](const std::string& what, int64_t depth, int streams, double tok_per_s) {
    if (gpu) {  // a step of `streams` streams reads every weight once (BF16 copies: 2 bytes each), the KV aside
      const double bytes = 2.0 * (c.n_layers * (2.0 * c.q_dim() + 2.0 * c.kv_dim() + 3.0 * c.n_ff) * c.n_embd +
                                  static_cast<double>(c.n_vocab) * c.n_embd);
      const double rate = bytes * tok_per_s / streams;
      std::printf("ours %s %.0f GB/s of weights, %.1f%% of the H100 SXM's %.2f TB/s\n", what.c_str(), rate / 1e9,
                  100 * rate / kPeakBytesPerS, kPeakBytesPerS / 1e12);
    } else if (ceiling.read_bytes_per_s > 0) {
      // A step of `streams` streams reads the weights once and each stream's KV.
      const double weights = DecodeBytesPerToken(**model, 0, kv_choice.dtype);
      const double step = weights + streams * (DecodeBytesPerToken(**model, depth, kv_choice.dtype) - weights);
      const double rate = step * tok_per_s / streams;
      std::printf("ours %s reads %.1f GB/s (weights and %s KV): %.0f%% of the streaming-read bandwidth\n", what.c_str(),
                  rate / 1e9, kv_dtype.c_str(), 100 * rate / ceiling.read_bytes_per_s);
    }
  };
  for (int64_t prefill : prefill_list) {
    const int n = static_cast<int>(prefill);
    std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + n), pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    // Best prefill time over `runs` runs with `params`' strategy (null: full), and the
    // bytes its hooks read on the host.
    int64_t host_bytes = 0;
    auto prefill_seconds = [&](const PruningParams* params, int64_t runs) -> absl::StatusOr<double> {
      double best = 1e30;
      for (int64_t r = 0; r < runs; ++r) {
        PS_ASSIGN_OR_RETURN(auto kv, OfflineKvCache(**model, backend, n, kv_choice.block_tokens, kv_choice.dtype));
        std::unique_ptr<PruningStrategy> s = params != nullptr ? params->Make(c) : nullptr;
        SeqInput in{.seq_id = 1, .tokens = ids, .positions = pos, .strategy = s.get()};
        ForwardOutput out;
        const auto t0 = Clock::now();
        PS_RETURN_IF_ERROR(tf.Forward({&in, 1}, *kv, &out));
        PS_RETURN_IF_ERROR(out.status[0]);
        best = std::min(best, Seconds(t0, Clock::now()));
        host_bytes = out.host_bytes[0];
      }
      return best;
    };
    // One untimed run first, as the peers' benchmarks do (bench/vllm_bench.py warms up each
    // shape, llama-bench runs a warm-up): the first run after loading pays for the caches'
    // and the allocator's first touches. Prompts above kWarmUpTokens skip it: their cold
    // start is lost in their time, which a warm-up would double.
    constexpr int kWarmUpTokens = 8192;
    if (n <= kWarmUpTokens) {
      if (const absl::StatusOr<double> warm = prefill_seconds(nullptr, 1); !warm.ok()) {
        return Fail(std::string(warm.status().message()));
      }
    }
    const absl::StatusOr<double> full = prefill_seconds(nullptr, repeats);
    if (!full.ok()) return Fail(std::string(full.status().message()));
    report("prefill_" + std::to_string(n) + "_tok_per_s", n / *full);
    read_ceiling_again();
    prefill_share(n, *full);
    for (const auto& [name, params] : pruned) {
      const absl::StatusOr<double> t = prefill_seconds(&params, repeats);
      if (!t.ok()) return Fail(std::string(t.status().message()));
      std::printf("ours prefill_%d %s %.2f s (full %.2f s, %.2fx), %.1f MiB read on the host\n", n, name.c_str(), *t,
                  *full, *full / *t, host_bytes / 1048576.0);
      std::fflush(stdout);
    }
  }
  for (int64_t depth : depth_list) {
    // Depth 0 starts from a 4-token prompt; a long depth is measured once (its prefill dominates).
    const int d = std::max<int>(4, static_cast<int>(depth));
    auto v = DecodeTokPerS(**model, backend, tf, all_ids, d, 1, static_cast<int>(decode),
                           depth > 512 ? 1 : static_cast<int>(repeats), kv_choice);
    if (!v.ok()) return Fail(std::string(v.status().message()));
    const std::string key = depth == 0 ? "decode_tok_per_s" : "decode_at_" + std::to_string(depth) + "_tok_per_s";
    report(key, *v);
    read_ceiling_again();
    decode_share(key, d, 1, *v);
  }
  if (streams > 0) {
    auto v = DecodeTokPerS(**model, backend, tf, all_ids, 4, static_cast<int>(streams), static_cast<int>(decode),
                           static_cast<int>(repeats), kv_choice);
    if (!v.ok()) return Fail(std::string(v.status().message()));
    const std::string key = "decode_" + std::to_string(streams) + "_streams_tok_per_s";
    report(key, *v);
    read_ceiling_again();
    decode_share(key, 4, static_cast<int>(streams), *v);
    if (ours.count("decode_tok_per_s")) {
      std::printf("ours %lld_streams/1_stream %.2fx\n", static_cast<long long>(streams), *v / ours["decode_tok_per_s"]);
    }
  }
  std::printf("ours peak_rss_mib %.1f\n", PeakRssMiB());
  if (measure_peak) print_ceiling("the highest readings of the run (the shares above: of the highest then)");

  if (llamacpp) {
    // Its defaults otherwise (F16 KV cache, flash attention where it chooses): llama.cpp as
    // a user runs it; with --kv-dtype q8_0 its Q8_0 cache too, the same bytes as ours. Prompts
    // of the same lengths; generation from depth 0 or the same depths.
    const std::string cache = kv_choice.dtype == DType::kQ8_0 ? " -ctk q8_0 -ctv q8_0" : "";
    const std::string common =
        absl::StrCat("-m ", model_path, " -t ", threads, " -r ", std::max<int64_t>(repeats, 2), cache);
    std::map<std::string, double> theirs;
    if (!prefill_list.empty()) theirs = LlamaBench(absl::StrCat(common, " -n 0 -p ", absl::StrJoin(prefill_list, ",")));
    if (!depth_list.empty()) {
      std::map<std::string, double> gen =
          LlamaBench(absl::StrCat(common, " -p 0 -n ", decode, " -d ", absl::StrJoin(depth_list, ",")));
      theirs.insert(gen.begin(), gen.end());
    }
    if (theirs.empty()) std::printf("llama-bench gave no figures (bench/llamacpp.sh; see its output above)\n");
    PrintPeer("llamacpp", theirs, ours);
  }
  if (vllm) {
    std::vector<int64_t> deep;  // depth 0 is its decode_tok_per_s
    std::copy_if(depth_list.begin(), depth_list.end(), std::back_inserter(deep), [](int64_t d) { return d > 0; });
    const std::map<std::string, double> theirs =
        VllmBench(absl::StrCat("--model ", model_path, " --text ", text_path, " --threads ", threads, " --decode ",
                               decode, " --streams ", streams, " --repeats ", repeats, " --prefill ",
                               absl::StrJoin(prefill_list, " "), " --decode-depth ", absl::StrJoin(deep, " ")));
    if (theirs.empty()) std::printf("vLLM gave no figures (bench/vllm.sh; see its output above)\n");
    PrintPeer("vllm", theirs, ours);
  }
  if (!(device_error <= kDeviceTolerance)) return Fail("the device's logits are not the CPU's (device check above)");
  return 0;
}
