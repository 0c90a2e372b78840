// Loading a Hugging Face model folder: config.json, *.safetensors, tokenizer.json.
// HF tensor names are mapped to the GGUF names the model builder expects.
#include <dirent.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace ps {
namespace {

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight"
std::string GgufName(const std::string& hf) {
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},       {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},       {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},        {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    const size_t dot = hf.find('.', prefix.size());
    if (dot == std::string::npos) return "";
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    const std::string rest = hf.substr(dot + 1);
    for (const auto& [from, to] : kLayer) {
      if (rest == from) return absl::StrCat("blk.", layer, ".", to);
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadHfModel(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(std::string config_text, ReadFileToString(dir + "/config.json"));
  PS_ASSIGN_OR_RETURN(ModelConfig config, ConfigFromHfJson(config_text));
  PS_ASSIGN_OR_RETURN(std::string tok_text, ReadFileToString(dir + "/tokenizer.json"));
  std::string tok_config = ReadFileToString(dir + "/tokenizer_config.json").value_or("");
  // transformers 5 saves the chat template beside tokenizer_config.json, as a file.
  if (absl::StatusOr<std::string> jinja = ReadFileToString(dir + "/chat_template.jinja"); jinja.ok()) {
    nlohmann::json cfg = nlohmann::json::parse(tok_config.empty() ? "{}" : tok_config, nullptr, false);
    if (cfg.is_object() && !cfg.contains("chat_template")) {
      cfg["chat_template"] = *jinja;
      tok_config = cfg.dump();
    }
  }
  PS_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromHfJson(tok_text, tok_config));

  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
        files.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no .safetensors files"));
  std::sort(files.begin(), files.end());
  // Keeps the mapped files, and aligned copies of tensors whose offset in the file
  // is not a multiple of their element size (safetensors does not promise alignment).
  struct Storage {
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    std::vector<std::vector<uint8_t>> copies;
  };
  auto owned = std::make_shared<Storage>();
  TensorMap tensors;
  for (const std::string& f : files) {
    PS_ASSIGN_OR_RETURN(auto st, SafetensorsFile::Open(f));
    for (const auto& [name, t] : st->tensors()) {
      const std::string g = GgufName(name);
      if (g.empty()) continue;  // e.g. rotary inv_freq buffers
      std::vector<int64_t> dims(t.shape.rbegin(), t.shape.rend());
      const uint8_t* data = t.data;
      if (reinterpret_cast<uintptr_t>(data) % (t.type == DType::kF32 ? 4 : 2) != 0) {
        owned->copies.emplace_back(t.data, t.data + t.nbytes);
        data = owned->copies.back().data();
      }
      tensors[g] = TensorRef{.type = t.type, .dims = dims, .data = data, .nbytes = t.nbytes};
    }
    owned->files.push_back(std::move(st));
  }
  std::vector<const MappedFile*> mapped;
  for (const auto& f : owned->files) mapped.push_back(f->mapping());
  return Model::Build(std::move(config), tensors, std::move(tokenizer), owned, std::move(mapped));
}

}  // namespace ps
