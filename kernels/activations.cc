#include "kernels/activations.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"

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

const float* ActivationRows::Host(int64_t first, int64_t count) {
  PS_CHECK(first >= 0 && count >= 0 && first + count <= rows_) << "rows " << first << "+" << count << " of " << rows_;
  reads_->bytes += count * width_ * static_cast<int64_t>(sizeof(float));
  return HostView(backend_, data_ + first * width_, count * width_, host_);
}

const float* ActivationRows::Reduce(std::span<const int32_t> bounds, RowReduction op) {
  PS_CHECK(bounds.size() >= 2 && bounds.front() >= 0 && bounds.back() <= rows_) << "row runs out of range";
  for (size_t i = 1; i < bounds.size(); ++i) PS_CHECK(bounds[i - 1] < bounds[i]) << "an empty or descending row run";
  const int64_t floats = (static_cast<int64_t>(bounds.size()) - 1) * width_ * (op == RowReduction::kMaxMin ? 2 : 1);
  reads_->bytes += floats * static_cast<int64_t>(sizeof(float));
  if (backend_.host_addressable()) {
    host_.resize(static_cast<size_t>(floats));
    backend_.ReduceRowRuns(data_, width_, bounds, op, host_.data());
    return host_.data();
  }
  if (absl::Status s = reduced_.Reserve(backend_, floats); !s.ok()) {
    reads_->error.Update(s);
    return nullptr;
  }
  backend_.ReduceRowRuns(data_, width_, bounds, op, reduced_.data());
  return HostView(backend_, reduced_.data(), floats, host_);
}

}  // namespace ps
