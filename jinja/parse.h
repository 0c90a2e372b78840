// Template text to its tree (jinja/ast.h).
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "jinja/ast.h"
#include "jinja/template.h"

namespace ps::jinja {

absl::StatusOr<std::unique_ptr<Node>> ParseTemplate(std::string_view source, const Template::Options& options);

}  // namespace ps::jinja
