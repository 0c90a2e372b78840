// The OpenAI-compatible API's messages: /v1/completions and /v1/chat/completions
// bodies parsed into the GenerateRequest they mean (the gRPC API's validation
// then applies unchanged), and a request's engine events written back as OpenAI
// responses, whole or as server-sent events. Pure conversion: no I/O, no threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "pruneserve/v1/generation.pb.h"
#include "scheduler/request.h"
#include "server/tool_calls.h"

namespace ps::server::openai {

namespace pb = ::pruneserve::v1;
using Json = nlohmann::ordered_json;  // keys keep their order (a schema's properties, say)

enum class Api { kCompletions, kChat };

// An OpenAI request and the GenerateRequest it means.
struct ApiRequest {
  Api api = Api::kCompletions;
  std::string model;
  pb::GenerateRequest request;  // no request_id yet
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool logprobs = false;       // answer with the sampled tokens' log-probabilities
  int top_logprobs = 0;        // and this many alternatives each
  int n = 1;                   // choices returned
  int best_of = 1;             // choices generated (completions): the n most likely are returned
};

// Parses a request body. Errors are InvalidArgument starting with the OpenAI
// parameter's name ("temperature: must be a number"), NotFound for a model not in
// `served_models`. Fields OpenAI defines that this server cannot honour (echo,
// suffix, logit_bias) are InvalidArgument, and
// so are unknown fields. Extensions: top_k, min_p, repetition_penalty, min_tokens,
// ignore_eos, priority, cache_salt (vLLM's), and "pruning": {"strategy": NAME, PARAM: VALUE...}.
absl::StatusOr<ApiRequest> ParseRequest(Api api, std::string_view body, const std::vector<std::string>& served_models);

// The OpenAI parameter an error from the server's validation is about: its
// message's first word ("max_new_tokens: ..." -> max_tokens), or "" when none.
std::string ErrorParam(Api api, absl::string_view message);

// The HTTP status and OpenAI error body ({"error": {message, type, param, code}})
// for a failed request: InvalidArgument, FailedPrecondition and OutOfRange 400,
// Unauthenticated 401, NotFound 404, AlreadyExists 409, ResourceExhausted 429,
// Unavailable 503, DeadlineExceeded 504, anything else 500. ResourceExhausted
// about a field (a server limit on the prompt, max_tokens, stop) is 400.
std::pair<int, Json> ErrorResponse(Api api, const absl::Status& status);

// The /v1/models body.
Json ModelList(const std::vector<std::string>& served_models, int context_length, int64_t created);

// Writes one request's answer from its engine events: as server-sent events while
// it streams, or whole once it finished.
class ResponseWriter {
 public:
  // `token_text`: a token's text (its bytes; may be partial UTF-8) for logprobs.
  // `tools`: how the model writes calls, when the request offers tools (kNone: it
  // does not): the calls are read from the answer into `tool_calls`, and a stream
  // holds back what may be a call until the answer ends.
  ResponseWriter(const ApiRequest& request, std::string id, int64_t created,
                 std::function<std::string(int32_t)> token_text, ToolFormat tools = ToolFormat::kNone);

  // Streaming: the SSE lines ("data: {...}\n\n") an event adds. After the last
  // choice's finish event (its finish chunk, the usage chunk if asked) or a choice's
  // error object comes "data: [DONE]\n\n"; nothing follows an error (closed()).
  std::string StreamEvent(const RequestEvent& event);
  bool closed() const { return closed_; }
  // Non-streaming: collects the events; once the last finish event came, Status says
  // whether every choice succeeded (the first failure: see FinishStatus) and Final is
  // the response body.
  void Collect(const RequestEvent& event);
  absl::Status Status() const;
  Json Final() const;

 private:
  // One choice's answer so far.
  struct Choice {
    bool role_sent = false;  // chat streaming: its first delta carries the role
    std::string text;        // collected text (and its length: completions' text_offset)
    size_t sent = 0;         // streaming: the bytes of text sent as content
    Json logprobs;           // collected logprobs (null without)
    double logprob = 0;      // of its sampled tokens, summed (best_of ranks by it)
    std::optional<RequestEvent> finish;
  };
  Choice& At(int index);
  Json Chunk(Json choice, int index) const;
  Json Logprobs(const std::vector<SampledToken>& tokens, size_t text_offset) const;
  void AppendLogprobs(Json& into, const Json& more) const;
  Json UsageJson(const Usage& usage) const;
  static const char* FinishReasonText(FinishReason reason);
  Json ToolCallsJson(const std::vector<ToolCall>& calls, int choice) const;

  Api api_;
  std::string id_, model_;
  int64_t created_;
  bool logprobs_, include_usage_;
  int top_logprobs_;
  int n_;  // choices returned (of those generated: best_of)
  std::function<std::string(int32_t)> token_text_;
  ToolFormat tools_;
  std::vector<Choice> choices_;
  bool closed_ = false;  // streaming: a choice failed and the stream ended
  Usage usage_;          // the last finish event's: the whole request's
};

}  // namespace ps::server::openai
