// A Jinja template interpreter for chat templates: the subset of Jinja2 that the
// chat templates of LLaMA 2/3.x, Qwen2/2.5, Mistral and SmolLM2 use, rendered with the
// environment Hugging Face transformers renders them in (trim_blocks, lstrip_blocks,
// no trailing newline kept, loop controls; `tojson` as json.dumps(ensure_ascii=False); `raise_exception`,
// `strftime_now`, `namespace`, `range`, `dict`). Statements: if/elif/else, for (with
// else, a filter condition, tuple targets, `loop`), set (names, tuples, namespace
// attributes, blocks), macro, break/continue, `generation` blocks (rendered as their
// body). Expressions: Python literals, lists, dicts, attribute and item access,
// slices, calls with keyword arguments, filters, tests, arithmetic, comparison,
// `in`, `and`/`or`/`not`, `~`, conditional expressions. What it does not know is a
// parse error naming the line, never output that differs silently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "jinja/value.h"

namespace ps::jinja {

struct Node;

class Template {
 public:
  struct Options {
    bool trim_blocks = true;    // the first newline after a block tag is removed
    bool lstrip_blocks = true;  // spaces and tabs before a block tag on its line are removed
    // A rendering that evaluates more nodes, expressions and loop iterations than this
    // fails (a runaway template), as does one whose output passes 64 MiB.
    int64_t max_steps = 5'000'000;
  };
  // InvalidArgument naming the line for a syntax error or an unknown construct.
  static absl::StatusOr<Template> Parse(std::string_view source, Options options);
  static absl::StatusOr<Template> Parse(std::string_view source) { return Parse(source, Options{}); }

  // Renders with `context`'s entries as variables. `raise_exception` fails with
  // FailedPrecondition carrying the template's message; other errors (an undefined
  // value used, a type mismatch) are InvalidArgument naming the line.
  absl::StatusOr<std::string> Render(const Dict& context) const;

 private:
  Template(std::shared_ptr<const Node> root, const Options& options) : root_(std::move(root)), options_(options) {}
  std::shared_ptr<const Node> root_;
  Options options_;
};

}  // namespace ps::jinja
