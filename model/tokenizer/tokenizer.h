// Text <-> token ids for SentencePiece-style (LLaMA-2, Mistral, TinyStories) and
// byte-level BPE (GPT-2, LLaMA-3, Qwen2, SmolLM2) vocabularies, loaded from GGUF
// metadata or a Hugging Face tokenizer.json. Thread-safe after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/pretokenizer.h"

namespace ps {

class GgufFile;

enum class TokenizerKind { kSpm, kBpe };

// GGUF token types.
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct VocabData {
  TokenizerKind kind = TokenizerKind::kSpm;
  PreTokenizer pre = PreTokenizer::kGpt2;
  std::vector<std::string> tokens;  // as stored (SPM: '▁' for spaces; BPE: byte-mapped)
  std::vector<float> scores;        // SPM merge scores (may be empty for BPE)
  std::vector<TokenType> types;
  std::vector<std::pair<std::string, std::string>> merges;  // BPE, in rank order
  int32_t bos = -1, eos = -1, unk = -1, eot = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SPM dummy prefix
  bool ignore_merges = false;     // BPE: a word that is itself a token is not merged
  std::string chat_template;
};

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(VocabData data);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  // tokenizer.json text, and optionally tokenizer_config.json text ("" if absent).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(std::string_view tokenizer_json,
                                                               std::string_view tokenizer_config_json);

  // add_special: prepend BOS (and append EOS) as the vocabulary says.
  // parse_special: control tokens written in the text (e.g. "<|im_start|>") become
  // their ids; user-defined added tokens are always matched.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;
  // Concatenated text of ids. Control tokens are rendered unless skip_special. For
  // SPM vocabularies with a dummy prefix the leading space of the first token is removed.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // Raw bytes of one token (no prefix handling); may be part of a UTF-8 character.
  std::string TokenBytes(int32_t id) const;

  int vocab_size() const { return static_cast<int>(data_.tokens.size()); }
  TokenizerKind kind() const { return data_.kind; }
  int32_t bos_id() const { return data_.bos; }
  int32_t eos_id() const { return data_.eos; }
  bool add_bos() const { return data_.add_bos; }
  bool IsEndOfGeneration(int32_t id) const;
  bool IsControl(int32_t id) const;
  const std::string& chat_template() const { return data_.chat_template; }
  const std::string& token_text(int32_t id) const { return data_.tokens[id]; }
  std::optional<int32_t> FindToken(std::string_view text) const;
  std::span<const int32_t> end_of_generation_ids() const { return eog_; }

 private:
  explicit Tokenizer(VocabData data) : data_(std::move(data)) {}
  absl::Status Init();
  void EncodeSpm(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeBpeWord(const std::string& word, std::vector<int32_t>* out) const;
  void AppendSpmSymbol(std::string_view text, std::vector<int32_t>* out) const;

  VocabData data_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<int32_t> special_;  // tokens matched in text before tokenisation, longest first
  std::vector<int32_t> eog_;
  int32_t byte_tokens_[256];  // SPM: id of <0xXX>; BPE: id of the mapped byte character
  // BPE: (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_ranks_;
  // SPM: merged token -> the pair it was built from (for resegmentation)
};

// Incremental detokenizer for streaming: returns only complete UTF-8 characters and
// holds back a trailing partial one until the next token completes it.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(tok), skip_special_(skip_special) {}
  // Text newly completed by `id` (possibly empty).
  std::string Push(int32_t id);
  // Whatever is still held back (invalid bytes are emitted as U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace ps
