// Causal attention of one sequence's query rows over a selection of its cached
// key/value rows (paged blocks, F32/F16/BF16), masked by position (key position <=
// query position): tiled, with an online softmax, so no [queries, keys] matrix is
// built. A query segment of several rows runs tiles of 64 queries x 256 keys: on a CPU
// with AVX-512 BF16 and a BF16 cache, on BF16 dot products, each tile's keys read in place
// from their pages and its values packed once for every head of their GQA group
// (kernels/cpu/attention_avx512.h); over a Q8_0 cache the same tiles with the scores on
// int8 dot products (kernels/cpu/attention_avx512_q8.h); otherwise the segment first gathers its selected rows
// into one contiguous F32 buffer (O(keys x kv_dim); 16-row pages are too short to be
// sgemm operands) and each tile runs two sgemm calls per head. A single query row
// (decode) reads the blocks in place, all heads of a GQA group per block, and splits
// long key ranges among threads.
#pragma once

#include <span>

#include "base/thread_pool.h"
#include "kernels/types.h"

namespace ps {

void Attention(const AttentionShape& shape, const KvRows& kv, const AttentionArgs& args, ThreadPool& pool);

// Several sequences' attentions (a decode batch's). Single query rows over too few keys to
// split share one parallel region, each call on one thread (a region per call would cost
// more than its work); the others run one after another on the whole pool. The results
// are call-by-call Attention's, bit for bit.
void Attentions(const AttentionShape& shape, std::span<const AttentionCall> calls, ThreadPool& pool);

// Whether Attention's tiles of several query rows over a cache of `kv_dtype` multiply on
// BF16 dot products at the active CPU level (else on F32).
bool PrefillAttentionOnBf16(const AttentionShape& shape, DType kv_dtype);
// Whether they run on int8 dot products (a Q8_0 cache on AVX-512 VNNI): the scores with
// the queries quantised to int8 as the keys are, the value products with the softmax
// weights as bytes.
bool PrefillAttentionOnInt8(const AttentionShape& shape, DType kv_dtype);
// The same for a single query row (decode). On BF16 dot products, queries and softmax
// weights are rounded to BF16 as the cache is.
bool DecodeAttentionOnBf16(const AttentionShape& shape, DType kv_dtype);
// Whether a single query row over a Q8_0 cache takes its scores on int8 dot products (the
// query quantised to int8 as the keys are) and its values on BF16 ones.
bool DecodeAttentionOnInt8(const AttentionShape& shape, DType kv_dtype);

}  // namespace ps
