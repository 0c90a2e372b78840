// Activations: a buffer of floats in a Backend's activation memory (device memory
// on a GPU), grown on demand. Host code reaches its contents only through the
// backend's copies (HostView below), unless the backend is host-addressable.
#pragma once

#include <cstdint>
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

}  // namespace ps
