#include "server/generation_service.h"

#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/kv_event_stream.h"
#include "server/metered_sink.h"
#include "server/queued_write_reactor.h"

namespace ps::server {
namespace {

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(status);
  return r;
}

class StreamSink;

// A merged message stays small enough for HTTP/2 flow control to hold back a
// client that does not read (a bigger one is taken whole past its window).
constexpr size_t kMaxMergedBytes = 4 << 10;

// A Generate call. Lives until OnDone. Messages are queued and written one at a
// time (gRPC allows one outstanding write); token chunks queued behind a write in
// flight are merged into one message (up to kMaxMergedBytes). Push may come from
// any thread.
class GenerateStream final : public QueuedWriteReactor<pb::GenerateResponse> {
 public:
  void Push(pb::GenerateResponse msg, std::optional<grpc::Status> final) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t tokens = msg.has_chunk() ? msg.chunk().token_ids_size() : 0;
    unsent_tokens_ += tokens;
    if (!final && tokens > 0 && unsent_tokens_ > max_backlog_ && request_) {
      request_->Cancel(CancelReason::kSlowClient);
    }
    if (msg.has_chunk() && !queue_.empty() && queue_.back().has_chunk() &&
        queue_.back().chunk().index() == msg.chunk().index() &&
        queue_.back().ByteSizeLong() + msg.ByteSizeLong() <= kMaxMergedBytes) {
      pb::TokenChunk* into = queue_.back().mutable_chunk();
      std::string text = into->text() + msg.chunk().text();
      into->MergeFrom(msg.chunk());  // appends the ids and logprobs (and would overwrite the text)
      into->set_text(std::move(text));
    } else {
      queue_.push_back(std::move(msg));
    }
    if (final) final_ = std::move(*final);
    WriteNextLocked();
  }
  // Submits the request and, if accepted, queues `info` ahead of anything the
  // engine produces (the lock keeps the engine's first Push waiting behind it).
  void Start(pb::GenerateResponse info, const std::function<absl::Status()>& submit) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status st = submit(); !st.ok()) {
      final_ = ToGrpc(st);
    } else {
      queue_.push_front(std::move(info));
    }
    WriteNextLocked();
  }
  // Ends the call without messages (validation errors before streaming).
  void Reject(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = status;
    WriteNextLocked();
  }
  void set_request(std::shared_ptr<Request> r, grpc::CallbackServerContext* ctx, size_t max_backlog) {
    request_ = std::move(r);
    ctx_ = ctx;
    max_backlog_ = max_backlog;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the client is gone; the engine sees the cancel at its next step
      if (request_) request_->Cancel(CancelReason::kClient);
      queue_.clear();
      unsent_tokens_ = 0;
      if (!final_) return;  // OnCancel follows; the engine's Finished event will finish us
    }
    WriteNextLocked();
  }
  void OnCancel() override {
    if (!request_) return;
    const bool expired = ctx_ != nullptr && ctx_->deadline() <= std::chrono::system_clock::now();
    request_->Cancel(expired ? CancelReason::kDeadline : CancelReason::kClient);
  }
  void OnDone() override;

  std::shared_ptr<StreamSink> sink;  // the request's sink; detached in OnDone
  std::shared_ptr<void> slot;        // the client's stream count, released in OnDone

 private:
  void Dequeued(const pb::GenerateResponse& msg) override {
    if (msg.has_chunk()) unsent_tokens_ -= msg.chunk().token_ids_size();
  }

  std::shared_ptr<Request> request_;
  grpc::CallbackServerContext* ctx_ = nullptr;
  size_t max_backlog_ = 0;    // unsent tokens beyond which the request is cancelled
  size_t unsent_tokens_ = 0;  // in queue_
};

// The request's sink: metrics and the log line, then the stream while it lives
// (the engine may outlive a stream whose client vanished).
class StreamSink final : public MeteredSink {
 public:
  // `tools`: how the model writes calls when the request offers tools (kNone: it does
  // not); the calls read from the answer go in Finished.tool_calls.
  StreamSink(GenerateStream* stream, Metrics* metrics, std::string id, std::string strategy, bool logprobs,
             ToolFormat tools)
      : MeteredSink(metrics, id, std::move(strategy)),
        stream_(stream),
        logprobs_(logprobs),
        tools_(tools),
        id_(std::move(id)) {}

  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = nullptr;
  }

 private:
  void Deliver(RequestEvent ev) override {
    std::optional<grpc::Status> final;
    std::optional<pb::GenerateResponse> tail;
    const bool finished = ev.kind == RequestEvent::Kind::kFinished;
    if (finished) {
      // The stream's status: the first failed choice's (n > 1), once the last one ends.
      if (absl::Status st = FinishStatus(ev); status_.ok()) status_ = std::move(st);
      if (ev.last) final = ToGrpc(status_);
      if (!ev.text.empty()) {
        RequestEvent text_ev{.kind = RequestEvent::Kind::kTokens, .index = ev.index, .text = ev.text};
        tail = ToProto(text_ev, false);  // held-back text released at the end
      }
    }
    if (ev.index >= static_cast<int>(answers_.size())) answers_.resize(ev.index + 1);
    if (tools_ != ToolFormat::kNone) answers_[ev.index] += ev.text;
    pb::GenerateResponse msg = ToProto(ev, logprobs_);
    if (finished && tools_ != ToolFormat::kNone) {
      const ParsedAnswer parsed = ParseToolCalls(tools_, answers_[ev.index]);
      for (size_t i = 0; i < parsed.calls.size(); ++i) {
        pb::ToolCall* call = msg.mutable_finished()->add_tool_calls();
        call->set_id(ToolCallId(tools_, id_, ev.index, i));
        call->set_name(parsed.calls[i].name);
        call->set_arguments(parsed.calls[i].arguments);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == nullptr) return;
    if (tail) stream_->Push(std::move(*tail), std::nullopt);
    stream_->Push(std::move(msg), std::move(final));
  }

  std::mutex mu_;
  GenerateStream* stream_;
  bool logprobs_;
  ToolFormat tools_;
  std::string id_;
  std::vector<std::string> answers_;  // with tools: each choice's text so far, read for calls at its end
  absl::Status status_;
};

