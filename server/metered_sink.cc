#include "server/metered_sink.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace ps::server {

void MeteredSink::OnEvent(RequestEvent ev) {
  const auto now = Clock::now();
  if (ev.kind == RequestEvent::Kind::kTokens) {
    if (ev.index >= static_cast<int>(last_token_.size())) last_token_.resize(ev.index + 1);
    Clock::time_point& last = last_token_[ev.index];
    if (last != Clock::time_point{}) {
      metrics_->OnInterToken(strategy_, std::chrono::duration<double>(now - last).count());
    }
    last = now;
  } else if (ev.last) {  // the request's usage, once (n > 1: every choice's)
    if (ev.usage.completion_tokens > 0) metrics_->OnFirstToken(strategy_, ev.usage.ttft_seconds);
    metrics_->OnFinished(strategy_, ev.reason, ev.usage);
    spdlog::info(
        "request {} finished: prompt {} tokens, computed {:.1f}, strategy {}, ttft {:.3f} s, {} tokens, {:.3f} s, "
        "{}{}",
        id_, ev.usage.prompt_tokens, ev.usage.prompt_tokens_computed, strategy_, ev.usage.ttft_seconds,
        ev.usage.completion_tokens, ev.usage.total_seconds, FinishReasonName(ev.reason),
        ev.cancel == CancelReason::kNone ? "" : absl::StrCat(" (", std::string(CancelReasonName(ev.cancel)), ")"));
  }
  Deliver(std::move(ev));
}

}  // namespace ps::server
