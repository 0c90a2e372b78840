#include "model/model.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/rope.h"

namespace ps {
namespace {

absl::Status ShapeError(const std::string& name, const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(got, ", "),
                                                 "], expected [", absl::StrJoin(want, ", "), "]"));
}

absl::StatusOr<const TensorRef*> Find(const TensorMap& t, const std::string& name, std::vector<int64_t> dims,
                                      bool optional = false) {
  auto it = t.find(name);
  if (it == t.end()) {
    if (optional) return nullptr;
    return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
  }
  if (it->second.dims != dims) return ShapeError(name, it->second.dims, dims);
  return &it->second;
}

absl::StatusOr<MatrixView> Matrix(const TensorMap& t, const std::string& name, int64_t rows, int64_t cols) {
  PS_ASSIGN_OR_RETURN(const TensorRef* ref, Find(t, name, {cols, rows}));
  if (cols % Traits(ref->type).block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " row length is not a multiple of its block"));
  }
  if (ref->nbytes < RowBytes(ref->type, cols) * static_cast<size_t>(rows)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has too few bytes"));
  }
  // Kernels read F32 as floats and every other format through 16-bit fields.
  if (reinterpret_cast<uintptr_t>(ref->data) % (ref->type == DType::kF32 ? 4 : 2) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is not aligned in memory"));
  }
  return MatrixView{.type = ref->type, .data = ref->data, .rows = rows, .cols = cols};
}

absl::StatusOr<std::vector<float>> Vector(const TensorMap& t, const std::string& name, int64_t n,
                                          bool optional = false) {
  PS_ASSIGN_OR_RETURN(const TensorRef* ref, Find(t, name, {n}, optional));
  std::vector<float> out;
  if (ref == nullptr) return out;
  if (ref->type != DType::kF32 && ref->type != DType::kF16 && ref->type != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " must be F32, F16 or BF16, not ", std::string(DTypeName(ref->type))));
  }
  if (ref->nbytes < RowBytes(ref->type, n)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has too few bytes"));
  }
  out.resize(n);
  DequantizeRow(ref->type, ref->data, out.data(), n);
  for (float v : out) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has non-finite values"));
  }
  return out;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::Status ValidateConfig(const ModelConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("model config: " + what); };
  if (c.n_vocab <= 0 || c.n_embd <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.n_ff <= 0) {
    return bad("sizes must be positive");
  }
  if (c.n_heads % c.n_kv_heads != 0) return bad("head_count must be a multiple of head_count_kv");
  if (c.n_layers > 1024 || c.n_embd > (1 << 20) || c.n_ff > (1 << 22) || c.head_dim > kMaxHeadDim) {
    return bad("implausibly large sizes");
  }
  if (c.rope.n_dims <= 0 || c.rope.n_dims > c.head_dim || c.rope.n_dims % 2 != 0) {
    return bad(absl::StrCat("rope dimension ", c.rope.n_dims, " must be even and <= head_dim ", c.head_dim));
  }
  if (!c.rope.freq_factors.empty() && static_cast<int>(c.rope.freq_factors.size()) != c.rope.n_dims / 2) {
    return bad("rope_freqs must have rope_dim/2 entries");
  }
  if (!(c.rms_eps > 0) || !(c.rope.freq_base > 0) || !(c.rope.freq_scale > 0)) {
    return bad("rms epsilon, rope base and rope scale must be positive");
  }
  if (c.n_ctx <= 0) return bad("context length must be positive");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(ModelConfig config, const TensorMap& t,
                                                    std::unique_ptr<Tokenizer> tokenizer,
                                                    std::shared_ptr<void> keep_alive,
                                                    std::vector<const MappedFile*> mapped) {
  PS_RETURN_IF_ERROR(ValidateConfig(config));
  auto m = std::unique_ptr<Model>(new Model());
  static std::atomic<uint64_t> last_id{0};
  m->id_ = ++last_id;
  const ModelConfig& c = config;
  PS_ASSIGN_OR_RETURN(m->tok_embd, Matrix(t, "token_embd.weight", c.n_vocab, c.n_embd));
  if (t.count("output.weight") != 0) {
    PS_ASSIGN_OR_RETURN(m->output, Matrix(t, "output.weight", c.n_vocab, c.n_embd));
  } else {
    m->output = m->tok_embd;
  }
  PS_ASSIGN_OR_RETURN(m->output_norm, Vector(t, "output_norm.weight", c.n_embd));
  m->layers.resize(c.n_layers);
  std::vector<float> mean_rotation;  // of the k biases, once a layer has one
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights& w = m->layers[l];
    PS_ASSIGN_OR_RETURN(w.attn_norm, Vector(t, p + "attn_norm.weight", c.n_embd));
    PS_ASSIGN_OR_RETURN(w.ffn_norm, Vector(t, p + "ffn_norm.weight", c.n_embd));
    PS_ASSIGN_OR_RETURN(w.wq, Matrix(t, p + "attn_q.weight", c.q_dim(), c.n_embd));
    PS_ASSIGN_OR_RETURN(w.wk, Matrix(t, p + "attn_k.weight", c.kv_dim(), c.n_embd));
    PS_ASSIGN_OR_RETURN(w.wv, Matrix(t, p + "attn_v.weight", c.kv_dim(), c.n_embd));
    PS_ASSIGN_OR_RETURN(w.wo, Matrix(t, p + "attn_output.weight", c.n_embd, c.q_dim()));
    PS_ASSIGN_OR_RETURN(w.w_gate, Matrix(t, p + "ffn_gate.weight", c.n_ff, c.n_embd));
    PS_ASSIGN_OR_RETURN(w.w_up, Matrix(t, p + "ffn_up.weight", c.n_ff, c.n_embd));
    PS_ASSIGN_OR_RETURN(w.w_down, Matrix(t, p + "ffn_down.weight", c.n_embd, c.n_ff));
    const bool bias_required = c.qkv_bias;
    PS_ASSIGN_OR_RETURN(w.bq, Vector(t, p + "attn_q.bias", c.q_dim(), !bias_required));
    PS_ASSIGN_OR_RETURN(w.bk, Vector(t, p + "attn_k.bias", c.kv_dim(), !bias_required));
    PS_ASSIGN_OR_RETURN(w.bv, Vector(t, p + "attn_v.bias", c.kv_dim(), !bias_required));
    if (!w.bk.empty()) {
      if (mean_rotation.empty()) {
        mean_rotation.resize(c.rope.n_dims);
        RopeMeanCache(c.rope, c.n_ctx, mean_rotation.data());
      }
      w.bk_shift = w.bk;
      RopeApply(c.rope, mean_rotation.data(), w.bk_shift.data(), c.n_kv_heads, c.head_dim);
      for (float& s : w.bk_shift) s = -s;
    }
  }
  if (tokenizer != nullptr && tokenizer->vocab_size() > c.n_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", tokenizer->vocab_size(), " tokens but the embedding only ", c.n_vocab));
  }
  m->config_ = std::move(config);
  m->tokenizer_ = std::move(tokenizer);
  m->keep_alive_ = std::move(keep_alive);
  m->mapped_ = std::move(mapped);
  return m;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  if (IsDirectory(path)) return LoadHfModel(path);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  PS_ASSIGN_OR_RETURN(ModelConfig config, ConfigFromGguf(*file));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromGguf(*file));
  TensorMap tensors;
  for (const GgufTensor& t : file->tensors()) {
    tensors[t.name] = TensorRef{.type = t.type, .dims = t.dims, .data = t.data, .nbytes = t.nbytes};
  }
  std::shared_ptr<GgufFile> shared(std::move(file));
  std::vector<const MappedFile*> mapped;
  if (shared->mapping() != nullptr) mapped.push_back(shared->mapping());
  auto model = Build(std::move(config), tensors, std::move(tokenizer), shared, std::move(mapped));
  if (!model.ok()) return absl::Status(model.status().code(), absl::StrCat(path, ": ", model.status().message()));
  return model;
}

