#include "tools/eval/tasks.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ps::eval {
namespace {

constexpr const char* kKeys[] = {"apple",   "river",   "lantern", "violin",  "harbor",  "meadow", "falcon",   "copper",
                                 "orchid",  "glacier", "saddle",  "pepper",  "beacon",  "marble", "walnut",   "canyon",
                                 "thistle", "anchor",  "quiver",  "ember",   "juniper", "ledger", "mosaic",   "nectar",
                                 "oyster",  "parsley", "quartz",  "ribbon",  "sparrow", "tundra", "umbrella", "velvet",
                                 "willow",  "yarrow",  "zephyr",  "bramble", "cobalt",  "dune",   "fjord",    "garnet"};
constexpr const char* kFirstNames[] = {"Alice",  "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta",  "Hiro",
                                       "Ingrid", "Jonas", "Keiko", "Lars",   "Maya",  "Nikos", "Olga",   "Pablo",
                                       "Quinn",  "Rosa",  "Sven",  "Tamar",  "Umar",  "Vera",  "Wendel", "Yusuf"};
constexpr const char* kSurnames[] = {"Abbott", "Brandt", "Castillo", "Dubois",  "Eriksen",  "Fischer",
                                     "Gallo",  "Haddad", "Ivanova",  "Jansen",  "Kowalski", "Lindqvist",
                                     "Moreau", "Novak",  "Okafor",   "Petrov",  "Quintero", "Rossi",
                                     "Sato",   "Tanaka", "Urbano",   "Vasquez", "Weber",    "Zhou"};
constexpr const char* kCities[] = {"Lisbon",  "Oslo",    "Nairobi", "Kyoto",    "Valparaiso", "Tbilisi",
                                   "Porto",   "Krakow",  "Quito",   "Hobart",   "Tallinn",    "Marrakesh",
                                   "Bergen",  "Cusco",   "Lyon",    "Gdansk",   "Ljubljana",  "Windhoek",
                                   "Dresden", "Granada", "Halifax", "Zanzibar", "Bruges",     "Adelaide"};
constexpr const char* kJobs[] = {"baker",    "carpenter", "pilot",  "librarian", "chemist", "sculptor",
                                 "surveyor", "violinist", "tailor", "botanist",  "jeweler", "cartographer"};

uint64_t Mix(uint64_t seed, const std::string& task, int length, int index) {
  uint64_t h = 1469598103934665603ull ^ seed;
  auto add = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (char c : task) add(static_cast<unsigned char>(c));
  add(static_cast<uint64_t>(length));
  add(static_cast<uint64_t>(index));
  return h;
}

class Builder {
 public:
  Builder(TextCodec& codec, const TextCodec::Tokens& filler, const std::string& task, const PromptOptions& o)
      : codec_(codec), filler_(filler), o_(o), rng_(Mix(o.seed, task, o.length, o.index)) {}

  std::mt19937_64& rng() { return rng_; }
  template <typename T, size_t N>
  std::string Pick(const T (&list)[N]) {
    return list[rng_() % N];
  }
  std::string Number(int digits) {
    std::string s = std::to_string(1 + rng_() % 9);
    while (static_cast<int>(s.size()) < digits) s += std::to_string(rng_() % 10);
    return s;
  }
  // n distinct entries of `list`.
  template <typename T, size_t N>
  std::vector<std::string> Distinct(const T (&list)[N], int n) {
    std::vector<std::string> all(std::begin(list), std::end(list));
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(std::min<size_t>(n, N));
    return all;
  }
  double Depth() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  // The essays cut to leave room for the question and the needles, the needles
  // placed at their depths (after the nearest sentence end before each).
  absl::StatusOr<std::string> Haystack(const std::vector<std::pair<double, std::string>>& needles,
                                       const std::string& question) {
    std::string extra = question;
    for (const auto& n : needles) absl::StrAppend(&extra, " ", n.second);
    absl::StatusOr<TextCodec::Tokens> extra_tokens = codec_.Tokenize(extra);
    if (!extra_tokens.ok()) return extra_tokens.status();
    int budget = o_.length - o_.reserved - static_cast<int>(extra_tokens->ids.size());
    for (int attempt = 0; attempt < 4; ++attempt) {
      if (budget < 16) return absl::InvalidArgumentError(absl::StrCat("length ", o_.length, " leaves no room"));
      absl::StatusOr<std::string> text = Fill(budget, needles);
      if (!text.ok()) return text.status();
      absl::StatusOr<TextCodec::Tokens> got = codec_.Tokenize(absl::StrCat(*text, "\n\n", question));
      if (!got.ok()) return got.status();
      const int over = static_cast<int>(got->ids.size()) - (o_.length - o_.reserved);
      if (over <= 0) return text;
      budget -= over + 8;  // retokenizing joined pieces can merge or split a few
    }
    return absl::InternalError(absl::StrCat("could not fit a prompt into ", o_.length, " tokens"));
  }

