#include "model/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <queue>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/unicode.h"

namespace ps {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 '▁'

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t j = s.find(from, i);
    out.append(s.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) return out;
    out.append(to);
    i = j + from.size();
  }
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// One piece of the input: raw text to tokenise, or an already recognised token.
struct Fragment {
  std::string_view text;
  int32_t token = -1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(VocabData data) {
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer(std::move(data)));
  PS_RETURN_IF_ERROR(t->Init());
  return t;
}

absl::Status Tokenizer::Init() {
  const int n = vocab_size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer: empty vocabulary");
  if (data_.types.empty()) data_.types.assign(n, TokenType::kNormal);
  if (static_cast<int>(data_.types.size()) != n ||
      (!data_.scores.empty() && static_cast<int>(data_.scores.size()) != n)) {
    return absl::InvalidArgumentError("tokenizer: token, score and type arrays differ in length");
  }
  for (int32_t* id : {&data_.bos, &data_.eos, &data_.unk, &data_.eot}) {
    if (*id >= n) return absl::InvalidArgumentError(absl::StrCat("tokenizer: special token id ", *id, " out of range"));
  }
  token_to_id_.reserve(n);
  for (int32_t i = 0; i < n; ++i) token_to_id_.emplace(data_.tokens[i], i);
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), -1);
  for (int b = 0; b < 256; ++b) {
    std::string key;
    if (data_.kind == TokenizerKind::kSpm) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      key = buf;
    } else {
      unicode::AppendUtf8(ByteToUnicode(static_cast<uint8_t>(b)), &key);
    }
    if (auto it = token_to_id_.find(key); it != token_to_id_.end()) byte_tokens_[b] = it->second;
  }
  if (data_.kind == TokenizerKind::kBpe) {
    merge_ranks_.reserve(data_.merges.size());
    for (size_t r = 0; r < data_.merges.size(); ++r) {
      const auto& [a, b] = data_.merges[r];
      auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), im = token_to_id_.find(a + b);
      if (ia == token_to_id_.end() || ib == token_to_id_.end() || im == token_to_id_.end()) continue;
      merge_ranks_.emplace(PairKey(ia->second, ib->second), std::make_pair(static_cast<int32_t>(r), im->second));
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = data_.types[i];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined) && !data_.tokens[i].empty()) special_.push_back(i);
  }
  std::stable_sort(special_.begin(), special_.end(),
                   [&](int32_t a, int32_t b) { return data_.tokens[a].size() > data_.tokens[b].size(); });
  // End of generation: EOS, EOT and the end markers of the common chat formats.
  auto add_eog = [&](int32_t id) {
    if (id >= 0 && std::find(eog_.begin(), eog_.end(), id) == eog_.end()) eog_.push_back(id);
  };
  add_eog(data_.eos);
  add_eog(data_.eot);
  for (const char* s : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "<|eom_id|>"}) {
    if (auto id = FindToken(s); id && IsControl(*id)) add_eog(*id);
  }
  return absl::OkStatus();
}

std::optional<int32_t> Tokenizer::FindToken(std::string_view text) const {
  auto it = token_to_id_.find(std::string(text));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && data_.types[id] == TokenType::kControl;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special, bool parse_special) const {
  // Split the text at special tokens (longest first at each position).
  std::vector<Fragment> frags;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t hit = -1;
    for (int32_t id : special_) {
      if (!parse_special && data_.types[id] == TokenType::kControl) continue;
      const std::string& s = data_.tokens[id];
      if (text.compare(i, s.size(), s) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (start < i) frags.push_back({text.substr(start, i - start)});
    frags.push_back({{}, hit});
    i += data_.tokens[hit].size();
    start = i;
  }
  if (start < text.size()) frags.push_back({text.substr(start)});

  std::vector<int32_t> out;
  if (add_special && data_.add_bos && data_.bos >= 0) out.push_back(data_.bos);
  bool prev_special = true;  // the SPM dummy prefix goes on text at the start or after a special token
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (data_.kind == TokenizerKind::kSpm) {
      std::string s =
          (data_.add_space_prefix && prev_special) ? absl::StrCat(" ", std::string(f.text)) : std::string(f.text);
      EncodeSpm(ReplaceAll(s, " ", kSpmSpace), &out);
    } else {
      EncodeBpe(f.text, &out);
    }
    prev_special = false;
  }
  if (add_special && data_.add_eos && data_.eos >= 0) out.push_back(data_.eos);
  return out;
}

