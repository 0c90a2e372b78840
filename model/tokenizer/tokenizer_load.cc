// Building a Tokenizer from GGUF metadata or Hugging Face tokenizer.json.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "model/gguf.h"
#include "model/tokenizer/tokenizer.h"

namespace ps {
namespace {

absl::StatusOr<PreTokenizer> PreFromGgufName(const std::string& name) {
  if (name.empty() || name == "default" || name == "gpt-2" || name == "gpt2" || name == "starcoder" ||
      name == "refact") {
    return PreTokenizer::kGpt2;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3") return PreTokenizer::kLlama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokenizer::kQwen2;
  if (name == "smollm") return PreTokenizer::kSmolLM;
  return absl::UnimplementedError(absl::StrCat("unsupported BPE pre-tokenizer '", name, "'"));
}

std::pair<std::string, std::string> SplitMerge(const std::string& m) {
  const size_t sp = m.find(' ', 1);  // a merge's left part is never empty
  if (sp == std::string::npos) return {m, ""};
  return {m.substr(0, sp), m.substr(sp + 1)};
}

// A token id from tokenizer.json: an integer (a float such as 2.6e26 must not be converted, which is
// undefined behaviour in nlohmann's get<int64_t>). Range checks are the caller's.
int64_t JsonTokenId(const nlohmann::json& v) {
  if (!v.is_number_integer()) {
    throw nlohmann::json::type_error::create(302, "token id must be an integer, not " + std::string(v.type_name()), &v);
  }
  return v.get<int64_t>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  VocabData d;
  PS_ASSIGN_OR_RETURN(auto model, f.GetString("tokenizer.ggml.model"));
  if (!model) return absl::InvalidArgumentError(absl::StrCat(f.source(), ": no tokenizer.ggml.model"));
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != GgufValueType::kArray || tokens->elem_type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(f.source(), ": tokenizer.ggml.tokens missing or not strings"));
  }
  d.tokens = tokens->strings;
  const size_t n = d.tokens.size();
  if (const GgufValue* s = f.Find("tokenizer.ggml.scores")) {
    if (s->floats.size() != n) return absl::InvalidArgumentError("tokenizer.ggml.scores has the wrong length");
    d.scores.assign(s->floats.begin(), s->floats.end());
  }
  if (const GgufValue* t = f.Find("tokenizer.ggml.token_type")) {
    if (t->ints.size() != n) return absl::InvalidArgumentError("tokenizer.ggml.token_type has the wrong length");
    for (int64_t v : t->ints) d.types.push_back(static_cast<TokenType>(v));
  }
  auto get_id = [&](const char* key, int32_t* out) -> absl::Status {
    PS_ASSIGN_OR_RETURN(auto v, f.GetInt(key));
    if (v) {
      if (*v < 0 || *v >= static_cast<int64_t>(n))
        return absl::InvalidArgumentError(absl::StrCat(key, " out of range"));
      *out = static_cast<int32_t>(*v);
    }
    return absl::OkStatus();
  };
  if (*model == "llama") {
    d.kind = TokenizerKind::kSpm;
    d.bos = 1, d.eos = 2, d.unk = 0;
    d.add_bos = true;
    d.add_space_prefix = true;
  } else if (*model == "gpt2") {
    d.kind = TokenizerKind::kBpe;
    const GgufValue* merges = f.Find("tokenizer.ggml.merges");
    if (merges == nullptr || merges->elem_type != GgufValueType::kString) {
      return absl::InvalidArgumentError(absl::StrCat(f.source(), ": BPE vocabulary without tokenizer.ggml.merges"));
    }
    for (const std::string& m : merges->strings) d.merges.push_back(SplitMerge(m));
    PS_ASSIGN_OR_RETURN(auto pre, f.GetString("tokenizer.ggml.pre"));
    PS_ASSIGN_OR_RETURN(d.pre, PreFromGgufName(pre.value_or("default")));
    d.ignore_merges = d.pre == PreTokenizer::kLlama3;
    d.bos = 11, d.eos = 11;  // llama.cpp's GPT-2 defaults, overridden by metadata below
    if (n <= 11) d.bos = d.eos = -1;
  } else {
    return absl::UnimplementedError(absl::StrCat(f.source(), ": unsupported tokenizer model '", *model, "'"));
  }
  PS_RETURN_IF_ERROR(get_id("tokenizer.ggml.bos_token_id", &d.bos));
  PS_RETURN_IF_ERROR(get_id("tokenizer.ggml.eos_token_id", &d.eos));
  PS_RETURN_IF_ERROR(get_id("tokenizer.ggml.unknown_token_id", &d.unk));
  PS_RETURN_IF_ERROR(get_id("tokenizer.ggml.eot_token_id", &d.eot));
  PS_ASSIGN_OR_RETURN(auto add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  PS_ASSIGN_OR_RETURN(auto add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
  PS_ASSIGN_OR_RETURN(auto add_space, f.GetBool("tokenizer.ggml.add_space_prefix"));
  if (add_bos) d.add_bos = *add_bos;
  if (add_eos) d.add_eos = *add_eos;
  if (add_space) d.add_space_prefix = *add_space;
  PS_ASSIGN_OR_RETURN(auto tmpl, f.GetString("tokenizer.chat_template"));
  d.chat_template = tmpl.value_or("");
  return Create(std::move(d));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(std::string_view tokenizer_json,
                                                                 std::string_view tokenizer_config_json) {
  using nlohmann::json;
  json j = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  VocabData d;
  try {
    const json& model = j.at("model");
    if (model.value("type", "") != "BPE") {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json model type '", model.value("type", ""), "' is not supported (only BPE)"));
    }
    const json& vocab = model.at("vocab");
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max<int64_t>(max_id, JsonTokenId(it.value()));
    for (const json& t : j.value("added_tokens", json::array()))
      max_id = std::max<int64_t>(max_id, JsonTokenId(t.at("id")));
    if (max_id < 0 || max_id > (1 << 24)) return absl::InvalidArgumentError("tokenizer.json: bad vocabulary ids");
    d.tokens.assign(max_id + 1, "");
    d.types.assign(max_id + 1, TokenType::kUnused);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = JsonTokenId(it.value());
      if (id < 0) return absl::InvalidArgumentError("tokenizer.json: negative token id");
      d.tokens[id] = it.key();
      d.types[id] = TokenType::kNormal;
    }
    for (const json& m : model.value("merges", json::array())) {
      if (m.is_string()) {
        d.merges.push_back(SplitMerge(m.get<std::string>()));
      } else {
        d.merges.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
      }
    }
    for (const json& t : j.value("added_tokens", json::array())) {
      const int64_t id = JsonTokenId(t.at("id"));
      if (id < 0 || id > max_id) return absl::InvalidArgumentError("tokenizer.json: bad added token id");
      d.tokens[id] = t.at("content").get<std::string>();
      d.types[id] = t.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
    }
    const bool byte_fallback = model.value("byte_fallback", false);
    if (byte_fallback) {
      // SentencePiece exported as BPE (LLaMA-2, Mistral): merges by rank; scores from ranks.
      d.kind = TokenizerKind::kSpm;
      d.add_space_prefix = true;
      d.scores.assign(d.tokens.size(), 0.0f);
      for (size_t r = 0; r < d.merges.size(); ++r) {
        auto it = vocab.find(d.merges[r].first + d.merges[r].second);
        if (it == vocab.end()) continue;
        float& score = d.scores[JsonTokenId(*it)];
        if (score == 0.0f) score = -1.0f - r;
      }
      for (size_t id = 0; id < d.tokens.size(); ++id) {
        const std::string& s = d.tokens[id];
        if (s.size() == 6 && s.rfind("<0x", 0) == 0 && s.back() == '>') d.types[id] = TokenType::kByte;
      }
    } else {
      d.kind = TokenizerKind::kBpe;
      d.ignore_merges = model.value("ignore_merges", false);
      const std::string pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"].dump() : "";
      if (pre.find("\\\\p{N}{1,3}") != std::string::npos) {
        d.pre = PreTokenizer::kLlama3;
      } else if (pre.find("(?i:'s") != std::string::npos) {
        d.pre = PreTokenizer::kQwen2;
      } else if (pre.find("\"Digits\"") != std::string::npos) {
        d.pre = PreTokenizer::kSmolLM;
      } else {
        d.pre = PreTokenizer::kGpt2;
      }
    }
    if (!tokenizer_config_json.empty()) {
      json c = json::parse(tokenizer_config_json, nullptr, false);
      if (c.is_object()) {
        auto token_of = [&](const char* key) -> int32_t {
          if (!c.contains(key) || c[key].is_null()) return -1;
          const json& v = c[key];
          const std::string s = v.is_string() ? v.get<std::string>() : v.value("content", "");
          for (size_t id = 0; id < d.tokens.size(); ++id) {
            if (d.tokens[id] == s) return static_cast<int32_t>(id);
          }
          return -1;
        };
        d.bos = token_of("bos_token");
        d.eos = token_of("eos_token");
        d.unk = token_of("unk_token");
        d.add_bos = c.value("add_bos_token", d.kind == TokenizerKind::kSpm) && d.bos >= 0;
        d.add_eos = c.value("add_eos_token", false);
        if (c.contains("chat_template") && c["chat_template"].is_string()) d.chat_template = c["chat_template"];
      }
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
  return Create(std::move(d));
}

}  // namespace ps
