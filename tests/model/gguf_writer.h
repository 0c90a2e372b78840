// Minimal GGUF writer for tests: builds files byte by byte so the reader can be
// checked on every metadata type, both versions and deliberately broken inputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ps::testing {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void KvU8(const std::string& k, uint8_t v) {
    Key(k, 0);
    Pod(meta_, v);
  }
  void KvI8(const std::string& k, int8_t v) {
    Key(k, 1);
    Pod(meta_, v);
  }
  void KvU16(const std::string& k, uint16_t v) {
    Key(k, 2);
    Pod(meta_, v);
  }
  void KvI16(const std::string& k, int16_t v) {
    Key(k, 3);
    Pod(meta_, v);
  }
  void KvU32(const std::string& k, uint32_t v) {
    Key(k, 4);
    Pod(meta_, v);
  }
  void KvI32(const std::string& k, int32_t v) {
    Key(k, 5);
    Pod(meta_, v);
  }
  void KvF32(const std::string& k, float v) {
    Key(k, 6);
    Pod(meta_, v);
  }
  void KvBool(const std::string& k, bool v) {
    Key(k, 7);
    Pod(meta_, static_cast<uint8_t>(v));
  }
  void KvStr(const std::string& k, const std::string& v) {
    Key(k, 8);
    Str(meta_, v);
  }
  void KvU64(const std::string& k, uint64_t v) {
    Key(k, 10);
    Pod(meta_, v);
  }
  void KvI64(const std::string& k, int64_t v) {
    Key(k, 11);
    Pod(meta_, v);
  }
  void KvF64(const std::string& k, double v) {
    Key(k, 12);
    Pod(meta_, v);
  }
  void KvStrArray(const std::string& k, const std::vector<std::string>& v) {
    Key(k, 9);
    Pod(meta_, uint32_t{8});
    Pod(meta_, static_cast<uint64_t>(v.size()));
    for (const auto& s : v) Str(meta_, s);
  }
  void KvF32Array(const std::string& k, const std::vector<float>& v) {
    Key(k, 9);
    Pod(meta_, uint32_t{6});
    Pod(meta_, static_cast<uint64_t>(v.size()));
    for (float x : v) Pod(meta_, x);
  }
  void KvI32Array(const std::string& k, const std::vector<int32_t>& v) {
    Key(k, 9);
    Pod(meta_, uint32_t{5});
    Pod(meta_, static_cast<uint64_t>(v.size()));
    for (int32_t x : v) Pod(meta_, x);
  }
  // dims: ne[0] first. `bytes` is the raw tensor data.
  void Tensor(const std::string& name, uint32_t type, const std::vector<uint64_t>& dims,
              const std::vector<uint8_t>& bytes) {
    Str(infos_, name);
    Pod(infos_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) Pod(infos_, d);
    Pod(infos_, type);
    while (data_.size() % 32 != 0) data_.push_back(0);
    Pod(infos_, static_cast<uint64_t>(data_.size()));
    data_.insert(data_.end(), bytes.begin(), bytes.end());
    ++n_tensors_;
  }

  std::vector<uint8_t> Bytes() const {
    std::vector<uint8_t> out;
    Pod(out, uint32_t{0x46554747});
    Pod(out, version_);
    Pod(out, n_tensors_);
    Pod(out, n_kv_);
    out.insert(out.end(), meta_.begin(), meta_.end());
    out.insert(out.end(), infos_.begin(), infos_.end());
    while (out.size() % 32 != 0) out.push_back(0);
    out.insert(out.end(), data_.begin(), data_.end());
    return out;
  }

 private:
  template <typename T>
  static void Pod(std::vector<uint8_t>& b, T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  static void Str(std::vector<uint8_t>& b, const std::string& s) {
    Pod(b, static_cast<uint64_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
  void Key(const std::string& k, uint32_t type) {
    Str(meta_, k);
    Pod(meta_, type);
    ++n_kv_;
  }
  uint32_t version_;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  std::vector<uint8_t> meta_, infos_, data_;
};

}  // namespace ps::testing
