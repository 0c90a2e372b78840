// Activations: a buffer of floats in a Backend's activation memory (device memory
// on a GPU), grown on demand. Host code reaches its contents only through the
// backend's copies (HostView below), unless the backend is host-addressable.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace ps {

class Activations {
 public:
  Activations() = default;
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;
  Activations(Activations&& other) noexcept { swap(other); }
  Activations& operator=(Activations&& other) noexcept {
    swap(other);
    return *this;
  }
  ~Activations();

  // Room for at least `floats` floats. Growing does not keep the contents.
  absl::Status Reserve(Backend& backend, int64_t floats);
  float* data() const { return reinterpret_cast<float*>(region_.base); }
  int64_t capacity() const { return capacity_; }
  void swap(Activations& other) noexcept;

 private:
  MemoryRegion region_;
  int64_t capacity_ = 0;
};

// Host access to `n` floats of activation memory at `src`: `src` itself where the
// backend is host-addressable, else a copy in `staging` (valid until it changes).
const float* HostView(Backend& backend, const float* src, int64_t n, std::vector<float>& staging);

// What the host read of a sequence's activations during a step: bytes, and the first
// error of a read (a failed allocation or copy).
struct HostReads {
  int64_t bytes = 0;
  absl::Status error;
};

// Rows of activation memory as host code reads them (the pruning strategies' hooks):
// rows copied on demand, or runs of rows reduced where they live
// (Backend::ReduceRowRuns), so that only what is read leaves the device. Every read
// adds its bytes to the HostReads given; on a host-addressable backend, where nothing
// is copied, the bytes a device backend would copy. A result is valid until the next
// read or View through the same object, which keeps its staging memory between views.
class ActivationRows {
 public:
  explicit ActivationRows(Backend& backend) : backend_(backend) {}
  ActivationRows(const ActivationRows&) = delete;
  ActivationRows& operator=(const ActivationRows&) = delete;

  // From now on: `rows` rows of `width` floats at `data`, reads counted in *reads.
  void View(const float* data, int64_t rows, int64_t width, HostReads* reads) {
    data_ = data, rows_ = rows, width_ = width, reads_ = reads;
  }

  int64_t rows() const { return rows_; }
  int64_t width() const { return width_; }
  // Rows [first, first + count), `width` floats each.
  const float* Host(int64_t first, int64_t count);
  // Backend::ReduceRowRuns over these rows (bounds index them), or null with
  // reads.error set.
  const float* Reduce(std::span<const int32_t> bounds, RowReduction op);

 private:
  Backend& backend_;
  const float* data_ = nullptr;
  int64_t rows_ = 0, width_ = 0;
  HostReads* reads_ = nullptr;
  std::vector<float> host_;
  Activations reduced_;
};

}  // namespace ps
