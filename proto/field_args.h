// Fields of a protobuf message as `key=value` text, by reflection: the one parser
// of the strategy parameters that users type on command lines (`--strategy-arg top_k=512`, lists
// comma-separated: `keep=0.5,0.3`), shared by the server, the offline runner and
// the gRPC clients, so every field of every strategy message is reachable by its
// proto name without code per strategy.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class Message;
}
namespace pruneserve::v1 {
class PruningConfig;
}

namespace ps {

// Sets fields of `msg` from "key=value" items; a repeated field takes every
// comma-separated value, replacing what it held. Errors name `owner` (e.g. the
// strategy): "gemfilter has no parameter 'topk' (known: filter_layer, ...)".
absl::Status SetFieldsFromArgs(const std::vector<std::string>& args, std::string_view owner,
                               google::protobuf::Message* msg);

// The set fields of `msg` as (key, value) pairs in SetFieldsFromArgs' syntax.
std::vector<std::pair<std::string, std::string>> FieldsAsArgs(const google::protobuf::Message& msg);

// The strategies of a PruningConfig are the fields of its `strategy` oneof, one
// message each, named as the strategy. Selects strategy `name` in `config` and
// returns its message; InvalidArgument listing the known names otherwise.
absl::StatusOr<google::protobuf::Message*> SelectStrategy(std::string_view name, pruneserve::v1::PruningConfig* config);
// The selected strategy's message and name; null (and "") when none is selected.
const google::protobuf::Message* SelectedStrategy(const pruneserve::v1::PruningConfig& config, std::string* name);
// Selects strategy `name` in `config` and sets its message's fields from "key=value" items.
absl::Status SetStrategyArgs(std::string_view name, const std::vector<std::string>& args,
                             pruneserve::v1::PruningConfig* config);
// Selects strategy `name` in `config` and sets its message from a JSON object of its
// parameters (protobuf's JSON mapping: {"keep": [0.5, 0.3], "max_revivals": 4}).
absl::Status SetStrategyJson(std::string_view name, std::string_view params, pruneserve::v1::PruningConfig* config);
// The names of every strategy message, in field order.
std::vector<std::string> StrategyMessageNames();

}  // namespace ps
