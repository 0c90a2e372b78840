// The RPC edge: protobuf requests to scheduler requests (tokenisation, chat
// formatting, validation with field names) and events back to protobuf, and
// absl::Status to grpc::Status.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <grpcpp/support/status.h>

#include "absl/status/statusor.h"
#include "grammar/matcher.h"
#include "model/model.h"
#include "model/tokenizer/chat_template.h"
#include "pruneserve/v1/generation.pb.h"
#include "scheduler/request.h"
#include "server/tool_calls.h"

namespace ps::server {

namespace pb = ::pruneserve::v1;

// What the operator lets one request ask for (0: no limit beyond the model's
// context). A request beyond one is RESOURCE_EXHAUSTED.
struct RequestLimits {
  int max_prompt_tokens = 0;
  int max_new_tokens = 0;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
};

// Compiled structured-output constraints by their kind and text, so requests with the
// same schema or grammar share its compilation and the mask splits computed for it
// (grammar/matcher.h). The oldest goes when `capacity` are held.
class ConstraintCache {
 public:
  explicit ConstraintCache(size_t capacity = 64) : capacity_(capacity) {}
  std::shared_ptr<const grammar::Matcher> Find(const std::string& key);
  void Put(const std::string& key, std::shared_ptr<const grammar::Matcher> start);

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const grammar::Matcher>> by_key_;
  std::deque<std::string> order_;  // oldest first
  size_t capacity_;
};

// Server-side defaults for fields a request leaves unset, and the limits.
struct RequestDefaults {
  SamplingParams sampling;                             // temperature 1, top_p 1, ... unless configured
  int max_new_tokens = 256;                            // capped to the room left in the context
  std::shared_ptr<const StrategyDefaults> strategies;  // every strategy's parameters (defaults + flags)
  RequestLimits limits;
  // What formats chat messages; the reason they are refused when there is none.
  absl::StatusOr<ChatTemplatePtr> chat = absl::FailedPreconditionError("no chat template is loaded");
  // The tokens as structured outputs' grammars see them (null: constraints refused).
  std::shared_ptr<const grammar::Vocabulary> grammar_vocab;
  std::shared_ptr<ConstraintCache> constraints = std::make_shared<ConstraintCache>();
  ToolFormat tool_format = ToolFormat::kNone;  // how `chat` has the model write calls
};

inline constexpr size_t kMaxCacheSaltBytes = 256;
inline constexpr uint32_t kMaxChoices = 128;  // GenerateRequest.n (OpenAI's limit)

// Builds a scheduler request (without id, sink or deadline). Errors are
// INVALID_ARGUMENT naming the field (a conversation the chat template refuses too),
// FAILED_PRECONDITION for a chat request when `defaults.chat` holds no template, or RESOURCE_EXHAUSTED beyond `limits`.
// `principal` (AccessControl::Authenticate) and the request's cache_salt keep its
// prompt prefixes apart in the prefix cache.
absl::StatusOr<std::shared_ptr<Request>> RequestFromProto(const pb::GenerateRequest& in, const Model& model,
                                                          const RequestDefaults& defaults,
                                                          std::string_view principal = {});

pb::FinishReason ToProto(FinishReason r);
// The streamed message for an engine event.
pb::GenerateResponse ToProto(const RequestEvent& event, bool want_logprobs);

// How a request ended, as a status: OK, or the error, the client's cancel, the
// deadline, an Abort or the shutdown (UNAVAILABLE).
absl::Status FinishStatus(const RequestEvent& finished);

grpc::Status ToGrpc(const absl::Status& s);

}  // namespace ps::server
