// Where the server's model calibration (engine/pruning/calibration.h) comes from:
// the file named by --pod-groups; else MODEL.calibration.json next to the model
// (pruneserve-calibrate writes it there), else the one cached for the model in the
// cache folder; else, given a text (--calibrate-text), measured at start-up
// (engine/calibrate.h) and written to the cache folder for the next start (never
// next to the model: model folders are often shared or read-only); else none, and the
// strategies that need it say so (unavailable, or uncalibrated defaults).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/pruning/calibration.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace ps::server {

struct CalibrationSource {
  std::string file;        // --pod-groups: this file, nothing else
  std::string model_path;  // the model file or folder
  std::string text;        // --calibrate-text: measure over this file or folder when nothing is cached
  std::string cache_dir;   // where a measured calibration is cached
  std::string auto_table;  // --auto-table: the evaluation's table for `auto` (default: MODEL.auto.json if there)
};

// The calibration (null: none), logging where it came from; errors for a named file
// that does not load or fit, a text that cannot be read or calibrated with.
absl::StatusOr<CalibrationPtr> ResolveCalibration(const Model& model, Backend& backend,
                                                  const CalibrationSource& source);

// The default cache folder: $XDG_CACHE_HOME/pruneserve, else $HOME/.cache/pruneserve.
std::string DefaultCacheDir();

}  // namespace ps::server
