#include "server/openai_api.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "proto/field_args.h"
#include "server/convert.h"

namespace ps::server::openai {
namespace {

absl::Status Bad(absl::string_view param, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", why));
}

// The body's fields, nulls dropped (clients send `"stop": null` for "unset").
class Fields {
 public:
  explicit Fields(const Json& body) {
    for (const auto& [k, v] : body.items()) {
      if (!v.is_null()) fields_.emplace(k, &v);
    }
  }
  const Json* Get(const std::string& name) const {
    auto it = fields_.find(name);
    return it == fields_.end() ? nullptr : it->second;
  }
  absl::Status OnlyKnown(const std::set<std::string>& known) const {
    for (const auto& [k, v] : fields_) {
      if (!known.count(k)) return Bad(k, "unrecognized request argument");
    }
    return absl::OkStatus();
  }
  absl::Status Bool(const std::string& name, bool* out) const {
    const Json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Bad(name, "must be a boolean");
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  // A number; `set` receives it when present.
  template <typename Set>
  absl::Status Number(const std::string& name, Set set) const {
    const Json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Bad(name, "must be a number");
    set(v->get<double>());
    return absl::OkStatus();
  }
  // An integer in [lo, hi]; `set` receives it when present.
  template <typename Set>
  absl::Status Integer(const std::string& name, int64_t lo, int64_t hi, Set set) const {
    const Json* v = Get(name);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) ||
        v->get<int64_t>() < lo || v->get<int64_t>() > hi) {
      return Bad(name, absl::StrCat("must be an integer in [", lo, ", ", hi, "]"));
    }
    set(v->get<int64_t>());
    return absl::OkStatus();
  }

 private:
  std::map<std::string, const Json*> fields_;
};

// "pruning": {"strategy": "lazyllm", "keep": [0.3, 0.1], ...}
absl::Status ParsePruning(const Json& v, pb::PruningConfig* out) {
  if (!v.is_object()) return Bad("pruning", "must be an object {\"strategy\": NAME, PARAM: VALUE, ...}");
  if (!v.contains("strategy") || !v["strategy"].is_string())
    return Bad("pruning.strategy", "a strategy name is required");
  Json params = Json::object();  // the strategy's message in protobuf's JSON mapping
  for (const auto& [k, item] : v.items()) {
    if (k == "strategy" || item.is_null()) continue;
    const auto nested = [](const Json& x) { return x.is_array() || x.is_object(); };
    if (item.is_object() || (item.is_array() && std::ranges::any_of(item, nested))) {
      return Bad(absl::StrCat("pruning.", k), "must be a number, a boolean, a string or an array of them");
    }
    params[k] = item;
  }
  if (absl::Status s = SetStrategyJson(v["strategy"].get<std::string>(), params.dump(), out); !s.ok()) {
    return Bad("pruning", s.message());
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Fields& f, pb::StoppingCriteria* out) {
  const Json* v = f.Get("stop");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    out->add_stop(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return Bad("stop", "must be a string or an array of strings");
  for (const Json& s : *v) {
    if (!s.is_string()) return Bad("stop", "must be a string or an array of strings");
    out->add_stop(s.get<std::string>());
  }
  return absl::OkStatus();
}

// prompt: a string, an array of token ids, or a one-element array of either.
absl::Status ParsePrompt(const Json* v, pb::GenerateRequest* out) {
  if (v == nullptr) return Bad("prompt", "is required");
  const Json* p = v;
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) p = &(*v)[0];
  if (p->is_string()) {
    out->set_text(p->get<std::string>());
    return absl::OkStatus();
  }
  if (p->is_array() && !p->empty()) {
    for (const Json& id : *p) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return Bad("prompt", "token ids must be non-negative integers");
      out->mutable_token_ids()->add_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
    return absl::OkStatus();
  }
  if (v->is_array() && v->size() > 1)
    return Bad("prompt", "one prompt per request (batches of prompts are not supported)");
  return Bad("prompt", "must be a string, an array of token ids, or a one-element array of either");
}

// messages: [{"role": ..., "content": "..." | [{"type": "text", "text": "..."}]}]
absl::Status ParseMessages(const Json* v, pb::GenerateRequest* out) {
  if (v == nullptr) return Bad("messages", "is required");
  if (!v->is_array() || v->empty()) return Bad("messages", "must be a non-empty array");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) return Bad(at, "needs a string role");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return Bad(absl::StrCat(at, ".role"),
                 absl::StrCat("'", role, "' is not supported (system, user, assistant, tool)"));
    pb::ChatMessage* out_m = out->mutable_messages()->add_messages();
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const Json& calls = m["tool_calls"];
      if (!calls.is_array()) return Bad(absl::StrCat(at, ".tool_calls"), "must be an array");
      for (size_t k = 0; k < calls.size(); ++k) {
        const Json& call = calls[k];
        const std::string call_at = absl::StrCat(at, ".tool_calls[", k, "]");
        const Json* fn = call.is_object() && call.contains("function") ? &call["function"] : nullptr;
        if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
          return Bad(call_at, "needs a function with a name");
        }
        const Json args = fn->value("arguments", Json("{}"));
        pb::ToolCall* out_c = out_m->add_tool_calls();
        out_c->set_id(call.value("id", ""));
        out_c->set_name((*fn)["name"].get<std::string>());
        out_c->set_arguments(args.is_string() ? args.get<std::string>() : args.dump());
      }
    }
    if (role == "tool") {
      const Json id = m.value("tool_call_id", Json());
      if (!id.is_string()) return Bad(absl::StrCat(at, ".tool_call_id"), "is required for a tool message");
      out_m->set_tool_call_id(id.get<std::string>());
      if (m.contains("name") && m["name"].is_string()) out_m->set_name(m["name"].get<std::string>());
    }
    std::string content;
    const Json c = m.value("content", Json());
    if (c.is_null() && out_m->tool_calls_size() > 0) {
      // an assistant's calls without text
    } else if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const Json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return Bad(absl::StrCat(at, ".content"), "only text parts are supported");
        content += part["text"].get<std::string>();
      }
    } else {
      return Bad(absl::StrCat(at, ".content"), "must be a string or an array of text parts");
    }
    out_m->set_role(role);
    out_m->set_content(content);
  }
  return absl::OkStatus();
}

