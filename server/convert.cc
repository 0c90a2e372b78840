#include "server/convert.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace ps::server {
namespace {

// Whether the request's tools are offered, and whether a call is certain.
bool ToolsOffered(const pb::GenerateRequest& in) {
  return in.tools_size() > 0 && in.tool_choice().mode() != pb::ToolChoice::NONE;
}
bool CallRequired(const pb::GenerateRequest& in) {
  return ToolsOffered(in) &&
         (in.tool_choice().mode() == pb::ToolChoice::REQUIRED || in.tool_choice().mode() == pb::ToolChoice::FUNCTION);
}

// The request's structured-output constraint (or the grammar of a required call) as a
// grammar's start state (null: none). Compiled once per text (defaults.constraints).
absl::StatusOr<std::shared_ptr<const grammar::Matcher>> Constraint(const pb::GenerateRequest& in,
                                                                   const RequestDefaults& defaults) {
  std::string gbnf, field;
  switch (in.constraint_case()) {
    case pb::GenerateRequest::CONSTRAINT_NOT_SET: break;
    case pb::GenerateRequest::kJsonSchema: {
      field = "json_schema";
      const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(in.json_schema(), nullptr, false);
      if (schema.is_discarded()) return absl::InvalidArgumentError("json_schema: not valid JSON");
      absl::StatusOr<std::string> g = grammar::JsonSchemaToGbnf(schema);
      if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("json_schema: ", g.status().message()));
      gbnf = *std::move(g);
      break;
    }
    case pb::GenerateRequest::kJsonObject:
      if (!in.json_object()) break;
      field = "json_object";
      gbnf = grammar::JsonObjectGbnf();
      break;
    case pb::GenerateRequest::kGrammar:
      field = "grammar";
      gbnf = in.grammar();
      break;
    case pb::GenerateRequest::kRegex: {
      field = "regex";
      absl::StatusOr<std::string> expr = grammar::RegexToGbnf(in.regex(), grammar::RegexMode::kWhole);
      if (!expr.ok()) return absl::InvalidArgumentError(absl::StrCat("regex: ", expr.status().message()));
      gbnf = absl::StrCat("root ::= ", *expr);
      break;
    }
  }
  if (CallRequired(in)) {
    if (!field.empty()) return absl::InvalidArgumentError(absl::StrCat("tool_choice: a required call and ", field));
    field = "tool_choice";
    const pb::ToolChoice& choice = in.tool_choice();
    absl::StatusOr<std::string> g = ToolCallGbnf(defaults.tool_format, in.tools(), choice.function(),
                                                 choice.has_parallel() ? choice.parallel() : true);
    if (!g.ok()) return g.status();
    gbnf = *std::move(g);
  }
  if (field.empty()) return nullptr;
  if (defaults.grammar_vocab == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(field, ": structured outputs need the model's tokenizer"));
  }
  if (std::shared_ptr<const grammar::Matcher> cached = defaults.constraints->Find(gbnf)) return cached;
  absl::StatusOr<grammar::Grammar> g = grammar::Grammar::FromGbnf(gbnf);
  if (!g.ok() && in.constraint_case() == pb::GenerateRequest::kGrammar) return g.status();  // "grammar: ..."
  if (!g.ok()) return absl::InternalError(absl::StrCat(field, ": its grammar does not read: ", g.status().message()));
  auto start = std::make_shared<const grammar::Matcher>(std::make_shared<const grammar::CompiledGrammar>(*std::move(g)),
                                                        defaults.grammar_vocab);
  defaults.constraints->Put(gbnf, start);
  return start;
}

