// A server-streaming call's writer: messages queued from any thread and written one
// at a time (gRPC allows one outstanding write), then the call's status once the
// queue is empty. The streams of Generate and SubscribeKvEvents derive from it.
#pragma once

#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include <grpcpp/grpcpp.h>

namespace ps::server {

template <typename Msg>
class QueuedWriteReactor : public grpc::ServerWriteReactor<Msg> {
 protected:
  // Writes the next queued message, or finishes with final_ once none is left
  // (mu_ held). A no-op while a write is in flight: OnWriteDone calls it again.
  void WriteNextLocked() {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      current_ = std::move(queue_.front());
      queue_.pop_front();
      Dequeued(current_);
      this->StartWrite(&current_);
    } else if (final_) {
      finished_ = true;
      this->Finish(*final_);
    }
  }
  // A message left the queue for the wire (mu_ held).
  virtual void Dequeued(const Msg& msg) { (void)msg; }

  std::mutex mu_;  // guards the fields below (and the derived class's own)
  std::deque<Msg> queue_;
  Msg current_;                        // being written
  std::optional<grpc::Status> final_;  // the status to end with once the queue is empty
  bool writing_ = false, finished_ = false;
};

}  // namespace ps::server
