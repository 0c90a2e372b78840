// The server's Prometheus metrics as the engine loop updates them.
#include "server/metrics.h"

#include <cmath>
#include <string>

#include <prometheus/text_serializer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

// The value of the unlabelled sample `name` on the page; NaN if absent.
double Sample(const Metrics& m, const std::string& name) {
  const std::string page = prometheus::TextSerializer().Serialize(m.registry()->Collect());
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, name + " ")) continue;
    double v = 0;
    if (absl::SimpleAtod(line, &v)) return v;
  }
  return std::nan("");
}

// The gauges follow the engine's load at each step; swapped requests are counted
// among the running ones, so running - swapped is what the device tier holds.
TEST(Metrics, GaugesFollowTheLoad) {
  Metrics m;
  EXPECT_EQ(Sample(m, "pruneserve_num_requests_swapped"), 0);
  LoadSnapshot load{.running = 5, .waiting = 2, .swapped = 3};
  m.OnStep(load, 4);
  EXPECT_EQ(Sample(m, "pruneserve_num_requests_running"), 5);
  EXPECT_EQ(Sample(m, "pruneserve_num_requests_waiting"), 2);
  EXPECT_EQ(Sample(m, "pruneserve_num_requests_swapped"), 3);
  load.swapped = 0;
  m.OnStep(load, 1);
  EXPECT_EQ(Sample(m, "pruneserve_num_requests_swapped"), 0);
}

}  // namespace
}  // namespace ps::server
