#include "grammar/matcher.h"

#include <algorithm>
#include <numeric>

#include "base/status.h"

namespace ps::grammar {

CompiledGrammar::CompiledGrammar(Grammar g) : g_(std::move(g)) {
  rule_starts_.resize(g_.rules.size());
  for (size_t r = 0; r < g_.rules.size(); ++r) {
    for (const Grammar::Sequence& alt : g_.rules[r].alternatives) {
      rule_starts_[r].push_back(static_cast<int32_t>(positions_.size()));
      for (const Element& e : alt) {
        positions_.push_back({e.kind == Element::Kind::kBytes ? Kind::kBytes : Kind::kRule, e.index});
      }
      positions_.push_back({Kind::kEnd, static_cast<int32_t>(r)});
    }
  }
}

Vocabulary::Vocabulary(std::vector<std::string> tokens, const std::vector<bool>& special, std::vector<int32_t> stops)
    : tokens_(std::move(tokens)), stops_(std::move(stops)) {
  for (size_t id = 0; id < tokens_.size(); ++id) {
    usable_.push_back(!tokens_[id].empty() && !(id < special.size() && special[id]));
    if (usable_.back()) order_.push_back(static_cast<int32_t>(id));
  }
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return tokens_[a] < tokens_[b]; });
  lcp_.resize(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const std::string& a = tokens_[order_[i - 1]];
    const std::string& b = tokens_[order_[i]];
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp_[i] = static_cast<int32_t>(k);
  }
}

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : g_(std::move(grammar)), vocab_(std::move(vocab)) {
  for (int32_t start : g_->rule_starts_[g_->g_.root]) Expand(start, -1, &tops_, &accepting_, nullptr);
  std::sort(tops_.begin(), tops_.end());
  tops_.erase(std::unique(tops_.begin(), tops_.end()), tops_.end());
  // Each start is its own expansion above; stacks reached twice are one node.
}

int32_t Matcher::Intern(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent + 1);
  auto [it, fresh] = index_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back({pos, parent});
    visited_.push_back(0);
  }
  return it->second;
}

namespace {
constexpr int32_t kBottom = -1;  // a stack's end: the grammar may end
constexpr int32_t kCut = -2;     // a cut stack's end: what lies below is unknown
}  // namespace

void Matcher::Expand(int32_t pos, int32_t parent, Tops* out, bool* accepting, bool* cut) {
  ++expansion_;
  std::vector<std::pair<int32_t, int32_t>>& work = work_;  // reused: no allocation per byte
  work.assign(1, {pos, parent});
  while (!work.empty()) {
    auto [p, up] = work.back();
    work.pop_back();
    const CompiledGrammar::Position& at = g_->positions_[p];
    if (at.kind == CompiledGrammar::Kind::kEnd) {
      if (up == kBottom) {
        *accepting = true;
      } else if (up == kCut) {
        if (cut != nullptr) *cut = true;
      } else {
        work.emplace_back(nodes_[up].pos, nodes_[up].parent);  // visited once, as that node
      }
      continue;
    }
    const int32_t node = Intern(p, up);
    if (visited_[node] == expansion_) continue;
    visited_[node] = expansion_;
    if (at.kind == CompiledGrammar::Kind::kBytes) {
      out->push_back(node);
      continue;
    }
    // A reference: its alternatives, returning to what follows it (or, in tail
    // position, straight to where this rule returns).
    const bool tail = g_->positions_[p + 1].kind == CompiledGrammar::Kind::kEnd;
    const int32_t cont = tail ? up : Intern(p + 1, up);
    for (int32_t start : g_->rule_starts_[at.index]) work.emplace_back(start, cont);
  }
}

bool Matcher::Advance(const Tops& from, uint8_t byte, Tops* to, bool* accepting, bool* cut) {
  to->clear();
  *accepting = false;
  for (int32_t n : from) {
    const Node node = nodes_[n];
    if (!g_->g_.byte_sets[g_->positions_[node.pos].index].Has(byte)) continue;
    Expand(node.pos + 1, node.parent, to, accepting, cut);
  }
  if (to->size() > 1) {
    std::sort(to->begin(), to->end());
    to->erase(std::unique(to->begin(), to->end()), to->end());
  }
  return !to->empty() || *accepting;
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  if (done_) return bytes.empty();
  Tops cur = tops_, next;
  bool accepting = accepting_;
  for (char c : bytes) {
    if (!Advance(cur, static_cast<uint8_t>(c), &next, &accepting, nullptr)) return false;
    cur.swap(next);
  }
  tops_ = std::move(cur);
  accepting_ = accepting;
  return true;
}

bool Matcher::AcceptToken(int32_t token) {
  if (token < 0 || token >= vocab_->size()) return false;
  const auto& stops = vocab_->stops_;
  if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
    if (!accepting_ || done_) return false;
    done_ = true;
    tops_.clear();
    return true;
  }
  if (!vocab_->usable_[token]) return false;
  return AcceptBytes(vocab_->tokens_[token]);
}

void Matcher::FillMask(std::span<uint64_t> allowed) {
  PS_CHECK(allowed.size() * 64 >= static_cast<size_t>(vocab_->size())) << "a mask of " << allowed.size() << " words";
  std::fill(allowed.begin(), allowed.end(), 0);
  if (!done_) {
    const std::string key(reinterpret_cast<const char*>(tops_.data()), tops_.size() * sizeof(int32_t));
    auto it = masks_.find(key);
    if (it != masks_.end()) {
      ++hits_;
      std::copy(it->second.begin(), it->second.end(), allowed.begin());
    } else {
      ++misses_;
      ComputeMask(allowed);
      if (masks_.size() >= 64) masks_.clear();  // bounded (a mask is vocabulary / 8 bytes)
      masks_.emplace(key, std::vector<uint64_t>(allowed.begin(), allowed.end()));
    }
  }
  if (accepting_ && !done_) {
    for (int32_t s : vocab_->stops_) allowed[s >> 6] |= uint64_t{1} << (s & 63);
  }
}