void Tokenizer::AppendSpmSymbol(std::string_view text, std::vector<int32_t>* out) const {
  if (auto it = token_to_id_.find(std::string(text)); it != token_to_id_.end()) {
    out->push_back(it->second);
    return;
  }
  for (unsigned char c : text) {  // byte fallback
    const int32_t id = byte_tokens_[c];
    if (id >= 0) {
      out->push_back(id);
    } else if (data_.unk >= 0) {
      out->push_back(data_.unk);
    }
  }
}

// SentencePiece BPE as llama.cpp runs it: start from UTF-8 characters, repeatedly
// merge the adjacent pair whose concatenation is the highest-scoring token (leftmost
// on ties), then map each symbol to its token or to byte tokens.
void Tokenizer::EncodeSpm(std::string_view text, std::vector<int32_t>* out) const {
  struct Symbol {
    size_t off, len;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min<size_t>(unicode::Utf8SequenceLength(static_cast<uint8_t>(text[i])), text.size() - i);
    sym.push_back({i, len, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
    i += len;
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Bigram {
    int left, right;
    float score;
    size_t len;
  };
  auto cmp = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(cmp)> queue(cmp);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    auto it = token_to_id_.find(std::string(text.substr(sym[l].off, sym[l].len + sym[r].len)));
    if (it == token_to_id_.end()) return;
    const float score = data_.scores.empty() ? 0.0f : data_.scores[it->second];
    queue.push({l, r, score, sym[l].len + sym[r].len});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[i].next) AppendSpmSymbol(text.substr(sym[i].off, sym[i].len), out);
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<int32_t>* out) const {
  for (const std::string& word : PreTokenize(data_.pre, text)) EncodeBpeWord(word, out);
}

// Byte-level BPE: map the word's bytes to their printable stand-ins, then apply the
// lowest-ranked merge among adjacent pairs (leftmost on ties) until none applies.
void Tokenizer::EncodeBpeWord(const std::string& word, std::vector<int32_t>* out) const {
  if (data_.ignore_merges) {
    if (auto it = token_to_id_.find(BytesToUnicodeString(word)); it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (unsigned char c : word) {
    sym.push_back({byte_tokens_[c], static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id, merged;
  };
  auto cmp = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(cmp)> queue(cmp);
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    auto it = merge_ranks_.find(PairKey(sym[l].id, sym[r].id));
    if (it == merge_ranks_.end()) return;
    queue.push({it->second.first, l, r, sym[l].id, sym[r].id, it->second.second});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    if (l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;  // stale
    l.id = c.merged;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.id = -2;  // removed
    try_add(l.prev, c.left);
    try_add(c.left, l.next);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out->push_back(sym[i].id);
    } else if (data_.unk >= 0) {
      out->push_back(data_.unk);
    }
  }
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  const std::string& text = data_.tokens[id];
  const TokenType type = data_.types[id];
  if (data_.kind == TokenizerKind::kSpm) {
    if (type == TokenType::kByte && text.size() == 6 && text.compare(0, 3, "<0x") == 0) {
      char* end = nullptr;
      const long b = std::strtol(text.c_str() + 3, &end, 16);
      if (end == text.c_str() + 5) return std::string(1, static_cast<char>(b));
    }
    return ReplaceAll(text, kSpmSpace, " ");
  }
  if (type == TokenType::kControl || type == TokenType::kUserDefined) return text;
  return UnicodeStringToBytes(text);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (skip_special && IsControl(id)) continue;
    std::string piece = TokenBytes(id);
    if (first && data_.kind == TokenizerKind::kSpm && data_.add_space_prefix && !IsControl(id) && !piece.empty() &&
        piece[0] == ' ') {
      piece.erase(0, 1);
    }
    if (!IsControl(id)) first = false;
    out += piece;
  }
  return out;
}

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tok_.IsControl(id)) return {};
  pending_ += tok_.TokenBytes(id);
  // Emit the longest prefix that ends on a character boundary.
  size_t end = pending_.size();
  size_t i = pending_.size();
  int back = 0;
  while (i > 0 && back < 4) {
    --i;
    ++back;
    const uint8_t c = static_cast<uint8_t>(pending_[i]);
    if ((c & 0xC0) != 0x80) {  // lead byte or ASCII
      const int need = unicode::Utf8SequenceLength(c);
      if (need > back) end = i;  // incomplete sequence at the tail
      break;
    }
  }
  std::string out = pending_.substr(0, end);
  pending_.erase(0, end);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  for (char c : pending_) {
    if (static_cast<uint8_t>(c) < 0x80)
      out.push_back(c);
    else
      out += "\xEF\xBF\xBD";
  }
  pending_.clear();
  return out;
}

}  // namespace ps
