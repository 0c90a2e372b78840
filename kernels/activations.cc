#include "kernels/activations.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps {

Activations::~Activations() {
  if (region_.release) region_.release(region_.base);
}

absl::Status Activations::Reserve(Backend& backend, int64_t floats) {
  if (floats <= capacity_) return absl::OkStatus();
  absl::StatusOr<MemoryRegion> region = backend.AllocateActivations(static_cast<size_t>(floats) * sizeof(float));
  if (!region.ok()) {
    return absl::Status(region.status().code(),
                        absl::StrCat("activations of ", floats, " floats: ", region.status().message()));
  }
  if (region_.release) region_.release(region_.base);
  region_ = std::move(*region);
  capacity_ = floats;
  return absl::OkStatus();
}

void Activations::swap(Activations& other) noexcept {
  std::swap(region_, other.region_);
  std::swap(capacity_, other.capacity_);
}

const float* HostView(Backend& backend, const float* src, int64_t n, std::vector<float>& staging) {
  if (backend.host_addressable()) return src;
  staging.resize(static_cast<size_t>(n));
  backend.CopyToHost(src, staging.data(), static_cast<size_t>(n) * sizeof(float));
  return staging.data();
}

}  // namespace ps
