// Measuring a model's strategy calibration (engine/pruning/calibration.h): the model
// runs over needle-in-a-haystack prompts cut from a text, and from each layer's
// attention:
//  - PoD: the attention distributions of the last `queries` query rows per layer and
//    KV head (mean over the group's query heads); similarity of two layers = 1 - the
//    mean Jensen-Shannon divergence (log 2) over samples and queries; the greedy
//    grouping of consecutive layers at `delta` (PoD's Algorithm 1);
//  - GemFilter / LazyLLM: the first layer whose last-query scores (summed over heads,
//    average-pooled as GemFilter does) keep most of the needle's tokens among their
//    top `locate_top` (1/16 of the prompt: chance keeps 1 in 16), in most samples
//    (GemFilter Fig. 5): GemFilter's filter layer; LazyLLM prunes after it.
// Used by tools/pruneserve-calibrate and by the server at start-up.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/pruning/calibration.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace ps {

struct CalibrateOptions {
  int64_t length = 4096;   // prompt tokens per sample (capped at the model's context)
  int64_t samples = 3;     // prompts, the needle at depths spread over 10%..90%
  int64_t queries = 16;    // last query rows whose distributions are compared
  int64_t locate_top = 0;  // 0: length / 16
  double delta = 0.5;      // PoD's grouping threshold
  // Called after each sample with a line on what it found (may be empty).
  std::function<void(const std::string&)> progress;
};

// The calibration of `model` over `text` (at least enough for one prompt).
absl::StatusOr<Calibration> Calibrate(const Model& model, Backend& backend, const std::string& text,
                                      const CalibrateOptions& options);

}  // namespace ps