  absl::StatusOr<EvalPrompt> Finish(const std::string& task, const std::string& context, const std::string& question,
                                    std::vector<std::string> answers, Scoring scoring) {
    EvalPrompt p{
        .task = task, .length = o_.length, .index = o_.index, .answers = std::move(answers), .scoring = scoring};
    p.text = o_.chat ? absl::StrCat(context, "\n\n", question)
                     : absl::StrCat(context, "\n\nQuestion: ", question, "\nAnswer:");
    return p;
  }

 private:
  absl::StatusOr<std::string> Fill(int budget, std::vector<std::pair<double, std::string>> needles) {
    const auto n = static_cast<int>(filler_.ids.size());
    if (n == 0) return absl::InvalidArgumentError("empty filler text");
    std::vector<int32_t> ids(budget);
    std::vector<char> sentence_end(budget);
    for (int i = 0; i < budget; ++i) {
      ids[i] = filler_.ids[i % n];
      const std::string& piece = filler_.pieces[i % n];
      sentence_end[i] = !piece.empty() && (piece.back() == '.' || piece.back() == '\n');
    }
    std::stable_sort(needles.begin(), needles.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out;
    int from = 0;
    for (const auto& [depth, text] : needles) {
      int at = std::clamp(static_cast<int>(depth * budget), 0, budget);
      while (at > from && at < budget && !sentence_end[at - 1]) --at;
      absl::StatusOr<std::string> part = codec_.Detokenize(std::span<const int32_t>(ids.data() + from, at - from));
      if (!part.ok()) return part.status();
      absl::StrAppend(&out, *part, at > 0 ? " " : "", text, " ");
      from = at;
    }
    absl::StatusOr<std::string> rest = codec_.Detokenize(std::span<const int32_t>(ids.data() + from, budget - from));
    if (!rest.ok()) return rest.status();
    return out + *rest;
  }

  TextCodec& codec_;
  const TextCodec::Tokens& filler_;
  const PromptOptions& o_;
  std::mt19937_64 rng_;
};

std::string Needle(const std::string& key, const std::string& value) {
  return absl::StrCat("One of the special magic numbers for ", key, " is: ", value, ".");
}

// The filler's distinct lowercase words of 4 letters or more, in first-seen order.
std::vector<std::string> Words(const TextCodec::Tokens& filler) {
  std::vector<std::string> words;
  std::set<std::string> seen;
  std::string word;
  auto flush = [&] {
    if (word.size() >= 4 && seen.insert(word).second) words.push_back(word);
    word.clear();
  };
  for (const std::string& piece : filler.pieces) {
    for (char c : piece) {
      if (absl::ascii_isalpha(static_cast<unsigned char>(c))) {
        word.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
      } else {
        flush();
      }
    }
  }
  flush();
  return words;
}

}  // namespace

const std::vector<std::string>& TaskNames() {
  static const std::vector<std::string> kNames = {
      "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "qa"};
  return kNames;
}

absl::StatusOr<EvalPrompt> MakePrompt(TextCodec& codec, const TextCodec::Tokens& filler, const std::string& task,
                                      const PromptOptions& o) {
  Builder b(codec, filler, task, o);
  if (task == "niah_single") {
    const std::string key = b.Pick(kKeys), value = b.Number(7);
    // Depths spread evenly over the prompts whatever their count (golden-ratio steps).
    const double depth = std::fmod(0.5 + 0.6180339887 * o.index, 1.0);
    const std::string q = absl::StrCat("What is the special magic number for ", key,
                                       " mentioned in the provided text? Answer with the number only.");
    absl::StatusOr<std::string> hay = b.Haystack({{depth, Needle(key, value)}}, q);
    if (!hay.ok()) return hay.status();
    return b.Finish(task, *hay, q, {value}, Scoring::kAll);
  }
  if (task == "niah_multikey" || task == "niah_multiquery") {
    const std::vector<std::string> keys = b.Distinct(kKeys, 4);
    std::vector<std::pair<double, std::string>> needles;
    std::vector<std::string> values;
    for (const std::string& key : keys) {
      values.push_back(b.Number(7));
      needles.push_back({b.Depth(), Needle(key, values.back())});
    }
    if (task == "niah_multikey") {
      const std::string q = absl::StrCat("What is the special magic number for ", keys[0],
                                         " mentioned in the provided text? Answer with the number only.");
      absl::StatusOr<std::string> hay = b.Haystack(needles, q);
      if (!hay.ok()) return hay.status();
      return b.Finish(task, *hay, q, {values[0]}, Scoring::kAll);
    }
    const std::string q =
        absl::StrCat("What are the special magic numbers for ", keys[0], ", ", keys[1], ", ", keys[2], " and ", keys[3],
                     " mentioned in the provided text? Answer with the four numbers only.");
    absl::StatusOr<std::string> hay = b.Haystack(needles, q);
    if (!hay.ok()) return hay.status();
    return b.Finish(task, *hay, q, values, Scoring::kRecall);
  }
  if (task == "niah_multivalue") {
    const std::string key = b.Pick(kKeys);
    std::vector<std::pair<double, std::string>> needles;
    std::vector<std::string> values;
    for (int i = 0; i < 4; ++i) {
      values.push_back(b.Number(7));
      needles.push_back({b.Depth(), Needle(key, values.back())});
    }
    const std::string q = absl::StrCat("What are all the special magic numbers for ", key,
                                       " mentioned in the provided text? Answer with the numbers only.");
    absl::StatusOr<std::string> hay = b.Haystack(needles, q);
    if (!hay.ok()) return hay.status();
    return b.Finish(task, *hay, q, values, Scoring::kRecall);
  }
  if (task == "vt") {
    std::vector<std::string> vars;
    std::set<std::string> seen;
    while (vars.size() < 5) {
      std::string v;
      for (int i = 0; i < 5; ++i) v.push_back(static_cast<char>('A' + b.rng()() % 26));
      if (seen.insert(v).second) vars.push_back(v);
    }
    const std::string value = b.Number(5);
    std::vector<double> depths;
    for (int i = 0; i < 5; ++i) depths.push_back(b.Depth());
    std::sort(depths.begin(), depths.end());  // the chain in reading order
    std::vector<std::pair<double, std::string>> needles;
    for (int i = 0; i < 5; ++i) {
      needles.push_back({depths[i], i == 0 ? absl::StrCat("VAR ", vars[0], " = ", value, ".")
                                           : absl::StrCat("VAR ", vars[i], " = VAR ", vars[i - 1], ".")});
    }
    const std::string q = absl::StrCat("Find all variables that are assigned the value ", value,
                                       " in the text above, directly or through other variables. Answer with the "
                                       "variable names only.");
    absl::StatusOr<std::string> hay = b.Haystack(needles, q);
    if (!hay.ok()) return hay.status();
    return b.Finish(task, *hay, q, vars, Scoring::kRecall);
  }
  if (task == "cwe") {
    std::vector<std::string> words = Words(filler);
    std::shuffle(words.begin(), words.end(), b.rng());
    constexpr int kCommon = 10;
    const std::string q =
        "Above is a numbered list of words. Some of them appear more often than the others. What are the 10 most "
        "common words in the list? Answer with the 10 words only, separated by commas.";
    absl::StatusOr<TextCodec::Tokens> q_tokens = codec.Tokenize(q);
    if (!q_tokens.ok()) return q_tokens.status();
    const int budget = o.length - o.reserved - static_cast<int>(q_tokens->ids.size());
    // RULER's 30 repeats of each common word and 3 of each rare one, fewer where the
    // list would be short (the common words still stand out).
    absl::StatusOr<TextCodec::Tokens> sample = codec.Tokenize(absl::StrCat("123. ", words.front(), "\n"));
    if (!sample.ok()) return sample.status();
    const int items = budget / std::max<int>(1, static_cast<int>(sample->ids.size()));
    const int common_freq = std::clamp(items / 40, 2, 30), rare_freq = std::clamp(common_freq / 10, 1, 3);
    int rare = std::min<int>(static_cast<int>(words.size()) - kCommon, (items - kCommon * common_freq) / rare_freq);
    if (rare < kCommon) return absl::InvalidArgumentError(absl::StrCat("length ", o.length, " is too short for cwe"));
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::vector<std::string> list;
      for (int w = 0; w < kCommon; ++w) list.insert(list.end(), common_freq, words[w]);
      for (int w = kCommon; w < kCommon + rare; ++w) list.insert(list.end(), rare_freq, words[w]);
      std::mt19937_64 order(Mix(o.seed, "cwe-order", o.length, o.index));
      std::shuffle(list.begin(), list.end(), order);
      std::string text;
      for (size_t i = 0; i < list.size(); ++i) absl::StrAppend(&text, i + 1, ". ", list[i], "\n");
      absl::StatusOr<TextCodec::Tokens> got = codec.Tokenize(absl::StrCat(text, "\n\n", q));
      if (!got.ok()) return got.status();
      const auto n = static_cast<int>(got->ids.size());
      if (n <= o.length - o.reserved) {
        return b.Finish(task, text, q, std::vector<std::string>(words.begin(), words.begin() + kCommon),
                        Scoring::kRecall);
      }
      // Fewer rare words, by the share of the list that did not fit (and a margin).
      const double per_item = static_cast<double>(n) / static_cast<double>(list.size());
      const int drop_items = static_cast<int>(std::ceil((n - (o.length - o.reserved)) / per_item)) + 4;
      rare -= (drop_items + rare_freq - 1) / rare_freq;
      if (rare < kCommon) return absl::InvalidArgumentError(absl::StrCat("length ", o.length, " is too short for cwe"));
    }
    return absl::InternalError(absl::StrCat("could not fit cwe into ", o.length, " tokens"));
  }
  if (task == "qa") {
    // Eight people who share neither a first name nor a surname.
    const std::vector<std::string> first = b.Distinct(kFirstNames, 8), last = b.Distinct(kSurnames, 8);
    std::vector<std::string> names;
    for (int i = 0; i < 8; ++i) names.push_back(absl::StrCat(first[i], " ", last[i]));
    const std::vector<std::string> cities = b.Distinct(kCities, 8);
    std::vector<std::pair<double, std::string>> needles;
    for (int i = 0; i < 8; ++i) {
      needles.push_back({b.Depth(), absl::StrCat(names[i], " was born in ", cities[i], " in ", 1900 + b.rng()() % 100,
                                                 " and worked as a ", b.Pick(kJobs), " for many years.")});
    }
    const std::string q = absl::StrCat("In which city was ", names[0], " born? Answer with the name of the city only.");
    absl::StatusOr<std::string> hay = b.Haystack(needles, q);
    if (!hay.ok()) return hay.status();
    return b.Finish(task, *hay, q, {cities[0]}, Scoring::kF1);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown task '", task, "' (known: ", absl::StrJoin(TaskNames(), ", "), ")"));
}

}  // namespace ps::eval
