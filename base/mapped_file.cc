#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    auto msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    // Pages are mapped as they are touched, not all at once (MAP_POPULATE): a loader that
    // repacks the weights reads each part once and lets it go (ReleasePages), so the whole
    // file is never resident beside the packed copy. WILLNEED starts reading it into the
    // page cache now, so those touches (and a first request's) are minor faults.
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(err)));
    }
    ::madvise(p, size, MADV_WILLNEED);  // advice only: without it the faults read the file
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

void MappedFile::ReleasePages(const uint8_t* p, size_t bytes) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(data_));
  const uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(p) + bytes, reinterpret_cast<uintptr_t>(data_) + size_);
  const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
  // Advice only: a failure leaves the pages resident, which is harmless.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::string> ReadTextCorpus(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return ReadFileToString(path);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", path, ": ", ec.message()));
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no files in ", path));
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    absl::StatusOr<std::string> t = ReadFileToString(f.string());
    if (!t.ok()) return t.status();
    absl::StrAppend(&text, *t, "\n\n");
  }
  return text;
}

}  // namespace ps