// The request's tools as the chat template's `tools` (null when not offered).
absl::StatusOr<nlohmann::ordered_json> TemplateTools(const pb::GenerateRequest& in, const RequestDefaults& defaults) {
  if (!ToolsOffered(in)) return nlohmann::ordered_json();
  if (defaults.tool_format == ToolFormat::kNone) {
    return absl::FailedPreconditionError(
        "tools: the model's chat template has no tool-call format this server reads (Hermes <tool_call>, LLaMA 3.x "
        "JSON, Mistral [TOOL_CALLS])");
  }
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  for (const pb::Tool& t : in.tools()) {
    nlohmann::ordered_json fn = {{"name", t.name()}};
    if (!t.description().empty()) fn["description"] = t.description();
    if (!t.parameters().empty()) {
      fn["parameters"] = nlohmann::ordered_json::parse(t.parameters(), nullptr, false);
      if (fn["parameters"].is_discarded()) {
        return absl::InvalidArgumentError(absl::StrCat("tools: the parameters of '", t.name(), "' are not JSON"));
      }
    }
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return tools;
}

}  // namespace

std::shared_ptr<const grammar::Matcher> ConstraintCache::Find(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

void ConstraintCache::Put(const std::string& key, std::shared_ptr<const grammar::Matcher> start) {
  std::lock_guard lock(mu_);
  if (!by_key_.emplace(key, std::move(start)).second) return;
  order_.push_back(key);
  if (order_.size() > capacity_) {
    by_key_.erase(order_.front());
    order_.pop_front();
  }
}

absl::StatusOr<std::shared_ptr<Request>> RequestFromProto(const pb::GenerateRequest& in, const Model& model,
                                                          const RequestDefaults& defaults, std::string_view principal) {
  const Tokenizer* tok = model.tokenizer();
  const ModelConfig& c = model.config();
  auto r = std::make_shared<Request>();
  std::vector<int32_t>& prompt = r->spec.prompt;
  if (in.tools_size() > 0 && in.input_case() != pb::GenerateRequest::kMessages) {
    return absl::InvalidArgumentError("tools: only with messages (the chat template offers them)");
  }
  switch (in.input_case()) {
    case pb::GenerateRequest::kText:
      if (in.text().empty()) return absl::InvalidArgumentError("text: the input text is empty");
      prompt = tok->Encode(in.text(), in.has_add_special_tokens() ? in.add_special_tokens() : true,
                           in.parse_special_tokens());
      break;
    case pb::GenerateRequest::kTokenIds:
      if (in.token_ids().ids().empty()) return absl::InvalidArgumentError("token_ids: no token ids");
      for (int32_t id : in.token_ids().ids()) {
        if (id < 0 || id >= c.n_vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("token_ids: id ", id, " is outside the vocabulary [0, ", c.n_vocab, ")"));
        }
        prompt.push_back(id);
      }
      break;
    case pb::GenerateRequest::kMessages: {
      if (in.messages().messages().empty()) return absl::InvalidArgumentError("messages: no messages");
      if (!defaults.chat.ok())
        return absl::FailedPreconditionError(absl::StrCat("messages: ", defaults.chat.status().message()));
      std::vector<ChatMessage> msgs;
      for (const auto& m : in.messages().messages()) {
        ChatMessage& msg = msgs.emplace_back(ChatMessage{.role = m.role(), .content = m.content()});
        for (const pb::ToolCall& call : m.tool_calls()) {
          msg.tool_calls.push_back({.id = call.id(), .name = call.name(), .arguments = call.arguments()});
        }
        msg.tool_call_id = m.tool_call_id();
        msg.name = m.name();
      }
      PS_ASSIGN_OR_RETURN(const nlohmann::ordered_json tools, TemplateTools(in, defaults));
      PS_ASSIGN_OR_RETURN(prompt, (*defaults.chat)->Encode(msgs, /*add_generation_prompt=*/true, tools));
      break;
    }
    case pb::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("input: one of text, token_ids or messages is required");
  }
  if (prompt.empty()) return absl::InvalidArgumentError("input: the prompt has no tokens");
  if (prompt.size() >= static_cast<size_t>(c.n_ctx)) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: the prompt has ", prompt.size(), " tokens; the context holds ", c.n_ctx));
  }
  const RequestLimits& limits = defaults.limits;
  if (limits.max_prompt_tokens > 0 && prompt.size() > static_cast<size_t>(limits.max_prompt_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "input: the prompt has ", prompt.size(), " tokens; this server takes ", limits.max_prompt_tokens, " at most"));
  }

  SamplingParams& sp = r->spec.sampling;
  sp = defaults.sampling;
  const pb::SamplingParams& s = in.sampling();
  if (s.has_temperature()) sp.temperature = s.temperature();
  if (s.has_top_p()) sp.top_p = s.top_p();
  if (s.has_top_k()) sp.top_k = s.top_k();
  if (s.has_min_p()) sp.min_p = s.min_p();
  if (s.has_repetition_penalty()) sp.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) sp.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) sp.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) sp.seed = s.seed();
  PS_ASSIGN_OR_RETURN(sp.grammar, Constraint(in, defaults));
  if (in.top_logprobs() > 20) return absl::InvalidArgumentError("top_logprobs must be <= 20");
  sp.top_logprobs = static_cast<int>(in.top_logprobs());

  StopCriteria& st = r->spec.stop;
  const pb::StoppingCriteria& p = in.stopping();
  const int room = c.n_ctx - static_cast<int>(prompt.size());
  if (p.has_max_new_tokens()) {
    if (p.max_new_tokens() > static_cast<uint32_t>(c.n_ctx)) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_new_tokens: ", p.max_new_tokens(), " exceeds the context length ", c.n_ctx));
    }
    if (limits.max_new_tokens > 0 && p.max_new_tokens() > static_cast<uint32_t>(limits.max_new_tokens)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("max_new_tokens: ", p.max_new_tokens(), " exceeds this server's limit ", limits.max_new_tokens));
    }
    st.max_new_tokens = static_cast<int>(p.max_new_tokens());
  } else {
    st.max_new_tokens = std::min(defaults.max_new_tokens, room);
    if (limits.max_new_tokens > 0) st.max_new_tokens = std::min(st.max_new_tokens, limits.max_new_tokens);
  }
  if (p.has_min_new_tokens()) {
    if (p.min_new_tokens() > static_cast<uint32_t>(c.n_ctx))
      return absl::InvalidArgumentError("min_new_tokens exceeds the context length");
    st.min_new_tokens = static_cast<int>(p.min_new_tokens());
  }
  if (p.stop_size() > limits.max_stop_strings) {
    return absl::ResourceExhaustedError(absl::StrCat("stop: ", p.stop_size(), " stop strings; this server takes ",
                                                     limits.max_stop_strings, " at most"));
  }
  for (const std::string& stop : p.stop()) {
    if (stop.size() > static_cast<size_t>(limits.max_stop_string_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat("stop: a stop string of ", stop.size(),
                                                       " bytes; this server takes ", limits.max_stop_string_bytes,
                                                       " at most"));
    }
  }
  st.stop_strings.assign(p.stop().begin(), p.stop().end());
  st.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  st.ignore_eos = p.ignore_eos();
  PS_RETURN_IF_ERROR(ValidateGeneration(c, prompt.size(), sp, st));

  if (in.n() > kMaxChoices) {
    return absl::InvalidArgumentError(absl::StrCat("n: ", in.n(), " choices; ", kMaxChoices, " at most"));
  }
  r->spec.n = in.n() == 0 ? 1 : static_cast<int>(in.n());
  // Mistral writes its calls after control tokens: the answer shows them, to be read.
  r->spec.show_control =
      ToolsOffered(in) && defaults.tool_format == ToolFormat::kMistral;  // the scheduler bounds it by its running set
  r->priority = in.priority();
  PS_ASSIGN_OR_RETURN(r->spec.pruning, defaults.strategies->FromProto(in.pruning()));
  r->spec.report_pruning = in.return_pruning_report();
  if (in.cache_salt().size() > kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt: ", in.cache_salt().size(), " bytes; ", kMaxCacheSaltBytes, " at most"));
  }
  // Apart: the principal's length first, so no salt can pose as another principal's.
  r->spec.cache_salt = absl::StrCat(principal.size(), ":", std::string(principal), in.cache_salt());
  return r;
}

