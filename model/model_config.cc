// Model configuration from GGUF metadata or a Hugging Face config.json.
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/quant.h"
#include "model/json_numbers.h"
#include "model/model.h"

namespace ps {
namespace {

absl::StatusOr<Arch> ParseArch(const std::string& name) {
  if (name == "llama" || name == "mistral") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  return absl::UnimplementedError(absl::StrCat("unsupported architecture '", name, "' (supported: llama, qwen2)"));
}

}  // namespace

std::vector<float> Llama3FreqFactors(int n_dims, float base, float factor, float low_freq_factor,
                                     float high_freq_factor, int original_ctx) {
  std::vector<float> out(n_dims / 2);
  const double low_wavelen = original_ctx / low_freq_factor;
  const double high_wavelen = original_ctx / high_freq_factor;
  for (int i = 0; i < n_dims / 2; ++i) {
    const double freq = std::pow(static_cast<double>(base), -2.0 * i / n_dims);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      out[i] = 1.0f;
    } else if (wavelen > low_wavelen) {
      out[i] = factor;
    } else {
      const double smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out[i] = static_cast<float>(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return out;
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& f) {
  ModelConfig c;
  PS_ASSIGN_OR_RETURN(auto arch, f.GetString("general.architecture"));
  if (!arch) return absl::InvalidArgumentError(absl::StrCat(f.source(), ": missing general.architecture"));
  c.arch_name = *arch;
  PS_ASSIGN_OR_RETURN(c.arch, ParseArch(c.arch_name));
  PS_ASSIGN_OR_RETURN(auto name, f.GetString("general.name"));
  c.name = name.value_or(c.arch_name);
  const std::string a = c.arch_name + ".";
  auto req_int = [&](const std::string& key, int* out) -> absl::Status {
    PS_ASSIGN_OR_RETURN(auto v, f.GetInt(a + key));
    if (!v) return absl::InvalidArgumentError(absl::StrCat(f.source(), ": missing ", a, key));
    if (*v <= 0 || *v > (int64_t{1} << 30))
      return absl::InvalidArgumentError(absl::StrCat(f.source(), ": bad ", a, key));
    *out = static_cast<int>(*v);
    return absl::OkStatus();
  };
  PS_RETURN_IF_ERROR(req_int("embedding_length", &c.n_embd));
  PS_RETURN_IF_ERROR(req_int("block_count", &c.n_layers));
  PS_RETURN_IF_ERROR(req_int("feed_forward_length", &c.n_ff));
  PS_RETURN_IF_ERROR(req_int("attention.head_count", &c.n_heads));
  PS_RETURN_IF_ERROR(req_int("context_length", &c.n_ctx));
  PS_ASSIGN_OR_RETURN(auto kv_heads, f.GetInt(a + "attention.head_count_kv"));
  c.n_kv_heads = static_cast<int>(kv_heads.value_or(c.n_heads));
  c.head_dim = c.n_heads > 0 ? c.n_embd / c.n_heads : 0;
  PS_ASSIGN_OR_RETURN(auto key_len, f.GetInt(a + "attention.key_length"));
  if (key_len) c.head_dim = static_cast<int>(*key_len);
  PS_ASSIGN_OR_RETURN(auto eps, f.GetFloat(a + "attention.layer_norm_rms_epsilon"));
  c.rms_eps = static_cast<float>(eps.value_or(1e-5));
  PS_ASSIGN_OR_RETURN(auto base, f.GetFloat(a + "rope.freq_base"));
  c.rope.freq_base = static_cast<float>(base.value_or(10000.0));
  PS_ASSIGN_OR_RETURN(auto rope_dims, f.GetInt(a + "rope.dimension_count"));
  c.rope.n_dims = static_cast<int>(rope_dims.value_or(c.head_dim));
  c.rope.neox = c.arch == Arch::kQwen2;
  PS_ASSIGN_OR_RETURN(auto scaling_type, f.GetString(a + "rope.scaling.type"));
  PS_ASSIGN_OR_RETURN(auto scaling_factor, f.GetFloat(a + "rope.scaling.factor"));
  PS_ASSIGN_OR_RETURN(auto scale_linear, f.GetFloat(a + "rope.scale_linear"));
  const std::string stype = scaling_type.value_or("none");
  if (stype == "linear") {
    if (!scaling_factor || *scaling_factor <= 0)
      return absl::InvalidArgumentError("linear rope scaling needs a factor");
    c.rope.freq_scale = static_cast<float>(1.0 / *scaling_factor);
  } else if (stype != "none") {
    return absl::UnimplementedError(absl::StrCat(f.source(), ": rope scaling '", stype, "' is not supported"));
  } else if (scale_linear && *scale_linear > 0) {
    c.rope.freq_scale = static_cast<float>(1.0 / *scale_linear);
  }
  if (const GgufTensor* rf = f.FindTensor("rope_freqs.weight")) {
    if (rf->type != DType::kF32 || rf->dims.size() != 1) {
      return absl::InvalidArgumentError("rope_freqs.weight must be a 1-D F32 tensor");
    }
    c.rope.freq_factors.resize(rf->dims[0]);
    DequantizeRow(DType::kF32, rf->data, c.rope.freq_factors.data(), rf->dims[0]);
  }
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(f.source(), ": missing 2-D tensor token_embd.weight"));
  }
  c.n_vocab = static_cast<int>(embd->dims[1]);
  return c;
}

absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json is not a JSON object");
  PS_RETURN_IF_ERROR(CheckJsonNumbers(j, "config.json"));
  ModelConfig c;
  try {  // a field of the wrong type throws: every read is inside
    const std::string type = j.value("model_type", "");
    PS_ASSIGN_OR_RETURN(c.arch, ParseArch(type));
    c.arch_name = type;
    c.name = j.value("_name_or_path", type);
    c.n_vocab = j.at("vocab_size").get<int>();
    c.n_embd = j.at("hidden_size").get<int>();
    c.n_layers = j.at("num_hidden_layers").get<int>();
    c.n_heads = j.at("num_attention_heads").get<int>();
    c.n_kv_heads = j.value("num_key_value_heads", c.n_heads);
    c.n_ff = j.at("intermediate_size").get<int>();
    c.n_ctx = j.value("max_position_embeddings", 2048);
    c.rms_eps = j.value("rms_norm_eps", 1e-6f);
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int>()
                                                                    : (c.n_heads > 0 ? c.n_embd / c.n_heads : 0);
    // transformers 5 writes the rope settings as one object, rope_parameters (its
    // rope_theta and, where scaled, rope_type and the scaling fields); before, as
    // rope_theta and rope_scaling at the top level.
    const bool v5 = j.contains("rope_parameters") && j["rope_parameters"].is_object();
    const nlohmann::json& rope = v5 ? j["rope_parameters"] : j;
    c.rope.freq_base = rope.value("rope_theta", j.value("rope_theta", 10000.0f));
    c.rope.n_dims = c.head_dim;
    // HF checkpoints keep q/k unpermuted: rotate_half pairs (i, i + d/2) for every arch.
    c.rope.neox = true;
    c.qkv_bias = c.arch == Arch::kQwen2 || j.value("attention_bias", false);
    if (v5 || (j.contains("rope_scaling") && j["rope_scaling"].is_object())) {
      const auto& rs = v5 ? rope : j["rope_scaling"];
      const std::string rt = rs.value("rope_type", rs.value("type", ""));
      const float factor = rs.value("factor", 1.0f);
      if (rt == "linear") {
        c.rope.freq_scale = 1.0f / factor;
      } else if (rt == "llama3") {
        // The factors are sized from head_dim before ValidateConfig sees it.
        if (c.rope.n_dims <= 0 || c.rope.n_dims > kMaxHeadDim) {
          return absl::InvalidArgumentError(
              absl::StrCat("config.json: head_dim ", c.rope.n_dims, " is outside 1..", kMaxHeadDim));
        }
        c.rope.freq_factors =
            Llama3FreqFactors(c.rope.n_dims, c.rope.freq_base, factor, rs.value("low_freq_factor", 1.0f),
                              rs.value("high_freq_factor", 4.0f), rs.value("original_max_position_embeddings", 8192));
      } else if (!rt.empty() && rt != "default") {
        return absl::UnimplementedError(absl::StrCat("rope scaling '", rt, "' is not supported"));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
  return c;
}

}  // namespace ps
