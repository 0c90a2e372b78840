#include "server/calibration_source.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/mapped_file.h"
#include "engine/calibrate.h"
#include "spdlog/spdlog.h"

namespace ps::server {

std::string DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/pruneserve");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr && *home != '\0' ? home : "/tmp", "/.cache/pruneserve");
}

namespace {

// The paths a calibration of the model is looked for at, in order:
// MODEL.calibration.json, then the cache's CACHE_DIR/<model file name>.<hash of its
// absolute path>.calibration.json (where a measured one is written).
std::vector<std::string> CalibrationPaths(const CalibrationSource& source) {
  std::string model = source.model_path;
  while (model.size() > 1 && model.back() == '/') model.pop_back();  // a folder named with a slash
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::weakly_canonical(model, ec);
  const std::string name = absl::StrCat(
      std::filesystem::path(model).filename().string(), ".",
      absl::Hex(std::hash<std::string>()(ec ? model : absolute.string()) & 0xffffffff), ".calibration.json");
  return {model + ".calibration.json", (std::filesystem::path(source.cache_dir) / name).string()};
}

// The calibration proper (ResolveCalibration without the auto table).
absl::StatusOr<CalibrationPtr> ModelCalibration(const Model& model, Backend& backend, const CalibrationSource& source) {
  const ModelConfig& c = model.config();
  auto load = [&](const std::string& path) -> absl::StatusOr<CalibrationPtr> {
    absl::StatusOr<Calibration> cal = LoadCalibration(path, c);
    if (!cal.ok()) return cal.status();
    size_t groups = 0;
    for (const auto& head : cal->groups) groups += head.size();
    spdlog::info("calibration {}: PoD delta {} ({} groups over {} KV heads), needle layer {}", path, cal->delta, groups,
                 cal->n_kv_heads, cal->needle_layer);
    return std::make_shared<const Calibration>(*std::move(cal));
  };
  if (!source.file.empty()) {
    absl::StatusOr<CalibrationPtr> cal = load(source.file);
    if (!cal.ok()) return absl::InvalidArgumentError(absl::StrCat("--pod-groups: ", cal.status().message()));
    return cal;
  }
  const std::vector<std::string> paths = CalibrationPaths(source);
  for (const std::string& path : paths) {
    if (!std::filesystem::exists(path)) continue;
    absl::StatusOr<CalibrationPtr> cal = load(path);
    if (cal.ok()) return cal;
    spdlog::warn("ignoring the cached calibration {}: {}", path, std::string(cal.status().message()));
  }
  if (source.text.empty()) return CalibrationPtr();
  absl::StatusOr<std::string> text = ReadTextCorpus(source.text);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--calibrate-text: ", text.status().message()));
  spdlog::info("calibrating {} over {} (PoD's layer groups, GemFilter's and LazyLLM's layers)", c.name, source.text);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Calibration> cal = Calibrate(
      model, backend, *text, {.progress = [](const std::string& line) { spdlog::info("calibration {}", line); }});
  if (!cal.ok()) return absl::InvalidArgumentError(absl::StrCat("--calibrate-text: ", cal.status().message()));
  spdlog::info("calibrated in {:.1f} s: needle layer {}",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), cal->needle_layer);
  const std::string& path = paths.back();  // the cache's
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = absl::StrCat(path, ".tmp", ::getpid());
  bool written = false;
  {
    std::ofstream out(tmp);
    out << CalibrationToJson(*cal) << "\n";
    written = static_cast<bool>(out);
  }
  if (written) std::filesystem::rename(tmp, path, ec);  // whole or not at all, for a concurrent start
  if (!written || ec) {
    std::filesystem::remove(tmp, ec);
    spdlog::warn("calibration not cached: cannot write {}", path);
  } else {
    spdlog::info("calibration cached in {}", path);
  }
  return std::make_shared<const Calibration>(*std::move(cal));
}

}  // namespace

absl::StatusOr<CalibrationPtr> ResolveCalibration(const Model& model, Backend& backend,
                                                  const CalibrationSource& source) {
  absl::StatusOr<CalibrationPtr> cal = ModelCalibration(model, backend, source);
  if (!cal.ok()) return cal.status();
  std::string path = source.auto_table;
  if (path.empty() && std::filesystem::exists(source.model_path + ".auto.json"))
    path = source.model_path + ".auto.json";
  if (path.empty()) return cal;
  absl::StatusOr<AutoTable> table = LoadAutoTable(path);
  if (!table.ok()) return absl::InvalidArgumentError(absl::StrCat("--auto-table: ", table.status().message()));
  if (!table->model.empty() && table->model != model.config().name) {
    spdlog::warn("auto table {} was measured on {}, this model is {}", path, table->model, model.config().name);
  }
  spdlog::info("auto table {}: {} prompt lengths", path, table->lengths.size());
  Calibration with = *cal != nullptr ? **cal : Calibration{.model = model.config().name};
  with.auto_table = std::make_shared<const AutoTable>(*std::move(table));
  return std::make_shared<const Calibration>(std::move(with));
}

}  // namespace ps::server
