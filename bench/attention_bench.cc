// Attention kernel benchmark on a model's shape, over a paged KV laid out as the
// engine's cache lays it out after a chunked prefill (a page of `--kv-block-size` tokens
// is 2 * n_kv_heads blocks; a prefill chunk takes each layer's pages in one run of block
// ids, one head's K blocks of the chunk next to each other, then the next head's, then
// the V blocks: memory/kv_cache_manager.cc's Append; `--prefill-chunk` as many tokens as
// a page: every head's successive blocks n_layers pages of blocks apart, as in a cache
// grown a token at a time): decode (one query row, or a batch of streams) at given depths, as
// GB/s of KV read, a share of the machine's streaming-read bandwidth and the time the same
// blocks take read by a plain loop (kernel against layout); prefill
// (causal, every query row) at given lengths, as GFLOP/s and a share of the FP32
// FMA peak. Each line names the KV type.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "base/flags.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "bench/machine_peak.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/half_rows.h"
#include "kernels/cpu/quant.h"
#include "memory/kv_geometry.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int n_heads, n_kv_heads, head_dim, n_layers;
};
constexpr Shape kShapes[] = {
    {"smollm2-135m", 9, 3, 64, 30}, {"qwen2.5-0.5b", 14, 2, 64, 24}, {"llama3-8b", 32, 8, 128, 32}};

// Every layer's KV of `n` tokens: blocks carved from a pool holding all layers'
// blocks of each page together, as memory/kv_cache's allocation order leaves them, so
// that a step over the layers reads memory, not the caches. The pool is the CPU
// backend's KV tier, as the engine's is: with a std::vector's (16 bytes past a 64-byte
// line) every row straddled lines, and SmolLM2's decode at 8k read 15 GB/s, not 23 (Zen 4).
struct PagedKv {
  std::unique_ptr<uint8_t, std::function<void(uint8_t*)>> pool;
  std::vector<std::vector<const void*>> k_blocks, v_blocks;  // per layer
  std::vector<int32_t> positions;
  std::vector<ps::KvRows> layers;
  size_t block_bytes = 0;

  PagedKv(ps::Backend& backend, const Shape& s, ps::DType dtype, int64_t n, int block_tokens, int64_t chunk_pages,
          std::mt19937& g) {
    const ps::KvGeometry geo{.n_layers = s.n_layers,
                             .block_tokens = block_tokens,
                             .kv_dim = s.n_kv_heads * s.head_dim,
                             .n_kv_heads = s.n_kv_heads,
                             .dtype = dtype};
    const int64_t pages = (n + block_tokens - 1) / block_tokens;
    block_bytes = geo.block_bytes();
    const size_t layer_blocks = block_bytes * geo.blocks_per_page(), page = layer_blocks * s.n_layers;
    const size_t bytes = pages * page;
    absl::StatusOr<ps::MemoryRegion> region = backend.AllocateTier(/*device_tier=*/true, bytes);
    PS_CHECK(region.ok()) << region.status();
    pool = {region->base, std::move(region->release)};
    std::vector<float> row(bytes / geo.head_row_bytes() * s.head_dim);
    uint32_t state = g();  // xorshift: random enough, and fast for hundreds of MB
    for (float& x : row) {
      state ^= state << 13, state ^= state >> 17, state ^= state << 5;
      x = static_cast<float>(state) * (4.0f / 4294967296.0f) - 2.0f;
    }
    if (dtype == ps::DType::kF32) {
      std::memcpy(pool.get(), row.data(), bytes);
    } else if (dtype == ps::DType::kQ8_0) {
      ps::QuantizeRowQ8_0(row.data(), reinterpret_cast<ps::BlockQ8_0*>(pool.get()), static_cast<int64_t>(row.size()));
    } else {
      ps::F32ToHalf(dtype, row.data(), reinterpret_cast<uint16_t*>(pool.get()), bytes / 2);
    }
    positions.resize(n);
    for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(i);
    k_blocks.resize(s.n_layers);
    v_blocks.resize(s.n_layers);
    for (int l = 0; l < s.n_layers; ++l) {
      // Per head: its K blocks, then its V blocks, page after page. Chunk c's pages take
      // chunk_pages pages of every layer, layer after layer; within a layer's, block i
      // (K of head i, then V) of every page of the chunk side by side.
      for (int h = 0; h < s.n_kv_heads; ++h) {
        for (int64_t p = 0; p < pages; ++p) {
          const int64_t c = p / chunk_pages, in_chunk = std::min(chunk_pages, pages - c * chunk_pages);
          const uint8_t* run = pool.get() + c * chunk_pages * page + l * in_chunk * layer_blocks;
          const int64_t q = p - c * chunk_pages;
          k_blocks[l].push_back(run + (h * in_chunk + q) * block_bytes);
          v_blocks[l].push_back(run + ((s.n_kv_heads + h) * in_chunk + q) * block_bytes);
        }
      }
      layers.push_back(ps::KvRows{.k_blocks = k_blocks[l].data(),
                                  .v_blocks = v_blocks[l].data(),
                                  .block_rows = block_tokens,
                                  .positions = positions.data(),
                                  .n = n,
                                  .stride = s.head_dim,
                                  .positions_ascending = true,
                                  .dtype = dtype,
                                  .head_cols = s.head_dim,
                                  .head_blocks = pages});
    }
  }
};

