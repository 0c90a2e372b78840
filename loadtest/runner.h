// Drives one load-generation run against a pruneserve: requests sent at the
// arrival process's times (at most max_concurrency in flight), each streamed on
// gRPC's callback API and timed as it arrives; some cancelled by the client,
// aborted by id or given a deadline on purpose. Returns one record per request sent.
#pragma once

#include <cstdint>
#include <vector>

#include "loadtest/arrivals.h"
#include "loadtest/report.h"
#include "loadtest/workload.h"
#include "pruneserve/v1/generation.grpc.pb.h"

namespace ps::loadtest {

struct RunOptions {
  ArrivalOptions arrivals;
  int num_requests = 0;          // stop sending after this many (0: after duration_s)
  double duration_s = 0;         // stop sending after this long (0: after num_requests)
  int max_concurrency = 0;       // calls in flight at most (0: unbounded)
  double cancel_fraction = 0;    // share of requests the client cancels ...
  double cancel_within_s = 1.0;  // ... at a uniform time this long after the send at most
  double deadline_fraction = 0;  // share of requests sent with a deadline ...
  double deadline_s = 1.0;       // ... this long after the send
  double abort_fraction = 0;     // share of requests ended by an Abort RPC (by request id) ...
  double abort_within_s = 1.0;   // ... at a uniform time this long after the send at most
  int priorities = 1;            // priorities drawn uniformly from [0, priorities)
  uint64_t seed = 0;
  bool progress = false;  // redraw a progress line on stderr
};

struct RunResult {
  std::vector<RequestRecord> records;  // in the order the calls ended
  double duration_s = 0;               // from the first send to the last call's end
};

// Sends requests until the count or the time is reached, then waits for every call.
// A request whose client cancel, Abort or deadline ended it counts as cancelled; any other
// non-OK status as failed.
RunResult Run(pb::Generation::Stub& stub, Workload& workload, StrategyMix& mix, const RequestOptions& request,
              const RunOptions& options);

}  // namespace ps::loadtest
