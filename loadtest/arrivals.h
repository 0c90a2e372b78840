// When the load generator sends: the gaps between request arrivals, as vLLM's
// `bench serve` draws them. A rate of infinity sends at once (the concurrency
// limit then sets the pace); burstiness 1 is a Poisson process, below 1 burstier,
// above 1 more regular (gamma-distributed gaps of mean 1/rate).
#pragma once

#include <cstdint>
#include <random>

namespace ps::loadtest {

struct ArrivalOptions {
  double rate = 0;          // requests per second; <= 0 or inf: no gaps
  double burstiness = 1.0;  // the gamma distribution's shape (> 0)
  uint64_t seed = 0;
};

class Arrivals {
 public:
  explicit Arrivals(const ArrivalOptions& options);
  // Seconds from the previous arrival to the next.
  double NextGap();
  bool unpaced() const { return unpaced_; }

 private:
  bool unpaced_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gap_;
};

}  // namespace ps::loadtest
