// Causal attention of one sequence's query rows over a selection of its cached
// key/value rows (paged blocks, F32/F16/BF16), masked by position (key position <=
// query position): tiled, with an online softmax, so no [queries, keys] matrix is
// built. A query segment of several rows first gathers its selected rows into one
// contiguous F32 buffer (O(keys x kv_dim); 16-row pages are too short to be sgemm
// operands), and its tiles of 64 queries x 256 keys each run two sgemm calls per
// head; a single query row (decode) reads the blocks in place, all heads of a GQA
// group per block, and splits long key ranges among threads.
#pragma once

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps {

void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args, ThreadPool& pool);

}  // namespace ps
