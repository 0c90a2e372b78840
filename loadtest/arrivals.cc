#include "loadtest/arrivals.h"

#include <cmath>

namespace ps::loadtest {

Arrivals::Arrivals(const ArrivalOptions& o)
    : unpaced_(!(o.rate > 0) || std::isinf(o.rate)),
      rng_(o.seed),
      // Mean shape * scale = 1 / rate; shape 1 is the exponential (Poisson arrivals).
      gap_(o.burstiness, unpaced_ ? 1.0 : 1.0 / (o.rate * o.burstiness)) {}

double Arrivals::NextGap() { return unpaced_ ? 0.0 : gap_(rng_); }

}  // namespace ps::loadtest
