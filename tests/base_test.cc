// Base utilities: flag parsing, status macros.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "base/fault.h"
#include "base/flags.h"
#include "base/large_buffer.h"
#include "base/mapped_file.h"
#include "base/status.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

TEST(Flags, ParsesValuesAndRejectsBadInput) {
  std::string s = "x";
  int64_t i = 1;
  double f = 0.5;
  bool b = false;
  std::vector<std::string> list;
  std::vector<int64_t> ints = {1, 2};
  FlagParser p("prog", "test");
  p.AddIntList("sizes", &ints, "ints");
  p.AddString("name", &s, "a string");
  p.AddInt("count", &i, "an int");
  p.AddFloat("temp", &f, "a float");
  p.AddBool("verbose", &b, "a bool");
  p.AddStringList("stop", &list, "strings");
  EXPECT_NE(p.Help().find("[default: 1,2]"), std::string::npos) << p.Help();
  const char* argv[] = {"prog",      "--name", "abc", "--count=42", "--temp",  "0.25",
                        "--verbose", "--stop", "a",   "--stop=b",   "--sizes", "4,16,64"};
  ASSERT_TRUE(p.Parse(12, const_cast<char**>(argv)).ok());
  EXPECT_EQ(ints, (std::vector<int64_t>{4, 16, 64}));
  EXPECT_EQ(s, "abc");
  EXPECT_EQ(i, 42);
  EXPECT_EQ(f, 0.25);
  EXPECT_TRUE(b);
  EXPECT_EQ(list, (std::vector<std::string>{"a", "b"}));
  EXPECT_NE(p.Help().find("--count VALUE"), std::string::npos);

  const char* bad_list[] = {"prog", "--sizes", "4,,5"};
  EXPECT_NE(p.Parse(3, const_cast<char**>(bad_list)).message().find("--sizes"), std::string::npos);
  const char* bad_int[] = {"prog", "--count", "4x"};
  EXPECT_NE(p.Parse(3, const_cast<char**>(bad_int)).message().find("--count"), std::string::npos);
  const char* unknown[] = {"prog", "--nope"};
  EXPECT_NE(p.Parse(2, const_cast<char**>(unknown)).message().find("unknown flag --nope"), std::string::npos);
  const char* missing[] = {"prog", "--name"};
  EXPECT_NE(p.Parse(2, const_cast<char**>(missing)).message().find("needs a value"), std::string::npos);
}

TEST(Flags, ConfigFileSetsFlagsAndNamesBadLines) {
  std::string model;
  int64_t port = 1;
  FlagParser p("prog", "test");
  p.AddString("model", &model, "m");
  p.AddInt("port", &port, "p");
  const std::string path = ::testing::TempDir() + "/flags_" + std::to_string(::getpid()) + ".conf";
  std::ofstream(path) << "# comment\n\nmodel = /m.gguf\nport: 7\n";
  ASSERT_TRUE(p.ParseConfigFile(path).ok());
  EXPECT_EQ(model, "/m.gguf");
  EXPECT_EQ(port, 7);
  std::ofstream(path) << "model = x\nbogus = 1\n";
  EXPECT_NE(p.ParseConfigFile(path).message().find(":2: unknown flag bogus"), std::string::npos);
  std::ofstream(path) << "port = seven\n";
  EXPECT_NE(p.ParseConfigFile(path).message().find("--port"), std::string::npos);
  EXPECT_EQ(p.ParseConfigFile(path + ".missing").code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  PS_ASSIGN_OR_RETURN(int h, Half(x));
  PS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(ReadTextCorpus, JoinsAFoldersFilesInNameOrder) {
  const std::string dir = ::testing::TempDir() + "/corpus_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/b.txt") << "second";
  std::ofstream(dir + "/a.txt") << "first";
  auto text = ps::ReadTextCorpus(dir);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "first\n\nsecond\n\n");
  auto one = ps::ReadTextCorpus(dir + "/b.txt");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, "second");
  EXPECT_FALSE(ps::ReadTextCorpus(dir + "/missing").ok());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(ps::ReadTextCorpus(dir).ok()) << "an empty folder is an error";
  std::filesystem::remove_all(dir);
}

// The line starting with `field` ("VmFlags:", "Rss:") of the mapping holding p in
// /proc/self/smaps ("" when not found).
std::string SmapsLine(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < line.find(' ')) {
      inside = lo <= addr && addr < hi;
    } else if (inside && line.rfind(field, 0) == 0) {
      return line;
    }
  }
  return "";
}
std::string VmFlagsOf(const void* p) { return SmapsLine(p, "VmFlags:"); }
// Resident kB of the mapping holding p (-1 when not found).
int64_t RssKbOf(const void* p) {
  const std::string line = SmapsLine(p, "Rss:");
  return line.empty() ? -1 : std::stoll(line.substr(4));
}