// tools: [{"type": "function", "function": {name, description, parameters}}];
// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}};
// parallel_tool_calls.
absl::Status ParseTools(const Fields& f, pb::GenerateRequest* out) {
  if (const Json* tools = f.Get("tools"); tools != nullptr) {
    if (!tools->is_array()) return Bad("tools", "must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string at = absl::StrCat("tools[", i, "]");
      if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
          !t["function"].is_object()) {
        return Bad(at, "must be {\"type\": \"function\", \"function\": {...}}");
      }
      const Json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
        return Bad(absl::StrCat(at, ".function.name"), "is required");
      }
      pb::Tool* tool = out->add_tools();
      tool->set_name(fn["name"].get<std::string>());
      if (fn.contains("description") && fn["description"].is_string()) {
        tool->set_description(fn["description"].get<std::string>());
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null()) {
        if (!fn["parameters"].is_object()) return Bad(absl::StrCat(at, ".function.parameters"), "must be an object");
        tool->set_parameters(fn["parameters"].dump());
      }
    }
  }
  pb::ToolChoice* choice = out->mutable_tool_choice();
  if (const Json* c = f.Get("tool_choice"); c != nullptr) {
    if (c->is_string() && (*c == "auto" || *c == "none" || *c == "required")) {
      choice->set_mode(*c == "auto"   ? pb::ToolChoice::AUTO
                       : *c == "none" ? pb::ToolChoice::NONE
                                      : pb::ToolChoice::REQUIRED);
    } else if (c->is_object() && c->value("type", "") == "function" && c->contains("function") &&
               (*c)["function"].is_object() && (*c)["function"].contains("name") &&
               (*c)["function"]["name"].is_string()) {
      choice->set_mode(pb::ToolChoice::FUNCTION);
      choice->set_function((*c)["function"]["name"].get<std::string>());
    } else {
      return Bad("tool_choice",
                 "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (const Json* p = f.Get("parallel_tool_calls"); p != nullptr) {
    if (!p->is_boolean()) return Bad("parallel_tool_calls", "must be a boolean");
    choice->set_parallel(p->get<bool>());
  }
  return absl::OkStatus();
}

// Structured outputs: OpenAI's response_format (json_object, json_schema), vLLM's
// guided_json, guided_regex and guided_grammar, llama.cpp's grammar; one at a time.
absl::Status ParseConstraint(const Fields& f, pb::GenerateRequest* out) {
  int given = 0;
  if (const Json* r = f.Get("response_format"); r != nullptr) {
    const std::string type = r->is_object() ? r->value("type", "") : "";
    if (type == "json_object") {
      out->set_json_object(true);
      ++given;
    } else if (type == "json_schema") {
      const Json* spec = r->contains("json_schema") ? &(*r)["json_schema"] : nullptr;
      if (spec == nullptr || !spec->is_object() || !spec->contains("schema")) {
        return Bad("response_format.json_schema.schema", "is required");
      }
      if (!(*spec)["schema"].is_object() && !(*spec)["schema"].is_boolean()) {
        return Bad("response_format.json_schema.schema", "must be a JSON Schema object");
      }
      out->set_json_schema((*spec)["schema"].dump());  // strict or not, the output follows it
      ++given;
    } else if (type != "text") {
      return Bad("response_format", "type must be text, json_object or json_schema");
    }
  }
  if (const Json* g = f.Get("guided_json"); g != nullptr) {
    if (!g->is_object() && !g->is_string()) return Bad("guided_json", "must be a JSON Schema (an object or its text)");
    out->set_json_schema(g->is_string() ? g->get<std::string>() : g->dump());
    ++given;
  }
  for (const char* name : {"guided_grammar", "grammar"}) {
    if (const Json* g = f.Get(name); g != nullptr) {
      if (!g->is_string()) return Bad(name, "must be a grammar in GBNF");
      out->set_grammar(g->get<std::string>());
      ++given;
    }
  }
  if (const Json* g = f.Get("guided_regex"); g != nullptr) {
    if (!g->is_string()) return Bad("guided_regex", "must be a regular expression");
    out->set_regex(g->get<std::string>());
    ++given;
  }
  if (given > 1) {
    return Bad("response_format", "give one of response_format, guided_json, guided_regex, guided_grammar, grammar");
  }
  return absl::OkStatus();
}

const std::set<std::string>& KnownFields(Api api) {
  static const std::set<std::string> kCommon = {"model",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "n",
                                                "stream",
                                                "stream_options",
                                                "logprobs",
                                                "stop",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "logit_bias",
                                                "user",
                                                "seed",
                                                "top_k",
                                                "min_p",
                                                "repetition_penalty",
                                                "min_tokens",
                                                "ignore_eos",
                                                "priority",
                                                "cache_salt",
                                                "pruning",
                                                "guided_json",
                                                "guided_grammar",
                                                "guided_regex",
                                                "grammar"};
  static const std::set<std::string> kCompletions = [] {
    std::set<std::string> s = kCommon;
    s.insert({"prompt", "echo", "best_of", "suffix"});
    return s;
  }();
  static const std::set<std::string> kChat = [] {
    std::set<std::string> s = kCommon;
    s.insert({"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
              "parallel_tool_calls", "metadata", "store", "service_tier"});
    return s;
  }();
  return api == Api::kChat ? kChat : kCompletions;
}

// Fields OpenAI defines that this server cannot honour, unless at their neutral value.
absl::Status Unsupported(Api api, const Fields& f) {
  if (const Json* e = f.Get("echo"); e != nullptr && *e != false) return Bad("echo", "echo is not supported");
  if (f.Get("suffix") != nullptr) return Bad("suffix", "suffix is not supported");
  if (const Json* lb = f.Get("logit_bias"); lb != nullptr && !(lb->is_object() && lb->empty()))
    return Bad("logit_bias", "logit_bias is not supported");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ApiRequest> ParseRequest(Api api, std::string_view body, const std::vector<std::string>& served_models) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the body is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  const Fields f(j);
  ApiRequest out;
  out.api = api;
  PS_RETURN_IF_ERROR(f.OnlyKnown(KnownFields(api)));
  PS_RETURN_IF_ERROR(Unsupported(api, f));

  const Json* model = f.Get("model");
  if (model == nullptr || !model->is_string()) return Bad("model", "a model name is required");
  out.model = model->get<std::string>();
  if (std::find(served_models.begin(), served_models.end(), out.model) == served_models.end()) {
    return absl::NotFoundError(absl::StrCat("model: the model '", out.model,
                                            "' does not exist (served: ", absl::StrJoin(served_models, ", "), ")"));
  }
  pb::GenerateRequest& r = out.request;
  if (api == Api::kChat) {
    PS_RETURN_IF_ERROR(ParseMessages(f.Get("messages"), &r));
    PS_RETURN_IF_ERROR(ParseTools(f, &r));
  } else {
    PS_RETURN_IF_ERROR(ParsePrompt(f.Get("prompt"), &r));
  }
  PS_RETURN_IF_ERROR(ParseConstraint(f, &r));

  pb::SamplingParams* s = r.mutable_sampling();
  pb::StoppingCriteria* st = r.mutable_stopping();
  PS_RETURN_IF_ERROR(f.Number("temperature", [&](double v) { s->set_temperature(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(f.Number("top_p", [&](double v) { s->set_top_p(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(f.Number("min_p", [&](double v) { s->set_min_p(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(f.Number("presence_penalty", [&](double v) { s->set_presence_penalty(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(f.Number("frequency_penalty", [&](double v) { s->set_frequency_penalty(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(
      f.Number("repetition_penalty", [&](double v) { s->set_repetition_penalty(static_cast<float>(v)); }));
  PS_RETURN_IF_ERROR(f.Integer("top_k", -1, INT32_MAX, [&](int64_t v) { s->set_top_k(static_cast<int32_t>(v)); }));
  PS_RETURN_IF_ERROR(
      f.Integer("seed", INT64_MIN, INT64_MAX, [&](int64_t v) { s->set_seed(static_cast<uint64_t>(v)); }));

  // Completions default to 16 tokens, as OpenAI's; chat to the server's default.
  if (api == Api::kCompletions) st->set_max_new_tokens(16);
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    PS_RETURN_IF_ERROR(
        f.Integer(name, 1, UINT32_MAX, [&](int64_t v) { st->set_max_new_tokens(static_cast<uint32_t>(v)); }));
  }
  PS_RETURN_IF_ERROR(
      f.Integer("min_tokens", 0, UINT32_MAX, [&](int64_t v) { st->set_min_new_tokens(static_cast<uint32_t>(v)); }));
  bool ignore_eos = false;
  PS_RETURN_IF_ERROR(f.Bool("ignore_eos", &ignore_eos));
  st->set_ignore_eos(ignore_eos);
  PS_RETURN_IF_ERROR(ParseStop(f, st));
  PS_RETURN_IF_ERROR(
      f.Integer("priority", INT32_MIN, INT32_MAX, [&](int64_t v) { r.set_priority(static_cast<int32_t>(v)); }));

  if (api == Api::kChat) {
    PS_RETURN_IF_ERROR(f.Bool("logprobs", &out.logprobs));
    PS_RETURN_IF_ERROR(f.Integer("top_logprobs", 0, 20, [&](int64_t v) { out.top_logprobs = static_cast<int>(v); }));
    if (out.top_logprobs > 0 && !out.logprobs) return Bad("top_logprobs", "requires logprobs: true");
  } else {
    // Completions: logprobs = the number of alternatives (0: the sampled token's only).
    PS_RETURN_IF_ERROR(f.Integer("logprobs", 0, 20, [&](int64_t v) {
      out.logprobs = true;
      out.top_logprobs = static_cast<int>(v);
    }));
  }
  r.set_logprobs(out.logprobs);
  r.set_top_logprobs(static_cast<uint32_t>(out.top_logprobs));

  PS_RETURN_IF_ERROR(f.Bool("stream", &out.stream));
  if (const Json* so = f.Get("stream_options"); so != nullptr) {
    if (!out.stream) return Bad("stream_options", "only allowed with stream: true");
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    const Json iu = so->value("include_usage", Json(false));
    if (!iu.is_boolean()) return Bad("stream_options.include_usage", "must be a boolean");
    out.include_usage = iu.get<bool>();
  }
  PS_RETURN_IF_ERROR(f.Integer("n", 1, kMaxChoices, [&](int64_t v) { out.n = static_cast<int>(v); }));
  out.best_of = out.n;
  PS_RETURN_IF_ERROR(f.Integer("best_of", 1, kMaxChoices, [&](int64_t v) { out.best_of = static_cast<int>(v); }));
  if (out.best_of < out.n) return Bad("best_of", "must be at least n");
  if (out.stream && out.best_of > out.n) {
    return Bad("best_of", "streaming needs best_of = n (the best choices are known only at the end)");
  }
  r.set_n(static_cast<uint32_t>(out.best_of));
  if (const Json* salt = f.Get("cache_salt"); salt != nullptr) {  // vLLM's: the gRPC field's checks then apply
    if (!salt->is_string()) return Bad("cache_salt", "must be a string");
    r.set_cache_salt(salt->get<std::string>());
  }
  if (const Json* p = f.Get("pruning"); p != nullptr) PS_RETURN_IF_ERROR(ParsePruning(*p, r.mutable_pruning()));
  return out;
}

std::string ErrorParam(Api api, absl::string_view message) {
  const size_t end = message.find_first_of(": ");
  if (end == absl::string_view::npos || end == 0) return "";
  std::string word(message.substr(0, end));
  if (word.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_.[]") != std::string::npos) return "";
  if (word == "max_new_tokens") return api == Api::kChat ? "max_completion_tokens" : "max_tokens";
  if (word == "min_new_tokens") return "min_tokens";
  if (word == "input" || word == "text" || word == "token_ids") return api == Api::kChat ? "messages" : "prompt";
  if (word == "top_logprobs" && api == Api::kCompletions) return "logprobs";
  if (word.rfind("pruning", 0) == 0) return "pruning";
  if (word.rfind("stop", 0) == 0) return "stop";
  if (word == "the") return "";  // "the body is not valid JSON"
  // Structured outputs: chat's response_format, completions' vLLM extensions.
  if (word == "json_schema" || word == "json_object") return api == Api::kChat ? "response_format" : "guided_json";
  if (word == "grammar") return "guided_grammar";
  if (word == "regex") return "guided_regex";
  return word;
}

std::pair<int, Json> ErrorResponse(Api api, const absl::Status& status) {
  int http = 500;
  std::string type = "server_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: http = 400, type = "invalid_request_error"; break;
    case absl::StatusCode::kUnauthenticated: http = 401, type = "authentication_error"; break;
    case absl::StatusCode::kNotFound: http = 404, type = "invalid_request_error"; break;
    case absl::StatusCode::kAlreadyExists: http = 409, type = "invalid_request_error"; break;
    case absl::StatusCode::kResourceExhausted:  // "FIELD: ..." beyond a server limit is the request's fault
      if (const size_t colon = status.message().find(':'); colon != absl::string_view::npos &&
                                                           colon == status.message().find_first_of(": ") &&
                                                           !ErrorParam(api, status.message()).empty()) {
        http = 400, type = "invalid_request_error";
      } else {
        http = 429, type = "rate_limit_error";
      }
      break;
    case absl::StatusCode::kUnavailable: http = 503, type = "service_unavailable"; break;
    case absl::StatusCode::kDeadlineExceeded: http = 504, type = "timeout"; break;
    default: break;
  }
  const std::string param = http == 400 || http == 404 ? ErrorParam(api, status.message()) : "";
  Json error = {
      {"message", std::string(status.message())},
      {"type", type},
      {"param", param.empty() ? Json() : Json(param)},
      {"code", status.code() == absl::StatusCode::kNotFound && param == "model" ? Json("model_not_found") : Json()}};
  return {http, Json{{"error", std::move(error)}}};
}

Json ModelList(const std::vector<std::string>& served_models, int context_length, int64_t created) {
  Json data = Json::array();
  for (const std::string& m : served_models) {
    data.push_back({{"id", m},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "pruneserve"},
                    {"max_model_len", context_length}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

ResponseWriter::ResponseWriter(const ApiRequest& request, std::string id, int64_t created,
                               std::function<std::string(int32_t)> token_text, ToolFormat tools)
    : api_(request.api),
      id_(std::move(id)),
      model_(request.model),
      created_(created),
      logprobs_(request.logprobs),
      include_usage_(request.include_usage),
      top_logprobs_(request.top_logprobs),
      n_(request.n),
      token_text_(std::move(token_text)),
      tools_(request.api == Api::kChat ? tools : ToolFormat::kNone),
      choices_(static_cast<size_t>(std::max(request.n, request.best_of))) {}

ResponseWriter::Choice& ResponseWriter::At(int index) {
  PS_CHECK(index >= 0 && index < static_cast<int>(choices_.size()))
      << "an event of choice " << index << " of " << choices_.size();
  return choices_[index];
}

Json ResponseWriter::ToolCallsJson(const std::vector<ToolCall>& calls, int choice) const {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    out.push_back({{"index", i},
                   {"id", ToolCallId(tools_, id_, choice, i)},
                   {"type", "function"},
                   {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  return out;
}

const char* ResponseWriter::FinishReasonText(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
    case FinishReason::kStopSequence: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "abort";
    case FinishReason::kError: return "error";
  }
  return "stop";
}

Json ResponseWriter::UsageJson(const Usage& u) const {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// Completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: {content: [...]}.
Json ResponseWriter::Logprobs(const std::vector<SampledToken>& tokens, size_t text_offset) const {
  if (!logprobs_) return Json();
  if (api_ == Api::kChat) {
    auto entry = [&](int32_t id, float logprob) {
      const std::string t = token_text_(id);
      return Json{{"token", t}, {"logprob", logprob}, {"bytes", std::vector<uint8_t>(t.begin(), t.end())}};
    };
    Json content = Json::array();
    for (const SampledToken& s : tokens) {
      Json e = entry(s.token, s.logprob);
      e["top_logprobs"] = Json::array();
      for (const TokenLogprob& alt : s.top) e["top_logprobs"].push_back(entry(alt.token, alt.logprob));
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (const SampledToken& s : tokens) {
    const std::string t = token_text_(s.token);
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(s.logprob);
    Json top = Json::object();
    for (const TokenLogprob& alt : s.top) top[token_text_(alt.token)] = alt.logprob;
    out["top_logprobs"].push_back(top_logprobs_ > 0 ? std::move(top) : Json());
    out["text_offset"].push_back(text_offset);
    text_offset += t.size();
  }
  return out;
}

void ResponseWriter::AppendLogprobs(Json& into, const Json& more) const {
  if (more.is_null()) return;
  if (into.is_null()) {
    into = more;
    return;
  }
  for (const auto& [key, list] : more.items()) {
    for (const Json& item : list) into[key].push_back(item);
  }
}

Json ResponseWriter::Chunk(Json choice, int index) const {
  choice["index"] = index;
  return {{"id", id_},
          {"object", api_ == Api::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", Json::array({std::move(choice)})}};
}

std::string ResponseWriter::StreamEvent(const RequestEvent& ev) {
  auto sse = [](const Json& j) {
    return absl::StrCat("data: ", j.dump(-1, ' ', false, Json::error_handler_t::replace), "\n\n");
  };
  if (closed_) return "";
  Choice& c = At(ev.index);
  std::string out;
  const bool finished = ev.kind == RequestEvent::Kind::kFinished;
  if (finished) {
    if (absl::Status s = FinishStatus(ev); !s.ok()) {
      closed_ = true;
      return absl::StrCat(sse(ErrorResponse(api_, s).second), "data: [DONE]\n\n");
    }
  }
  if (api_ == Api::kChat && !c.role_sent) {
    c.role_sent = true;
    out += sse(
        Chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", Json()}, {"finish_reason", Json()}},
              ev.index));
  }
  // The calls, read once the answer is whole (what may be a call was held back).
  ParsedAnswer answer;
  if (finished && tools_ != ToolFormat::kNone) answer = ParseToolCalls(tools_, c.text + ev.text);
  if (!ev.text.empty() || !ev.tokens.empty()) {
    const Json logprobs = Logprobs(ev.tokens, c.text.size());
    c.text += ev.text;
    // What is surely content goes now: all of it without tools; with them, what
    // precedes a possible call, and at the end the rest unless it was calls.
    const size_t sure = tools_ == ToolFormat::kNone        ? c.text.size()
                        : finished && answer.calls.empty() ? c.text.size()
                        : finished ? std::max(c.sent, std::min(c.text.size(), answer.content.size()))
                                   : std::max(c.sent, SureContent(tools_, c.text));
    const std::string delta = c.text.substr(c.sent, sure - c.sent);
    c.sent = sure;
    if (!delta.empty() || !ev.tokens.empty()) {
      Json choice = api_ == Api::kChat ? Json{{"delta", {{"content", delta}}}} : Json{{"text", delta}};
      choice["logprobs"] = logprobs;
      choice["finish_reason"] = Json();
      out += sse(Chunk(std::move(choice), ev.index));
    }
  }
  if (finished) {
    if (!answer.calls.empty()) {
      out += sse(Chunk({{"delta", {{"tool_calls", ToolCallsJson(answer.calls, ev.index)}}},
                        {"logprobs", Json()},
                        {"finish_reason", Json()}},
                       ev.index));
    }
    Json choice = api_ == Api::kChat ? Json{{"delta", Json::object()}} : Json{{"text", ""}};
    choice["logprobs"] = Json();
    choice["finish_reason"] = answer.calls.empty() ? FinishReasonText(ev.reason) : "tool_calls";
    out += sse(Chunk(std::move(choice), ev.index));
    if (ev.last) {
      if (include_usage_) {
        Json usage = Chunk(Json::object(), 0);
        usage["choices"] = Json::array();
        usage["usage"] = UsageJson(ev.usage);
        out += sse(usage);
      }
      out += "data: [DONE]\n\n";
    }
  }
  return out;
}

void ResponseWriter::Collect(const RequestEvent& ev) {
  Choice& c = At(ev.index);
  AppendLogprobs(c.logprobs, Logprobs(ev.tokens, c.text.size()));
  c.text += ev.text;
  for (const SampledToken& t : ev.tokens) c.logprob += t.logprob;
  if (ev.kind != RequestEvent::Kind::kFinished) return;
  c.finish = ev;
  if (ev.last) usage_ = ev.usage;
}

absl::Status ResponseWriter::Status() const {
  for (const Choice& c : choices_) {
    if (c.finish) PS_RETURN_IF_ERROR(FinishStatus(*c.finish));
  }
  return absl::OkStatus();
}

Json ResponseWriter::Final() const {
  // The n choices returned: all, or the most likely n of best_of (in that order).
  std::vector<int> order(choices_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  if (static_cast<int>(order.size()) > n_) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return choices_[a].logprob > choices_[b].logprob; });
    order.resize(n_);
  }
  Json list = Json::array();
  for (int k = 0; k < static_cast<int>(order.size()); ++k) {
    const Choice& c = choices_[order[k]];
    const FinishReason reason = c.finish ? c.finish->reason : FinishReason::kCancelled;
    Json choice = {{"index", k}, {"logprobs", c.logprobs}, {"finish_reason", FinishReasonText(reason)}};
    if (api_ == Api::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (tools_ != ToolFormat::kNone) {
        const ParsedAnswer answer = ParseToolCalls(tools_, c.text);
        if (!answer.calls.empty()) {
          choice["message"]["content"] = answer.content.empty() ? Json() : Json(answer.content);
          choice["message"]["tool_calls"] = ToolCallsJson(answer.calls, k);
          choice["finish_reason"] = "tool_calls";
        }
      }
    } else {
      choice["text"] = c.text;
    }
    list.push_back(std::move(choice));
  }
  return {{"id", id_},
          {"object", api_ == Api::kChat ? "chat.completion" : "text_completion"},
          {"created", created_},
          {"model", model_},
          {"choices", std::move(list)},
          {"usage", UsageJson(usage_)}};
}

}  // namespace ps::server::openai
