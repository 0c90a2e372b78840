// Read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ps {

class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the pages wholly inside [p, p + bytes) from this process's memory (they are
  // read from the file again if touched): for data now kept in another form.
  void ReleasePages(const uint8_t* p, size_t bytes) const;

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads a whole (small) file into a string.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// A file's text, or for a folder its regular files' texts in name order, joined by
// blank lines (benchmark and evaluation corpora such as the haystack essays).
absl::StatusOr<std::string> ReadTextCorpus(const std::string& path);

}  // namespace ps
