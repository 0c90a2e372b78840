// The key-major tiles of prefill attention for one unit of SegmentAttention
// (attention_segment.cc): up to 64 query rows of one GQA group over key tiles of a BF16 or a
// Q8_0 cache read in place, with the layouts and steps of avx512_bf16 and avx512_q8
// (kernels/cpu/attention_avx512.h, attention_avx512_q8.h); the scores and softmax in base 2
// (the exp's multiply by log2 e folded into the scale). Internal to kernels/cpu/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/attention_segment.h"
#include "kernels/types.h"

namespace ps::attention_internal {

class KeyMajorTiles {
 public:
  // Packs rows [q0, q0 + nq) (nq <= avx512_bf16::kMaxTileRows) of KV head kvh's query heads
  // and clears their state. Only where PrefillAttentionOnBf16 or PrefillAttentionOnInt8
  // holds for seg.kv's type. The state is the calling thread's: one unit at a time a thread.
  KeyMajorTiles(const AttentionShape& s, const AttentionArgs& a, const SegmentArgs& seg, int kvh, int64_t q0,
                int64_t nq);

  // Attends one key tile: `pieces` (rows contiguous in one block of seg.kv), nt rows in all,
  // for rows whose positions lie in [min_pos, max_pos]. last_tile: the segment's last query
  // row is among them; its scaled scores go to seg.last_logits.
  void Attend(std::span<const Chunk> pieces, int64_t nt, int32_t min_pos, int32_t max_pos, bool last_tile);

  // The unnormalised output into out (rows out_stride apart, heads hd apart) and each row's
  // maximum (natural units) and sum into m and l ([head][row]), as SegmentAttention's Attend
  // leaves them.
  void End(float* out, int64_t out_stride, float* m, float* l) const;

 private:
  // A unit's state on the key-major tiles (avx512_bf16's and avx512_q8's layouts): per
  // head of the group its query rows packed (BF16: qt; Q8_0: qt8 and their scales), its
  // output transposed, its rows' m and l (nqp rows each); the key tile's rows, positions and
  // packed values (a Q8_0 tile's: its keys' block terms, its values' quants by 4 keys and
  // their scales as gains), its scores, their maxima, the weights (a Q8_0 tile's as bytes,
  // with their scales) and the rescaling of the outputs.
  struct TileUnit {
    int64_t nqp = 0;
    std::vector<uint16_t> qt, packed_values, p;
    std::vector<uint8_t> qt8, p8;
    std::vector<int8_t> packed_values8;
    std::vector<float> ot, m, l, s, row_max, corr, qscale, key_scales, gains, top, wscale;
    std::vector<int32_t> q_pos, key_pos, key_offsets;
    std::vector<const uint16_t*> keys, values;   // BF16 rows
    std::vector<const uint8_t*> keys8, values8;  // Q8_0 rows
  };

  const AttentionShape& s_;
  const AttentionArgs& a_;
  const SegmentArgs& seg_;
  const KvRows& kv_;
  const int group_, hd_, kvh_;
  const int64_t nq_;
  const bool q8_;  // a Q8_0 cache: the scores on int8 dot products
  static thread_local TileUnit unit_;
};

}  // namespace ps::attention_internal
