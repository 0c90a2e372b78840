// Pre-tokenizers of byte-level BPE vocabularies: the regex splits of GPT-2,
// LLaMA-3 and Qwen2, written out by hand (no regex engine) over code points.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ps {

enum class PreTokenizer {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
            // ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // as kLlama3 with \p{N} (single digits)
  kSmolLM,  // \p{N} split first, then kGpt2 on the pieces between
};

// Splits text into pieces whose concatenation is the input.
std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace ps