// A mapped file's pages become resident as they are read, not at Open (a loader that
// repacks the weights never holds the whole file beside the packed copy), and go again
// when released; what is read is the file.
TEST(MappedFile, PagesResidentOnlyOnceReadAndGoneWhenReleased) {
  const std::string path = ::testing::TempDir() + "/mapped_file_test.bin";
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), bytes = 256 * page;
  {
    std::ofstream out(path, std::ios::binary);
    for (size_t i = 0; i < bytes; ++i) out.put(static_cast<char>(i * 13 + i / page));
  }
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->size(), bytes);
  const uint8_t* d = (*f)->data();
  const int64_t kb = static_cast<int64_t>(bytes / 1024);
  EXPECT_EQ(RssKbOf(d), 0) << "nothing read yet";
  int64_t sum = 0;
  for (size_t i = 0; i < bytes / 2; i += 7) {
    ASSERT_EQ(d[i], static_cast<uint8_t>(i * 13 + i / page)) << i;
    sum += d[i];
  }
  EXPECT_GT(sum, 0);
  EXPECT_GE(RssKbOf(d), kb / 2) << "the first half read";
  (*f)->ReleasePages(d, bytes);
  EXPECT_EQ(RssKbOf(d), 0) << "all released";
  EXPECT_EQ(d[bytes - 1], static_cast<uint8_t>((bytes - 1) * 13 + (bytes - 1) / page)) << "read again from the file";
  f->reset();
  std::filesystem::remove(path);
}

TEST(LargeBuffer, AlignedWritableAndAdvisedHugeFromTwoMiB) {
  for (size_t bytes : {size_t{1}, size_t{100}, kHugePageBytes - 1, kHugePageBytes, 3 * kHugePageBytes + 5}) {
    LargeBuffer b = AllocateLargeBuffer(bytes);
    ASSERT_NE(b, nullptr) << bytes;
    const auto addr = reinterpret_cast<uintptr_t>(b.get());
    EXPECT_EQ(addr % (bytes >= kHugePageBytes ? kHugePageBytes : 64), 0u) << bytes;
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 7);
    for (size_t i = 0; i < bytes; i += 4093) ASSERT_EQ(b[i], static_cast<uint8_t>(i * 7)) << bytes;
    // Where the kernel has transparent huge pages, the range carries the advice ("hg").
    if (bytes >= kHugePageBytes && std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
      EXPECT_NE(VmFlagsOf(b.get()).find(" hg"), std::string::npos) << bytes << ": " << VmFlagsOf(b.get());
      EXPECT_NE(VmFlagsOf(b.get() + bytes - 1).find(" hg"), std::string::npos) << bytes;
    }
  }
}

TEST(Status, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().message(), "odd");
}

TEST(Status, CheckAbortsWithMessage) {
  EXPECT_DEATH({ PS_CHECK(1 + 1 == 3) << "math is broken"; }, "check failed: 1 \\+ 1 == 3 math is broken");
}

TEST(Fault, ArmedPointsFailTheirNextHitsOnly) {
  EXPECT_FALSE(fault::Hit(fault::Point::kStrategy));
  ASSERT_TRUE(fault::Arm("strategy=2").ok());
  ASSERT_TRUE(fault::Arm("swap_copy").ok());  // once
  EXPECT_FALSE(fault::Hit(fault::Point::kKvAppend));
  EXPECT_TRUE(fault::Hit(fault::Point::kStrategy));
  EXPECT_TRUE(fault::Hit(fault::Point::kStrategy));
  EXPECT_FALSE(fault::Hit(fault::Point::kStrategy));
  EXPECT_TRUE(fault::Hit(fault::Point::kSwapCopy));
  EXPECT_FALSE(fault::Hit(fault::Point::kSwapCopy));
  ASSERT_TRUE(fault::Arm("host_tier_full=5").ok());
  fault::Reset();
  EXPECT_FALSE(fault::Hit(fault::Point::kHostTierFull));
  EXPECT_EQ(fault::Arm("disk=1").message(),
            "unknown fault point 'disk' (known: swap_copy, host_tier_full, kv_append, strategy)");
  EXPECT_EQ(fault::Arm("strategy=0").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fault::Arm("strategy=x").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ps
