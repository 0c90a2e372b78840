// Numbers in untrusted JSON (config.json, tokenizer.json, calibration files,
// safetensors headers) that no field can hold: nlohmann's get<int>() and
// get<float>() convert a float beyond the target's range with undefined
// behaviour, so such a file is rejected before any field is read.
#pragma once

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ps {

// InvalidArgument naming `what` when a float anywhere in `j` has a magnitude of
// 2^31 or more (every float field we read is far smaller; an integer field gets
// a float truncated within int's range).
inline absl::Status CheckJsonNumbers(const nlohmann::json& j, const std::string& what) {
  if (j.is_number_float()) {
    if (!(std::fabs(j.get<double>()) < 2147483648.0)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the number ", j.dump(), " is out of range"));
    }
  } else if (j.is_structured()) {
    for (const nlohmann::json& v : j) {
      if (absl::Status s = CheckJsonNumbers(v, what); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace ps
