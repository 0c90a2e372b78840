// Client side of `--strategy NAME --strategy-arg key=value`: fills a
// PruningConfig by protobuf reflection, so every strategy message and field of
// the API is reachable by its proto name (e.g. `--strategy gemfilter
// --strategy-arg top_k=512`, `--strategy lazyllm --strategy-arg layers=6,12
// --strategy-arg keep=0.5,0.3`). Unset fields take the server's defaults.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps::tools {

absl::Status SetPruning(const std::string& strategy, const std::vector<std::string>& args,
                        ::pruneserve::v1::PruningConfig* out);

}  // namespace ps::tools