pb::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return pb::FINISH_REASON_STOP;
    case FinishReason::kLength: return pb::FINISH_REASON_LENGTH;
    case FinishReason::kStopSequence: return pb::FINISH_REASON_STOP_SEQUENCE;
    case FinishReason::kCancelled: return pb::FINISH_REASON_CANCELLED;
    case FinishReason::kError: return pb::FINISH_REASON_ERROR;
  }
  return pb::FINISH_REASON_UNSPECIFIED;
}

pb::GenerateResponse ToProto(const RequestEvent& ev, bool want_logprobs) {
  pb::GenerateResponse out;
  if (ev.kind == RequestEvent::Kind::kTokens) {
    pb::TokenChunk* chunk = out.mutable_chunk();
    for (const SampledToken& t : ev.tokens) {
      chunk->add_token_ids(t.token);
      if (want_logprobs) {
        pb::TokenLogprob* lp = chunk->add_logprobs();
        lp->set_token_id(t.token);
        lp->set_logprob(t.logprob);
        for (const TokenLogprob& alt : t.top) {
          pb::TopLogprob* a = lp->add_top();
          a->set_token_id(alt.token);
          a->set_logprob(alt.logprob);
        }
      }
    }
    chunk->set_text(ev.text);
    chunk->set_index(static_cast<uint32_t>(ev.index));
    return out;
  }
  pb::Finished* f = out.mutable_finished();
  f->set_index(static_cast<uint32_t>(ev.index));
  f->set_reason(ToProto(ev.reason));
  f->set_matched_stop(ev.matched_stop);
  f->set_error_message(ev.error);
  pb::Usage* u = f->mutable_usage();
  u->set_prompt_tokens(ev.usage.prompt_tokens);
  u->set_completion_tokens(ev.usage.completion_tokens);
  u->set_prompt_tokens_computed(ev.usage.prompt_tokens_computed);
  u->set_queue_time_seconds(ev.usage.queue_seconds);
  u->set_time_to_first_token_seconds(ev.usage.ttft_seconds);
  u->set_total_time_seconds(ev.usage.total_seconds);
  u->set_kv_blocks(static_cast<uint64_t>(ev.usage.kv_blocks));
  u->set_kv_device_blocks(static_cast<uint64_t>(ev.usage.kv_device_blocks));
  u->set_strategy(ev.usage.strategy);
  u->set_cached_tokens(static_cast<uint32_t>(ev.usage.cached_tokens));
  for (const auto& [layer, tokens] : ev.usage.kept_per_layer) {
    pb::LayerTokens* lt = u->add_kept_per_layer();
    lt->set_layer(static_cast<uint32_t>(layer));
    lt->set_tokens(static_cast<uint32_t>(tokens));
  }
  if (!ev.kept_spans.empty()) {
    pb::PruningReport* report = f->mutable_pruning_report();
    uint32_t kept = 0;
    for (const KeptSpan& span : ev.kept_spans) {
      pb::TokenSpan* t = report->add_kept();
      t->set_begin(static_cast<uint32_t>(span.begin));
      t->set_end(static_cast<uint32_t>(span.end));
      t->set_text(span.text);
      kept += static_cast<uint32_t>(span.end - span.begin);
    }
    report->set_kept_tokens(kept);
    report->set_strategy(ev.usage.strategy);
  }
  return out;
}

absl::Status FinishStatus(const RequestEvent& ev) {
  switch (ev.cancel) {
    case CancelReason::kNone:
      return ev.reason == FinishReason::kError ? absl::InternalError(ev.error) : absl::OkStatus();
    case CancelReason::kClient: return absl::CancelledError("cancelled by the client");
    case CancelReason::kDeadline: return absl::DeadlineExceededError("deadline exceeded");
    case CancelReason::kAbort: return absl::CancelledError("aborted");
    case CancelReason::kShutdown: return absl::UnavailableError("the server is shutting down");
    case CancelReason::kSlowClient:
      return absl::ResourceExhaustedError("the client did not read its stream; the server's backlog for it is full");
  }
  return absl::OkStatus();
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  grpc::StatusCode code;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case absl::StatusCode::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case absl::StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case absl::StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case absl::StatusCode::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case absl::StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case absl::StatusCode::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case absl::StatusCode::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case absl::StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    default: code = grpc::StatusCode::INTERNAL; break;
  }
  return grpc::Status(code, std::string(s.message()));
}

}  // namespace ps::server