std::vector<MatrixView*> Model::Matrices() {
  std::vector<MatrixView*> out = {&output};
  for (LayerWeights& l : layers) {
    for (MatrixView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) out.push_back(w);
  }
  return out;
}

uint8_t* Model::AllocateWeightLayout(size_t bytes) {
  LargeBuffer b = AllocateLargeBuffer(bytes);
  return b == nullptr ? nullptr : weight_layouts_.emplace_back(std::move(b)).get();
}

void Model::ReleaseFilePages(const MatrixView& w) const {
  for (const MappedFile* f : mapped_) f->ReleasePages(w.data, w.row_bytes() * static_cast<size_t>(w.rows));
}

absl::StatusOr<size_t> PrepareWeights(Model& model, Backend& backend) {
  // Every layout in one buffer (on huge pages where offered: base/large_buffer.h), each at
  // a multiple of 64 bytes.
  auto layout_bytes = [&](const MatrixView& w) {
    return w.packed == nullptr ? (backend.PackedWeightBytes(w) + 63) / 64 * 64 : 0;
  };
  size_t packed = 0;
  for (MatrixView* w : model.Matrices()) packed += layout_bytes(*w);
  uint8_t* dst = nullptr;
  if (packed > 0 && (dst = model.AllocateWeightLayout(packed)) == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", packed, " bytes for the repacked weights"));
  }
  backend.UseWeightsOf(model.id());
  backend.PrepareWeights(model.tok_embd);
  // Packed a part of a matrix at a time, each part's file pages let go once it is packed: the
  // two copies never stand together beyond a part. A tied output matrix is the embedding
  // table too: the look-ups read a few of its rows in place, which come back from the file as
  // they are read.
  constexpr int64_t kPartRows = 16 * Backend::kPackedRowGroup;
  for (MatrixView* w : model.Matrices()) {
    if (const size_t bytes = layout_bytes(*w); bytes > 0) {
      for (int64_t r0 = 0; r0 < w->rows; r0 += kPartRows) {
        MatrixView first = *w, part = *w;
        first.rows = r0;
        part.data = w->Row(r0);
        part.rows = std::min(kPartRows, w->rows - r0);
        backend.PackWeights(part, dst + (r0 > 0 ? backend.PackedWeightBytes(first) : 0));
        model.ReleaseFilePages(part);
      }
      w->packed = dst;
      dst += bytes;
    }
    backend.PrepareWeights(*w);
  }
  PS_RETURN_IF_ERROR(backend.Synchronize());
  return packed;
}

}  // namespace ps
