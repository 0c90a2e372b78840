#include "tools/eval/scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace ps::eval {
namespace {

std::string Lower(std::string s) {
  absl::AsciiStrToLower(&s);
  return s;
}

bool WordChar(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

// `needle` in `text` with no letter or digit right before or after it.
bool ContainsWord(const std::string& text, const std::string& needle) {
  if (needle.empty()) return false;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    const bool left = at == 0 || !WordChar(text[at - 1]) || !WordChar(needle.front());
    const size_t end = at + needle.size();
    const bool right = end == text.size() || !WordChar(text[end]) || !WordChar(needle.back());
    if (left && right) return true;
  }
  return false;
}

std::vector<std::string> NormalizedTokens(const std::string& text) {
  std::string clean;
  for (char c : Lower(text)) clean.push_back(absl::ascii_ispunct(static_cast<unsigned char>(c)) ? ' ' : c);
  std::vector<std::string> out;
  for (absl::string_view t : absl::StrSplit(clean, absl::ByAnyChar(" \t\n\r"), absl::SkipEmpty())) {
    if (t != "a" && t != "an" && t != "the") out.emplace_back(t);
  }
  return out;
}

}  // namespace

double TokenF1(const std::string& prediction, const std::string& reference) {
  const std::vector<std::string> p = NormalizedTokens(prediction), r = NormalizedTokens(reference);
  if (p.empty() || r.empty()) return p.empty() && r.empty() ? 1.0 : 0.0;
  std::map<std::string, int> counts;
  for (const std::string& t : r) ++counts[t];
  int common = 0;
  for (const std::string& t : p) {
    if (auto it = counts.find(t); it != counts.end() && it->second > 0) {
      --it->second;
      ++common;
    }
  }
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / p.size(), recall = static_cast<double>(common) / r.size();
  return 2 * precision * recall / (precision + recall);
}

double Score(const std::string& answer, const std::vector<std::string>& expected, Scoring scoring) {
  if (expected.empty()) return 0.0;
  if (scoring == Scoring::kF1) {
    const std::string first_line = answer.substr(0, answer.find('\n'));
    return TokenF1(first_line, expected.front());
  }
  const std::string text = Lower(answer);
  int found = 0;
  for (const std::string& e : expected) found += ContainsWord(text, Lower(e));
  if (scoring == Scoring::kAll) return found == static_cast<int>(expected.size()) ? 1.0 : 0.0;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

Interval Wilson(int64_t k, int64_t n) {
  if (n <= 0) return {0.0, 1.0};
  constexpr double z = 1.96;
  const double p = static_cast<double>(k) / static_cast<double>(n), nn = static_cast<double>(n);
  const double denom = 1 + z * z / nn;
  const double centre = (p + z * z / (2 * nn)) / denom;
  const double half = z * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn)) / denom;
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

Interval BootstrapMean(std::span<const double> scores, int resamples, uint64_t seed) {
  if (scores.empty()) return {0.0, 1.0};
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, scores.size() - 1);
  std::vector<double> means(resamples);
  for (double& m : means) {
    double sum = 0;
    for (size_t i = 0; i < scores.size(); ++i) sum += scores[pick(rng)];
    m = sum / static_cast<double>(scores.size());
  }
  std::sort(means.begin(), means.end());
  auto at = [&](double q) { return means[std::min(means.size() - 1, static_cast<size_t>(q * means.size()))]; };
  return {at(0.025), at(0.975)};
}

Interval MeanInterval(std::span<const double> scores) {
  const bool binary = std::all_of(scores.begin(), scores.end(), [](double s) { return s == 0.0 || s == 1.0; });
  if (!binary) return BootstrapMean(scores);
  return Wilson(std::count(scores.begin(), scores.end(), 1.0), static_cast<int64_t>(scores.size()));
}

double Median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace ps::eval