void Matcher::ComputeMask(std::span<uint64_t> allowed) {
  if (tops_.empty()) return;
  const size_t mark = nodes_.size();
  std::vector<int32_t> below;
  for (int32_t n : tops_) {
    const std::shared_ptr<const Split> split = SplitOf(n);
    for (size_t w = 0; w < allowed.size() && w < split->accepted.size(); ++w) allowed[w] |= split->accepted[w];
    below.insert(below.end(), split->below_cut.begin(), split->below_cut.end());
  }
  std::sort(below.begin(), below.end());
  below.erase(std::unique(below.begin(), below.end()), below.end());
  // The tokens that reach below a cut, against the whole stacks.
  const auto& order = vocab_->order_;
  if (!below.empty()) {
    Walk(tops_, &below, [&](int32_t i, Verdict v) {
      if (v == Verdict::kAccept) allowed[order[i] >> 6] |= uint64_t{1} << (order[i] & 63);
    });
  }
  // Forget the nodes of the walks.
  for (size_t n = mark; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    index_.erase((static_cast<uint64_t>(static_cast<uint32_t>(node.pos)) << 32) |
                 static_cast<uint32_t>(node.parent + 1));
  }
  nodes_.resize(mark);
  visited_.resize(mark);
}

int32_t Matcher::Cut(int32_t node, std::string* key) {
  std::vector<int32_t> frames;
  int32_t n = node;
  while (n >= 0 && static_cast<int>(frames.size()) < kContextFrames) {
    frames.push_back(nodes_[n].pos);
    n = nodes_[n].parent;
  }
  int32_t below = n >= 0 ? kCut : n;  // the real bottom when the stack is no deeper
  key->assign(reinterpret_cast<const char*>(frames.data()), frames.size() * sizeof(int32_t));
  key->push_back(below == kCut ? 'c' : 'b');
  for (size_t k = frames.size(); k-- > 0;) below = Intern(frames[k], below);
  return below;
}

std::shared_ptr<const Matcher::Split> Matcher::SplitOf(int32_t node) {
  std::string key;
  const int32_t cut = Cut(node, &key);
  {
    std::lock_guard lock(splits_->mu);
    auto it = splits_->by_key.find(key);
    if (it != splits_->by_key.end()) return it->second;
  }
  // Walked outside the lock: two matchers may both walk a new split, and one keeps it.
  auto split = std::make_shared<Split>();
  split->accepted.assign((vocab_->size() + 63) / 64, 0);
  const auto& order = vocab_->order_;
  Walk({cut}, nullptr, [&](int32_t i, Verdict v) {
    if (v == Verdict::kAccept) {
      split->accepted[order[i] >> 6] |= uint64_t{1} << (order[i] & 63);
    } else if (v == Verdict::kBelowCut) {
      split->below_cut.push_back(i);
    }
  });
  std::lock_guard lock(splits_->mu);
  if (splits_->by_key.size() >= 256) splits_->by_key.clear();  // bounded: each holds a mask
  return splits_->by_key.emplace(std::move(key), std::move(split)).first->second;
}

// The sorted tokens against `start`: the states after each prefix are kept by depth,
// so a token starts from the prefix it shares with the one before it; where a prefix
// fails, every following token that shares it gets the same verdict at once.
template <typename F>
void Matcher::Walk(const Tops& start, const std::vector<int32_t>* only, F verdict) {
  const auto& order = vocab_->order_;
  const size_t count = only != nullptr ? only->size() : order.size();
  auto index = [&](size_t j) { return only != nullptr ? (*only)[j] : static_cast<int32_t>(j); };
  auto bytes_of = [&](size_t j) -> const std::string& { return vocab_->tokens_[order[index(j)]]; };
  auto shared = [&](size_t j) -> size_t {  // bytes token j shares with token j - 1
    if (j == 0) return 0;
    if (only == nullptr) return static_cast<size_t>(vocab_->lcp_[j]);
    const std::string& a = bytes_of(j - 1);
    const std::string& b = bytes_of(j);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
  };
  struct Level {
    Tops tops;
    bool cut = false;  // some stack reached the cut on the way here
  };
  std::vector<Level> levels(1);
  levels[0].tops = start;
  size_t valid = 0;  // levels[0..valid] hold the states after the current token's prefixes
  for (size_t j = 0; j < count;) {
    const std::string& bytes = bytes_of(j);
    size_t depth = std::min(shared(j), valid);
    if (levels.size() < bytes.size() + 1) levels.resize(bytes.size() + 1);
    bool failed = false;
    for (; depth < bytes.size(); ++depth) {
      bool accepting = false, cut = false;
      Advance(levels[depth].tops, static_cast<uint8_t>(bytes[depth]), &levels[depth + 1].tops, &accepting, &cut);
      levels[depth + 1].cut = levels[depth].cut || cut;
      if (levels[depth + 1].tops.empty()) {
        // Nothing can follow bytes[0..depth]; this token is still whole if that was its
        // last byte and the grammar may end there.
        failed = !(depth + 1 == bytes.size() && accepting);
        break;
      }
    }
    if (!failed) {
      verdict(index(j), Verdict::kAccept);
      valid = std::min(depth, bytes.size());
      ++j;
      continue;
    }
    const Verdict v = levels[depth + 1].cut ? Verdict::kBelowCut : Verdict::kReject;
    verdict(index(j), v);
    valid = depth;
    for (++j; j < count && shared(j) > depth; ++j) verdict(index(j), v);
  }
}

}  // namespace ps::grammar
