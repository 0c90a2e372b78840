// Constrained decoding over a Grammar: which tokens may come next, and the state
// after each accepted token.
//
// The state is a set of stacks of grammar positions (a pushdown automaton run on
// all alternatives at once, as llama.cpp's grammar sampler), each stack a node in a
// hash-consed tree so that equal stacks are one node. A reference in tail position
// does not push (repetitions are right-recursive), so a repetition's state recurs
// exactly. The token mask walks the vocabulary sorted by bytes: tokens sharing a
// prefix share its steps, and every token under a prefix that fails is skipped at
// once.
//
// Most of a mask does not depend on the stack below the top few frames (the approach
// XGrammar published): for each stack, the walk runs once on its top kContextFrames
// frames with the rest cut off, and sorts the tokens into those accepted or refused
// there and those that pop past the cut (a string's closing quote and what follows).
// That split is cached by the frames' grammar positions, so every string of a JSON
// document shares one walk; each step then checks only the tokens that pop past the
// cut against the whole stack. The splits are shared by the copies of a matcher (the
// requests started from one compiled constraint), guarded by a mutex; whole masks are
// cached by state within a matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace ps::grammar {

// A grammar's positions in a flat table, shared by the matchers of its requests.
class CompiledGrammar {
 public:
  explicit CompiledGrammar(Grammar g);
  const Grammar& grammar() const { return g_; }

 private:
  friend class Matcher;
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  struct Position {
    Kind kind;
    int32_t index;  // the byte set or the rule
  };
  Grammar g_;
  std::vector<Position> positions_;                // every alternative's elements, then its end
  std::vector<std::vector<int32_t>> rule_starts_;  // per rule, its alternatives' first positions
};

// The model's tokens as bytes, sorted, for the mask's walk. Built once per model.
class Vocabulary {
 public:
  // `tokens[id]` is the token's bytes; `special[id]` marks tokens never produced
  // under a grammar (control tokens); `stops` end a generation, allowed where the
  // grammar may end.
  Vocabulary(std::vector<std::string> tokens, const std::vector<bool>& special, std::vector<int32_t> stops);
  int size() const { return static_cast<int>(tokens_.size()); }
  std::span<const int32_t> stops() const { return stops_; }

 private:
  friend class Matcher;
  std::vector<std::string> tokens_;
  std::vector<bool> usable_;    // neither special nor empty
  std::vector<int32_t> order_;  // token ids sorted by bytes, special and empty tokens left out
  std::vector<int32_t> lcp_;    // bytes order_[i] shares with order_[i - 1]
  std::vector<int32_t> stops_;
};

class Matcher {
 public:
  Matcher(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const Vocabulary> vocab);

  // Fills `allowed` (a bit per token id, vocab size bits) with the tokens that may
  // come next: those whose bytes the grammar can match, and the stop tokens when it
  // may end here.
  void FillMask(std::span<uint64_t> allowed);
  // Advances by a token; false (the state unchanged) when the grammar does not allow
  // it. A stop token is accepted where the grammar may end, and ends the matcher.
  bool AcceptToken(int32_t token);
  // Advances by bytes (tests, forced text); false (unchanged) when not allowed.
  bool AcceptBytes(std::string_view bytes);
  bool CanEnd() const { return accepting_; }                            // the input so far is a whole sentence
  bool Done() const { return done_ || (tops_.empty() && accepting_); }  // nothing may follow but a stop

  // Whole-mask cache hits and misses, for the benchmark.
  int64_t cache_hits() const { return hits_; }
  int64_t cache_misses() const { return misses_; }

  static constexpr int kContextFrames = 3;

 private:
  struct Node {
    int32_t pos;
    int32_t parent;  // -1: the bottom
  };
  using Tops = std::vector<int32_t>;  // nodes whose position is a byte set, sorted

  // Where a walk leaves a token: allowed, refused, or (cut stacks only) decided by the
  // frames below the cut.
  enum class Verdict : uint8_t { kAccept, kReject, kBelowCut };
  struct Split {
    std::vector<uint64_t> accepted;  // a bit per token id
    std::vector<int32_t> below_cut;  // indices into the vocabulary's sorted order
  };

  int32_t Intern(int32_t pos, int32_t parent);
  // Adds to `out` the nodes reached from frame (pos, parent) without consuming a byte;
  // sets *accepting when the bottom is reached, *cut when the cut is.
  void Expand(int32_t pos, int32_t parent, Tops* out, bool* accepting, bool* cut);
  // The state after `byte`; false if no stack takes it (nor may end there).
  bool Advance(const Tops& from, uint8_t byte, Tops* to, bool* accepting, bool* cut);
  // Walks the sorted vocabulary (or the sorted subset `only`) from `start`, telling
  // `verdict` each token's fate by its index in the sorted order.
  template <typename F>
  void Walk(const Tops& start, const std::vector<int32_t>* only, F verdict);
  // The top kContextFrames frames of `node`'s stack, the rest cut; the cache key of its split.
  int32_t Cut(int32_t node, std::string* key);
  std::shared_ptr<const Split> SplitOf(int32_t node);
  void ComputeMask(std::span<uint64_t> allowed);

  std::shared_ptr<const CompiledGrammar> g_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<uint32_t> visited_;  // per node, the expansion that last reached it
  uint32_t expansion_ = 0;
  std::vector<std::pair<int32_t, int32_t>> work_;  // Expand's frames to visit
  Tops tops_;
  bool accepting_ = false;
  bool done_ = false;
  std::unordered_map<std::string, std::vector<uint64_t>> masks_;  // by the state's nodes
  struct Splits {
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<const Split>> by_key;  // by the cut stack's positions
  };
  std::shared_ptr<Splits> splits_ = std::make_shared<Splits>();  // shared by copies
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace ps::grammar
