// WeightMirrors (kernels/weight_mirrors.h): a backend's copies of host weights belong to
// one model; another model at the same host addresses gets fresh copies.
#include "kernels/weight_mirrors.h"

#include <vector>

#include "gtest/gtest.h"

namespace ps {
namespace {

// A region whose release is counted.
MemoryRegion Counted(std::vector<uint8_t>& storage, int* released) {
  return MemoryRegion{.base = storage.data(), .release = [released](uint8_t*) { ++*released; }};
}

TEST(WeightMirrorsTest, CopiesAreKeyedByAddressSizeAndLayout) {
  std::vector<uint8_t> a(16), b(16);
  const float host[4] = {1, 2, 3, 4};
  int released = 0;
  WeightMirrors m;
  m.UseModel(7);
  EXPECT_EQ(m.Find(host, 4, 0), nullptr);
  EXPECT_EQ(m.Add(host, 4, 0, Counted(a, &released)), a.data());
  EXPECT_EQ(m.Find(host, 4, 0), a.data());
  EXPECT_EQ(m.Find(host, 2, 0), nullptr);  // a prefix of the same data is another copy
  EXPECT_EQ(m.Find(host, 4, 1), nullptr);  // so is the same data in another layout
  EXPECT_EQ(m.Add(host, 4, 1, Counted(b, &released)), b.data());
  m.UseModel(7);  // the same model again keeps its copies
  EXPECT_EQ(m.Find(host, 4, 1), b.data());
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(released, 0);
}

TEST(WeightMirrorsTest, AnotherModelAtTheSameAddressesGetsNoStaleCopies) {
  std::vector<uint8_t> first(16), second(16);
  std::vector<float> host = {1, 2, 3, 4};  // the first model's weights, then the second's in the same place
  int released = 0;
  {
    WeightMirrors m;
    m.UseModel(1);
    m.Add(host.data(), 4, 0, Counted(first, &released));
    m.UseModel(2);
    EXPECT_EQ(released, 1);  // the first model's copy went with it
    EXPECT_EQ(m.size(), 0u);
    EXPECT_EQ(m.Find(host.data(), 4, 0), nullptr);
    m.Add(host.data(), 4, 0, Counted(second, &released));
    EXPECT_EQ(m.Find(host.data(), 4, 0), second.data());
  }
  EXPECT_EQ(released, 2);  // and the last ones with the backend
}

}  // namespace
}  // namespace ps
