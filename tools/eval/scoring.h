// Scoring the evaluation's answers and the intervals around their means.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tools/eval/tasks.h"

namespace ps::eval {

// `answer` scored against `expected` by `scoring` (tasks.h), in [0, 1]. Matches are
// case-insensitive and whole words: "1234" is not found in "12345".
double Score(const std::string& answer, const std::vector<std::string>& expected, Scoring scoring);

// SQuAD's token F1: both texts lowercased, punctuation and the articles a/an/the
// removed, split at white space.
double TokenF1(const std::string& prediction, const std::string& reference);

struct Interval {
  double lo = 0, hi = 0;
};

// The Wilson score interval of k successes in n trials at 95% (z = 1.96); [0, 1]
// for n = 0.
Interval Wilson(int64_t k, int64_t n);

// The 95% percentile bootstrap interval of the mean of `scores` (`resamples`
// resamplings, seeded: the same scores give the same interval).
Interval BootstrapMean(std::span<const double> scores, int resamples = 2000, uint64_t seed = 1);

// Wilson when every score is 0 or 1, else the bootstrap.
Interval MeanInterval(std::span<const double> scores);

double Median(std::vector<double> values);  // NaN when empty

}  // namespace ps::eval
