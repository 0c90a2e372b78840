// GGUF reader: every metadata type, both versions, and broken files (truncated,
// bit-flipped, out-of-bounds tensors, unknown types) that must give errors.
#include <random>

#include "base/mapped_file.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tests/model/gguf_writer.h"

namespace ps {
namespace {

using testing::GgufWriter;

absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::vector<uint8_t>& b) {
  return GgufFile::Parse(b.data(), b.size(), "test.gguf");
}

class GgufVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersions, ReadsEveryMetadataType) {
  GgufWriter w(GetParam());
  w.KvU8("u8", 200);
  w.KvI8("i8", -5);
  w.KvU16("u16", 60000);
  w.KvI16("i16", -300);
  w.KvU32("u32", 4000000000u);
  w.KvI32("i32", -7);
  w.KvF32("f32", 1.5f);
  w.KvBool("bool", true);
  w.KvStr("str", "héllo");
  w.KvU64("u64", 1ull << 40);
  w.KvI64("i64", -(1ll << 40));
  w.KvF64("f64", 2.25);
  w.KvStrArray("strs", {"a", "", "ccc"});
  w.KvF32Array("floats", {0.5f, -1.0f});
  w.KvI32Array("ints", {1, -2, 3});
  std::vector<uint8_t> data(4 * 6);
  w.Tensor("t", 0, {3, 2}, data);
  auto f = ParseBytes(w.Bytes());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), GetParam());
  EXPECT_EQ(*(*f)->GetInt("u8").value(), 200);
  EXPECT_EQ(*(*f)->GetInt("i8").value(), -5);
  EXPECT_EQ(*(*f)->GetInt("u16").value(), 60000);
  EXPECT_EQ(*(*f)->GetInt("i16").value(), -300);
  EXPECT_EQ(*(*f)->GetInt("u32").value(), 4000000000ll);
  EXPECT_EQ(*(*f)->GetInt("i32").value(), -7);
  EXPECT_EQ(*(*f)->GetFloat("f32").value(), 1.5);
  EXPECT_EQ(*(*f)->GetBool("bool").value(), true);
  EXPECT_EQ(*(*f)->GetString("str").value(), "héllo");
  EXPECT_EQ(*(*f)->GetInt("u64").value(), 1ll << 40);
  EXPECT_EQ(*(*f)->GetInt("i64").value(), -(1ll << 40));
  EXPECT_EQ(*(*f)->GetFloat("f64").value(), 2.25);
  EXPECT_EQ((*f)->Find("strs")->strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ((*f)->Find("floats")->floats, (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ((*f)->Find("ints")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_FALSE((*f)->GetString("u8").ok());  // wrong type is an error
  EXPECT_FALSE((*f)->GetInt("missing").value().has_value());
  const GgufTensor* t = (*f)->FindTensor("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(t->nbytes, 24u);
}

INSTANTIATE_TEST_SUITE_P(V2AndV3, GgufVersions, ::testing::Values(2u, 3u));

TEST(Gguf, RejectsBadFilesWithNamedErrors) {
  struct Case {
    std::string what;
    std::vector<uint8_t> bytes;
    std::string expect;
  };
  std::vector<Case> cases;
  {
    GgufWriter w;
    auto b = w.Bytes();
    b[0] = 'X';
    cases.push_back({"bad magic", b, "bad magic"});
  }
  {
    GgufWriter w(1);
    cases.push_back({"version 1", w.Bytes(), "unsupported GGUF version"});
  }
  {
    GgufWriter w;
    w.Tensor("t", 0, {4}, std::vector<uint8_t>(8));  // needs 16 bytes
    cases.push_back({"out of bounds", w.Bytes(), "beyond the end"});
  }
  {
    GgufWriter w;
    w.Tensor("t", 99, {4}, std::vector<uint8_t>(16));
    cases.push_back({"unknown type", w.Bytes(), "unsupported type 99"});
  }
  {
    GgufWriter w;
    w.Tensor("t", 2 /*Q4_0*/, {33}, std::vector<uint8_t>(64));
    cases.push_back({"row not a multiple of the block", w.Bytes(), "block size"});
  }
  {
    GgufWriter w;
    w.KvStr("k", "v");
    auto b = w.Bytes();
    b.resize(40);  // inside the value string
    cases.push_back({"truncated metadata", b, "truncated"});
  }
  for (const Case& c : cases) {
    auto f = ParseBytes(c.bytes);
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << c.what << ": " << f.status();
  }
}

std::vector<uint8_t> StoriesBytes() {
  auto s = ReadFileToString(std::string(PS_TESTDATA) + "/stories260K/stories260K.gguf");
  EXPECT_TRUE(s.ok());
  return std::vector<uint8_t>(s->begin(), s->end());
}

// Parses and, when that succeeds, builds the model: must never crash.
absl::Status TryLoad(const std::vector<uint8_t>& b) {
  auto f = ParseBytes(b);
  if (!f.ok()) return f.status();
  auto config = ConfigFromGguf(**f);
  if (!config.ok()) return config.status();
  auto tok = Tokenizer::FromGguf(**f);
  if (!tok.ok()) return tok.status();
  TensorMap tensors;
  for (const GgufTensor& t : (*f)->tensors()) tensors[t.name] = {t.type, t.dims, t.data, t.nbytes};
  return Model::Build(*config, tensors, std::move(*tok), nullptr).status();
}

TEST(Gguf, TruncatedCopiesOfStoriesFailCleanly) {
  const auto full = StoriesBytes();
  ASSERT_TRUE(TryLoad(full).ok());
  std::mt19937 rng(1);
  std::vector<size_t> cuts = {0, 3, 4, 8, 23, 24, 100, 5000, full.size() / 2, full.size() - 1};
  for (int i = 0; i < 40; ++i) cuts.push_back(std::uniform_int_distribution<size_t>(0, full.size() - 1)(rng));
  for (size_t cut : cuts) {
    std::vector<uint8_t> b(full.begin(), full.begin() + cut);
    EXPECT_FALSE(TryLoad(b).ok()) << "truncated at " << cut;
  }
}

TEST(Gguf, BitFlippedCopiesOfStoriesNeverCrash) {
  const auto full = StoriesBytes();
  auto header_end = [&] {
    auto f = ParseBytes(full);
    return static_cast<size_t>((*f)->tensors().front().data - full.data());
  }();
  std::mt19937 rng(2);
  int rejected = 0;
  for (int i = 0; i < 400; ++i) {
    std::vector<uint8_t> b = full;
    const size_t at = std::uniform_int_distribution<size_t>(0, header_end - 1)(rng);  // flips in the header
    b[at] ^= static_cast<uint8_t>(1u << std::uniform_int_distribution<int>(0, 7)(rng));
    rejected += !TryLoad(b).ok();
  }
  // Many header flips (in strings, say) still give a loadable file; many must not.
  EXPECT_GT(rejected, 20);
}

}  // namespace
}  // namespace ps