// Seconds per call: the best of calls adding up to about `budget_s`.
template <typename Fn>
double BestSeconds(double budget_s, Fn fn) {
  fn();
  double best = 1e30, total = 0;
  for (int r = 0; r < 3 || total < budget_s; ++r) {
    const auto t0 = Clock::now();
    fn();
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, t);
    total += t;
    if (r > 200) break;
  }
  return best;
}

// Layer l's K and V blocks of every stream, in the order a plain read takes them.
std::vector<const void*> BlocksOf(const std::vector<PagedKv>& kvs, int l) {
  std::vector<const void*> blocks;
  for (const PagedKv& kv : kvs) {
    blocks.insert(blocks.end(), kv.k_blocks[l].begin(), kv.k_blocks[l].end());
    blocks.insert(blocks.end(), kv.v_blocks[l].begin(), kv.v_blocks[l].end());
  }
  return blocks;
}

// The blocks (`bytes` each) read with plain loads, summed and nothing else, split between
// the pool's threads as ranges: what the pages' layout leaves a decode step with no
// arithmetic (a prefill chunk's blocks of a head in one run, then a jump), against which
// the kernels' GB/s tell compute from memory. Returns the sum; `sums` holds one per block.
uint64_t ReadBlocks(const std::vector<const void*>& blocks, size_t bytes, std::vector<uint64_t>& sums,
                    ps::ThreadPool& pool) {
  const size_t words = bytes / sizeof(uint64_t);
  sums.resize(blocks.size());
  pool.ParallelFor(std::ssize(blocks), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const auto* w = static_cast<const uint64_t*>(blocks[b]);
      uint64_t sum = 0;
      for (size_t i = 0; i < words; ++i) sum += w[i];
      sums[b] = sum;
    }
  });
  uint64_t total = 0;
  for (uint64_t x : sums) total += x;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string shape_name = "smollm2-135m", kv_dtype = "bf16", cpu_isa;
  std::vector<int64_t> depths = {4096, 8192}, prefills = {2048}, batches = {1};
  int64_t threads = 2, block_tokens = 16, prefill_chunk = 512;
  bool peak = true, cached = false;
  FlagParser flags("ps_bench_attention",
                   "Attention kernel alone on a model's shape over a paged KV laid out as the engine's: decode at\n"
                   "depths (and batches of streams) as a share of the streaming-read bandwidth, causal prefill as a\n"
                   "share of the FP32 FMA peak.");
  flags.AddString("shape", &shape_name, "smollm2-135m | qwen2.5-0.5b | llama3-8b");
  flags.AddString("kv-dtype", &kv_dtype, "f32 | f16 | bf16 | q8_0");
  flags.AddIntList("depth", &depths, "decode depths (keys per stream)");
  flags.AddIntList("batch", &batches, "decode streams per step (each at the depth)");
  flags.AddIntList("prefill", &prefills, "causal prefill lengths (0: none)");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddInt("kv-block-size", &block_tokens, "tokens per KV block");
  flags.AddInt("prefill-chunk", &prefill_chunk,
               "tokens per prefill chunk the KV is laid out by (the server's --prefill-chunk; a page's tokens or "
               "fewer: a cache grown a token at a time)");
  flags.AddString("cpu-isa", &cpu_isa, "cap the CPU kernels' level");
  flags.AddBool("peak", &peak, "measure the machine's ceilings first");
  flags.AddBool("cached", &cached, "decode reads one layer's KV again and again (from the caches where it fits)");
  if (auto st = flags.Parse(argc, argv); !st.ok() || flags.help_requested()) {
    std::fprintf(st.ok() ? stdout : stderr, "%s%s\n", st.ok() ? "" : (std::string(st.message()) + "\n").c_str(),
                 flags.Help().c_str());
    return st.ok() ? 0 : 2;
  }
  const Shape* shape = nullptr;
  for (const Shape& s : kShapes) shape = shape_name == s.name ? &s : shape;
  if (shape == nullptr) return std::fprintf(stderr, "ps_bench_attention: unknown --shape %s\n", shape_name.c_str()), 2;
  const absl::StatusOr<DType> dtype = ParseKvDType(kv_dtype);
  if (!dtype.ok()) return std::fprintf(stderr, "ps_bench_attention: %s\n", dtype.status().ToString().c_str()), 2;
  if (!cpu_isa.empty()) {
    if (absl::Status s = CapCpuKernels(cpu_isa); !s.ok()) {
      return std::fprintf(stderr, "ps_bench_attention: %s\n", s.ToString().c_str()), 2;
    }
  }
  bench::MachinePeak machine;
  if (peak) machine = bench::MeasureMachinePeak(static_cast<int>(threads));
  ThreadPool pool(static_cast<int>(threads));
  std::string backend_note;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu", pool, CpuBackendOptions{}, &backend_note);
  if (!backend.ok()) return std::fprintf(stderr, "ps_bench_attention: %s\n", backend.status().ToString().c_str()), 2;
  if (block_tokens < 1 || prefill_chunk < 0) {
    return std::fprintf(stderr, "ps_bench_attention: --kv-block-size must be >= 1 and --prefill-chunk >= 0\n"), 2;
  }
  const int64_t chunk_pages = std::max<int64_t>(1, prefill_chunk / block_tokens);
  const Shape& s = *shape;
  const AttentionShape ashape{.n_heads = s.n_heads,
                              .n_kv_heads = s.n_kv_heads,
                              .head_dim = s.head_dim,
                              .scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim))};
  const int qd = s.n_heads * s.head_dim;
  const int layers_read = cached ? 1 : s.n_layers;
  std::printf(
      "shape %s (%d query heads, %d KV heads of %d), KV %s in blocks of %lld tokens by prefill chunks of %lld, "
      "%lld threads, CPU %s\n",
      s.name, s.n_heads, s.n_kv_heads, s.head_dim, kv_dtype.c_str(), static_cast<long long>(block_tokens),
      static_cast<long long>(chunk_pages * block_tokens), static_cast<long long>(threads), DescribeCpuIsa().c_str());
  if (peak) {
    std::printf("machine: FP32 FMA %.1f GFLOP/s, streaming read %.1f GB/s\n", machine.fp32_flops / 1e9,
                machine.read_bytes_per_s / 1e9);
  }
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  for (int64_t depth : depths) {
    for (int64_t batch : batches) {
      std::vector<PagedKv> kvs;
      for (int64_t b = 0; b < batch; ++b)
        kvs.emplace_back(**backend, s, *dtype, depth, static_cast<int>(block_tokens), chunk_pages, g);
      std::vector<float> q(batch * qd), out(batch * qd);
      for (float& x : q) x = nd(g);
      const int32_t pos = static_cast<int32_t>(depth - 1);
      const double sec = BestSeconds(0.5,
                                     [&] {
                                       for (int l = 0; l < layers_read; ++l) {
                                         for (int64_t b = 0; b < batch; ++b) {
                                           Attention(ashape, kvs[b].layers[l],
                                                     AttentionArgs{.q = q.data() + b * qd,
                                                                   .q_pos = &pos,
                                                                   .n_q = 1,
                                                                   .q_stride = qd,
                                                                   .out = out.data() + b * qd,
                                                                   .out_stride = qd},
                                                     pool);
                                         }
                                       }
                                     }) /
                         layers_read;
      std::vector<std::vector<const void*>> blocks(layers_read);  // listed before the timing
      for (int l = 0; l < layers_read; ++l) blocks[l] = BlocksOf(kvs, l);
      std::vector<uint64_t> sums;
      volatile uint64_t sink = 0;  // the sums, kept so that the reads stay
      const double read_sec = BestSeconds(0.5,
                                          [&] {
                                            for (int l = 0; l < layers_read; ++l) {
                                              sink = sink + ReadBlocks(blocks[l], kvs[0].block_bytes, sums, pool);
                                            }
                                          }) /
                              layers_read;
      const double bytes = 2.0 * batch * depth * s.n_kv_heads * RowBytes(*dtype, s.head_dim);
      std::printf("decode depth %6lld batch %3lld kv %-4s: %8.1f us per layer, %6.2f GB/s",
                  static_cast<long long>(depth), static_cast<long long>(batch), kv_dtype.c_str(), sec * 1e6,
                  bytes / sec / 1e9);
      if (peak) std::printf(" (%3.0f%% of streaming read)", 100 * bytes / sec / machine.read_bytes_per_s);
      // The plain read takes whole blocks (a last block's unused rows too); its GB/s counts
      // the rows, as the kernel's does.
      std::printf("; the same blocks read plainly %8.1f us, %6.2f GB/s\n", read_sec * 1e6, bytes / read_sec / 1e9);
      std::fflush(stdout);
    }
  }
  for (int64_t n : prefills) {
    if (n <= 0) continue;
    PagedKv kv(**backend, s, *dtype, n, static_cast<int>(block_tokens), chunk_pages, g);
    std::vector<float> q(n * qd), out(n * qd);
    for (float& x : q) x = nd(g);
    const double sec = BestSeconds(1.0, [&] {
      Attention(ashape, kv.layers[0],
                AttentionArgs{.q = q.data(),
                              .q_pos = kv.positions.data(),
                              .n_q = n,
                              .q_stride = qd,
                              .out = out.data(),
                              .out_stride = qd},
                pool);
    });
    const double flops = 4.0 * s.head_dim * s.n_heads * (static_cast<double>(n) * (n + 1) / 2);
    std::printf("prefill %6lld kv %-4s: %8.2f ms per layer, %6.1f GFLOP/s", static_cast<long long>(n), kv_dtype.c_str(),
                sec * 1e3, flops / sec / 1e9);
    if (peak) std::printf(" (%3.0f%% of FP32 FMA peak)", 100 * flops / sec / machine.fp32_flops);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
