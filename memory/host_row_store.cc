#include "memory/host_row_store.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/status.h"

namespace ps {

template <typename Fn>
void HostRowStore::ForSlot(Seq& q, int64_t s, Fn&& fn) {
  const size_t bb = host_.block_bytes();
  size_t off = static_cast<size_t>(s) * row_bytes_, done = 0;
  while (done < row_bytes_) {  // the slot's pieces, one per block it touches
    const size_t in_block = off % bb, n = std::min(row_bytes_ - done, bb - in_block);
    fn(host_.data(q.blocks[off / bb]) + in_block, done, n);
    done += n;
    off += n;
  }
}

bool HostRowStore::Put(int64_t seq, int32_t key, const void* row) {
  PS_CHECK(row_bytes_ > 0) << "a host row store with rows of 0 bytes";
  Seq& q = seqs_[seq];
  PS_CHECK(!q.slot.contains(key)) << "host row store: key " << key << " stored twice for sequence " << seq;
  int64_t s = 0;
  if (!q.free_slots.empty()) {
    s = q.free_slots.back();
    q.free_slots.pop_back();
  } else {
    const size_t end = static_cast<size_t>(q.next_slot + 1) * row_bytes_;
    const auto more = static_cast<int32_t>((end + host_.block_bytes() - 1) / host_.block_bytes() - q.blocks.size());
    if (more > 0) {
      std::optional<std::vector<int32_t>> ids = host_.Allocate(more);
      if (!ids) {
        if (q.blocks.empty()) seqs_.erase(seq);
        return false;
      }
      q.blocks.insert(q.blocks.end(), ids->begin(), ids->end());
      total_blocks_ += more;
    }
    s = q.next_slot++;
  }
  q.slot[key] = s;
  const auto* src = static_cast<const uint8_t*>(row);
  ForSlot(q, s, [&](uint8_t* piece, size_t at, size_t n) { std::memcpy(piece, src + at, n); });
  return true;
}

bool HostRowStore::Take(int64_t seq, int32_t key, void* row) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return false;
  Seq& q = it->second;
  auto s = q.slot.find(key);
  if (s == q.slot.end()) return false;
  auto* dst = static_cast<uint8_t*>(row);
  ForSlot(q, s->second, [&](const uint8_t* piece, size_t at, size_t n) { std::memcpy(dst + at, piece, n); });
  q.free_slots.push_back(s->second);
  q.slot.erase(s);
  return true;
}

bool HostRowStore::Contains(int64_t seq, int32_t key) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.slot.contains(key);
}

int64_t HostRowStore::Rows(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.slot.size());
}

int64_t HostRowStore::Blocks(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
}

void HostRowStore::Release(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t id : it->second.blocks) host_.Release(id);
  total_blocks_ -= static_cast<int64_t>(it->second.blocks.size());
  seqs_.erase(it);
}

}  // namespace ps