void GenerateStream::OnDone() {
  if (sink) sink->Detach();
  delete this;
}

}  // namespace

absl::StatusOr<const ServiceState*> GenerationService::Admit(grpc::CallbackServerContext* ctx,
                                                             std::string* principal) const {
  if (access_ != nullptr) {
    const auto& md = ctx->client_metadata();
    const auto it = md.find("authorization");
    PS_ASSIGN_OR_RETURN(std::string who,
                        access_->Authenticate(it == md.end() ? std::string_view()
                                                             : std::string_view(it->second.data(), it->second.size())));
    if (principal != nullptr) *principal = std::move(who);
  }
  const ServiceState* state = state_.load();
  if (state == nullptr) return absl::UnavailableError("the model is loading");
  return state;
}

grpc::ServerWriteReactor<pb::GenerateResponse>* GenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                            const pb::GenerateRequest* in) {
  auto* stream = new GenerateStream();
  std::string principal;
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx, &principal);
  if (!admitted.ok()) {
    stream->Reject(ToGrpc(admitted.status()));
    return stream;
  }
  const ServiceState* b = *admitted;
  if (draining_.load()) {
    stream->Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is draining"));
    return stream;
  }
  auto req = RequestFromProto(*in, *b->model, b->defaults, principal);
  if (!req.ok()) {
    stream->Reject(ToGrpc(req.status()));
    return stream;
  }
  if (access_ != nullptr) {
    absl::StatusOr<std::shared_ptr<void>> slot = access_->OpenStream(PeerHost(ctx->peer()));
    if (!slot.ok()) {
      stream->Reject(ToGrpc(slot.status()));
      return stream;
    }
    stream->slot = *std::move(slot);
  }
  std::shared_ptr<Request> r = std::move(*req);
  r->id = in->request_id().empty() ? absl::StrCat("req-", next_id_.fetch_add(1)) : in->request_id();
  if (ctx->deadline() < std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    r->deadline = Clock::now() + (ctx->deadline() - std::chrono::system_clock::now());
  }
  const bool tools = in->tools_size() > 0 && in->tool_choice().mode() != pb::ToolChoice::NONE;
  stream->sink = std::make_shared<StreamSink>(stream, b->metrics, r->id, std::string(r->strategy()),
                                              in->logprobs() || in->top_logprobs() > 0,
                                              tools ? b->defaults.tool_format : ToolFormat::kNone);
  r->sink = stream->sink;
  stream->set_request(r, ctx, b->max_stream_backlog);
  pb::GenerateResponse info;
  info.mutable_prompt_info()->set_request_id(r->id);
  info.mutable_prompt_info()->set_prompt_tokens(static_cast<uint32_t>(r->spec.prompt.size()));
  info.mutable_prompt_info()->set_strategy(std::string(r->strategy()));
  stream->Start(std::move(info), [&] { return b->loop->Submit(r); });
  return stream;
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* ctx, const pb::AbortRequest* in,
                                                   pb::AbortResponse* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  const ServiceState* b = *admitted;
  if (in->request_id().empty())
    return Reply(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is empty"));
  out->set_found(b->loop->Abort(in->request_id()));
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* ctx, const pb::TokenizeRequest* in,
                                                      pb::TokenizeResponse* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  const ServiceState* b = *admitted;
  const Tokenizer* tok = b->model->tokenizer();
  for (int32_t id : tok->Encode(in->text(), in->has_add_special_tokens() ? in->add_special_tokens() : true,
                                in->parse_special_tokens())) {
    out->add_token_ids(id);
    out->add_pieces(tok->token_text(id));  // the vocabulary string: valid UTF-8, unlike a token's raw bytes
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                        const pb::DetokenizeRequest* in, pb::DetokenizeResponse* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  const ServiceState* b = *admitted;
  const Tokenizer* tok = b->model->tokenizer();
  std::vector<int32_t> ids(in->token_ids().begin(), in->token_ids().end());
  for (int32_t id : ids) {
    if (id < 0 || id >= tok->vocab_size()) {
      return Reply(
          ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("token_ids: ", id, " is out of range")));
    }
  }
  out->set_text(tok->Decode(ids, in->skip_special_tokens()));
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                          const pb::GetModelInfoRequest*, pb::ModelInfo* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  const ServiceState* b = *admitted;
  const ModelConfig& c = b->model->config();
  const Tokenizer* tok = b->model->tokenizer();
  out->set_name(c.name);
  out->set_architecture(c.arch_name);
  out->set_context_length(c.n_ctx);
  out->set_vocab_size(c.n_vocab);
  out->set_num_layers(c.n_layers);
  auto add = [&](const char* name, int32_t id) {
    if (id < 0) return;
    pb::SpecialToken* t = out->add_special_tokens();
    t->set_name(name);
    t->set_id(id);
    t->set_text(tok->token_text(id));
  };
  add("bos", tok->bos_id());
  add("eos", tok->eos_id());
  for (int32_t id : tok->end_of_generation_ids()) {
    if (id != tok->eos_id()) add("eog", id);
  }
  if (b->defaults.chat.ok()) {
    out->set_chat_template((*b->defaults.chat)->source());
  } else {
    out->set_chat_template_error(std::string(b->defaults.chat.status().message()));
  }
  out->set_device(b->device);
  out->set_cpu_isa(b->cpu_isa);
  out->set_activations(b->activations);
  for (const StrategyInfo* s : Strategies()) {
    out->add_strategies(s->name);
    out->add_strategy_summaries(s->summary);
    const absl::StatusOr<PruningParams> p = b->defaults.strategies->Get(s->name);
    if (p.ok()) PruningToProto(*p, out->add_strategy_defaults());
    const bool has = p.ok() && p->params != nullptr;
    const absl::Status usable = has ? p->params->Validate(b->model->config(), s->name) : absl::OkStatus();
    out->add_strategy_unavailable(std::string(usable.message()));
    out->add_strategy_notes(has ? p->params->Caveat() : std::string());
  }
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetLoad(grpc::CallbackServerContext* ctx, const pb::GetLoadRequest*,
                                                     pb::LoadInfo* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  const ServiceState* b = *admitted;
  const LoadSnapshot load = b->loop->Load();
  out->set_running(load.running);
  out->set_waiting(load.waiting);
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    const KvTierLoad& tier = load.kv[static_cast<int>(t)];
    pb::KvTierUsage* kv = out->add_kv();
    kv->set_tier(std::string(TierName(t)));
    kv->set_used_tokens(static_cast<uint64_t>(tier.used / b->kv_token_blocks) * b->kv_block_tokens);
    kv->set_capacity_tokens(static_cast<uint64_t>(tier.total / b->kv_token_blocks) * b->kv_block_tokens);
    kv->set_cached_tokens(static_cast<uint64_t>(tier.cached / b->kv_token_blocks) * b->kv_block_tokens);
  }
  out->set_swapped(load.swapped);
  out->set_preemptions_swap(load.preemptions[static_cast<int>(PreemptionMode::kSwap)]);
  out->set_preemptions_recompute(load.preemptions[static_cast<int>(PreemptionMode::kRecompute)]);
  out->set_swap_bytes_to_host(load.swap_bytes_to_host);
  out->set_swap_bytes_to_device(load.swap_bytes_to_device);
  return Reply(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::FlushCache(grpc::CallbackServerContext* ctx, const pb::FlushCacheRequest*,
                                                        pb::FlushCacheResponse* out) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  if (!admitted.ok()) return Reply(ctx, ToGrpc(admitted.status()));
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Answered from the engine loop's thread once the flush has run between two steps.
  (*admitted)->loop->FlushPrefixCache([reactor, out](absl::StatusOr<int64_t> freed) {
    if (freed.ok()) {
      spdlog::info("prefix cache flushed: {} blocks freed", *freed);
      out->set_dropped_blocks(static_cast<uint64_t>(*freed));
    }
    reactor->Finish(ToGrpc(freed.status()));
  });
  return reactor;
}

grpc::ServerWriteReactor<pb::KvEventBatch>* GenerationService::SubscribeKvEvents(grpc::CallbackServerContext* ctx,
                                                                                 const pb::SubscribeKvEventsRequest*) {
  const absl::StatusOr<const ServiceState*> admitted = Admit(ctx);
  const ServiceState* b = admitted.ok() ? *admitted : nullptr;
  // Token ids are the prompts' text: a server with API keys (tenants) sends keys only.
  const bool with_tokens = access_ == nullptr || !access_->requires_token();
  return StartKvEventStream(b != nullptr ? b->loop : nullptr, b != nullptr ? b->kv_block_tokens : 0, with_tokens,
                            admitted.status());
}

}  // namespace ps::server
