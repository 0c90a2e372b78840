// Function calling: how a model's chat template has it write calls, the calls read
// back from its answer, and the grammar that makes a call certain (tool_choice
// required or a named function) with arguments that follow the parameters' schema.
//
// Formats, told from the template's text: Hermes (Qwen2/2.5, Hermes:
// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call;
// an answer that is only such an object, untagged, is a call too)
// LLaMA 3.x JSON (the answer is `{"name": ..., "parameters": {...}}`, calls
// separated by `;`) and Mistral's: the control token [TOOL_CALLS], then a JSON list of
// `{"name", "arguments"}` (v3: Mistral 7B v0.3, Nemo) or `name[ARGS]{...}` (v11 and
// later: Small 3.x, Devstral; `[CALL_ID]id` may precede [ARGS]), [TOOL_CALLS] again
// before each further call. A Mistral answer shows its control tokens (GenerationSpec::
// show_control); a grammar cannot write one, so a required call is the bare JSON list,
// which reads as calls too.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/tokenizer/chat_template.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps::server {

enum class ToolFormat { kNone, kHermes, kLlama3Json, kMistral };

ToolFormat DetectToolFormat(std::string_view template_source);

// The answer's text and the calls in it (ids "call_<index>" once numbered by the
// caller; arguments as compact JSON text). Text that is not a well-formed call stays text.
struct ParsedAnswer {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedAnswer ParseToolCalls(ToolFormat format, std::string_view text);

// The id of call i of choice `choice` of request `request_id`: "call_<i>_<request id>",
// with "_<choice>" after it for choices past the first (n > 1). Mistral's templates
// take only ids of 9 letters and digits: for kMistral, 9 drawn from a hash of those.
std::string ToolCallId(ToolFormat format, std::string_view request_id, int choice, size_t i);

// Streaming: how much of `text` (an answer so far) is surely content, so it can be
// sent; the rest may be (the start of) a call and waits for the answer's end.
size_t SureContent(ToolFormat format, std::string_view text);

// GBNF for an answer that is one call (or, `parallel`, one or more) of the tools
// (only `function` when not empty), its arguments held to its parameters' schema.
absl::StatusOr<std::string> ToolCallGbnf(ToolFormat format,
                                         const google::protobuf::RepeatedPtrField<pruneserve::v1::Tool>& tools,
                                         const std::string& function, bool parallel);

}  // namespace ps::server
