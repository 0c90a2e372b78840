// Causal attention of one sequence's query rows over a selection of its cached
// key/value rows (paged blocks, F32/F16/BF16), masked by position (key position <=
// query position). A sequence with several query rows (prefill) first gathers its
// selected rows of each query segment into one contiguous F32 buffer, so every
// query tile runs two sgemm calls however the rows are paged or selected; a single
// query row (decode) reads the blocks in place.
#pragma once

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps {

void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args, ThreadPool& pool);

}  // namespace ps
