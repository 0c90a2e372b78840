#include "server/kv_event_stream.h"

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "server/convert.h"
#include "server/queued_write_reactor.h"

namespace ps::server {
namespace {

// Lives until OnDone. Batches are queued by the engine loop's thread and written one
// at a time (gRPC allows one outstanding write).
class KvEventStream final : public QueuedWriteReactor<pb::KvEventBatch> {
 public:
  KvEventStream(EngineLoop* loop, int block_tokens, bool with_tokens)
      : loop_(loop), block_tokens_(block_tokens), with_tokens_(with_tokens) {}

  // What the loop calls: it may outlive the stream (a call ended meanwhile).
  struct Feed {
    std::mutex mu;
    KvEventStream* stream = nullptr;
  };

  void Subscribe() {
    feed_ = std::make_shared<Feed>();
    feed_->stream = this;
    id_ = loop_->SubscribeKvEvents([feed = feed_](const std::vector<PrefixEvent>* events) {
      std::lock_guard<std::mutex> lock(feed->mu);
      if (feed->stream != nullptr) feed->stream->Push(events);
    });
  }

  void Reject(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = ToGrpc(status);
    WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      queue_.clear();
      if (!final_) final_ = grpc::Status(grpc::StatusCode::CANCELLED, "the subscriber is gone");
    }
    WriteNextLocked();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!final_) final_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    queue_.clear();
    WriteNextLocked();
  }
  void OnDone() override {
    if (feed_ != nullptr) {
      {
        std::lock_guard<std::mutex> lock(feed_->mu);
        feed_->stream = nullptr;
      }
      loop_->UnsubscribeKvEvents(id_);
    }
    delete this;
  }

 private:
  // The loop's events (nullptr: it stopped).
  void Push(const std::vector<PrefixEvent>* events) {
    std::lock_guard<std::mutex> lock(mu_);
    if (final_) return;
    if (events == nullptr) {
      final_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
      WriteNextLocked();
      return;
    }
    pb::KvEventBatch batch = KvEventsToProto(*events, block_tokens_, with_tokens_);
    batch.set_snapshot(next_sequence_ == 0);
    batch.set_sequence(next_sequence_++);
    if (queue_.size() >= kMaxKvEventBacklog) {
      queue_.clear();
      final_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "the subscriber fell behind the prefix cache's events; subscribe again");
    } else {
      queue_.push_back(std::move(batch));
    }
    WriteNextLocked();
  }

  EngineLoop* loop_;
  int block_tokens_;
  bool with_tokens_;
  std::shared_ptr<Feed> feed_;
  int64_t id_ = 0;
  uint64_t next_sequence_ = 0;  // mu_
};

}  // namespace

pb::KvEventBatch KvEventsToProto(const std::vector<PrefixEvent>& events, int block_tokens, bool with_tokens) {
  pb::KvEventBatch batch;
  const PrefixEvent* last = nullptr;
  for (const PrefixEvent& e : events) {
    const std::string medium(TierName(e.tier));
    // Continues the previous message: a stored page whose parent was the last one
    // stored in the same tier, or another removal from the same tier.
    const bool joins =
        last != nullptr && last->stored == e.stored && last->tier == e.tier && (!e.stored || e.parent == last->key);
    if (e.stored) {
      pb::KvBlockStored* s =
          joins ? batch.mutable_events()->rbegin()->mutable_stored() : batch.add_events()->mutable_stored();
      if (!joins) {
        s->set_parent_block_hash(e.parent);
        s->set_block_size(static_cast<uint32_t>(block_tokens));
        s->set_medium(medium);
      }
      s->add_block_hashes(e.key);
      if (with_tokens) s->mutable_token_ids()->Add(e.tokens.begin(), e.tokens.end());
    } else {
      pb::KvBlockRemoved* r =
          joins ? batch.mutable_events()->rbegin()->mutable_removed() : batch.add_events()->mutable_removed();
      if (!joins) r->set_medium(medium);
      r->add_block_hashes(e.key);
    }
    last = &e;
  }
  return batch;
}

grpc::ServerWriteReactor<pb::KvEventBatch>* StartKvEventStream(EngineLoop* loop, int block_tokens, bool with_tokens,
                                                               const absl::Status& rejected) {
  auto* stream = new KvEventStream(loop, block_tokens, with_tokens);
  if (!rejected.ok()) {
    stream->Reject(rejected);
  } else {
    stream->Subscribe();
  }
  return stream;
}

}  // namespace ps::server
