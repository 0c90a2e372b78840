#include "model/gguf.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr size_t kMaxStringBytes = 1u << 30;
constexpr uint64_t kMaxArrayDepth = 4;

// Bounds-checked little-endian cursor.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, const char* what) {
    if (remaining() < sizeof(T)) return Truncated(what);
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status ReadString(std::string* out, const char* what) {
    uint64_t len = 0;
    PS_RETURN_IF_ERROR(Read(&len, what));
    if (len > kMaxStringBytes || len > remaining()) return Truncated(what);
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }
  absl::Status Truncated(const char* what) const {
    return absl::DataLossError(absl::StrCat("GGUF truncated: reading ", what, " at byte ", pos_, " of ", size_));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kU16:
    case GgufValueType::kI16:
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kBool: return true;
    default: return false;
  }
}

absl::Status ReadScalar(Cursor& c, GgufValueType t, int64_t* i, double* f, const char* what) {
  switch (t) {
#define PS_GGUF_INT(TAG, CT)              \
  case GgufValueType::TAG: {              \
    CT v{};                               \
    PS_RETURN_IF_ERROR(c.Read(&v, what)); \
    *i = static_cast<int64_t>(v);         \
    return absl::OkStatus();              \
  }
    PS_GGUF_INT(kU8, uint8_t)
    PS_GGUF_INT(kI8, int8_t)
    PS_GGUF_INT(kU16, uint16_t)
    PS_GGUF_INT(kI16, int16_t)
    PS_GGUF_INT(kU32, uint32_t)
    PS_GGUF_INT(kI32, int32_t)
    PS_GGUF_INT(kI64, int64_t)
    PS_GGUF_INT(kBool, uint8_t)
#undef PS_GGUF_INT
    case GgufValueType::kU64: {
      uint64_t v = 0;
      PS_RETURN_IF_ERROR(c.Read(&v, what));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF: u64 value too large in ", what));
      }
      *i = static_cast<int64_t>(v);
      return absl::OkStatus();
    }
    case GgufValueType::kF32: {
      float v = 0;
      PS_RETURN_IF_ERROR(c.Read(&v, what));
      *f = v;
      return absl::OkStatus();
    }
    case GgufValueType::kF64: return c.Read(f, what);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF: unknown metadata value type ", static_cast<uint32_t>(t), " in ", what));
  }
}

absl::Status ReadValue(Cursor& c, GgufValueType t, GgufValue* out, const char* what, int depth) {
  out->type = t;
  if (t == GgufValueType::kString) return c.ReadString(&out->s, what);
  if (t != GgufValueType::kArray) return ReadScalar(c, t, &out->i, &out->f, what);
  if (depth >= static_cast<int>(kMaxArrayDepth)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF: arrays nested too deep in ", what));
  }
  uint32_t et = 0;
  uint64_t n = 0;
  PS_RETURN_IF_ERROR(c.Read(&et, what));
  PS_RETURN_IF_ERROR(c.Read(&n, what));
  out->elem_type = static_cast<GgufValueType>(et);
  // Every element takes at least one byte: a count above the remaining bytes is corrupt.
  if (n > c.remaining()) return c.Truncated(what);
  if (out->elem_type == GgufValueType::kString) {
    out->strings.resize(n);
    for (auto& s : out->strings) PS_RETURN_IF_ERROR(c.ReadString(&s, what));
  } else if (out->elem_type == GgufValueType::kArray) {
    out->array.resize(n);
    for (auto& v : out->array) PS_RETURN_IF_ERROR(ReadValue(c, GgufValueType::kArray, &v, what, depth + 1));
  } else if (IsIntegerType(out->elem_type)) {
    out->ints.resize(n);
    double unused;
    for (auto& v : out->ints) PS_RETURN_IF_ERROR(ReadScalar(c, out->elem_type, &v, &unused, what));
  } else if (out->elem_type == GgufValueType::kF32 || out->elem_type == GgufValueType::kF64) {
    out->floats.resize(n);
    int64_t unused;
    for (auto& v : out->floats) PS_RETURN_IF_ERROR(ReadScalar(c, out->elem_type, &unused, &v, what));
  } else {
    return absl::InvalidArgumentError(absl::StrCat("GGUF: unknown array element type ", et, " in ", what));
  }
  return absl::OkStatus();
}

}  // namespace

bool GgufValue::IsInteger() const { return IsIntegerType(type); }

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  PS_ASSIGN_OR_RETURN(auto file, Parse(mapped->data(), mapped->size(), path));
  file->file_ = std::move(mapped);
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size, std::string source_name) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->source_ = std::move(source_name);
  const std::string& src = file->source_;
  Cursor c(data, size);
  uint32_t magic = 0;
  PS_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": not a GGUF file (bad magic)"));
  }
  PS_RETURN_IF_ERROR(c.Read(&file->version_, "version"));
  if (file->version_ != 2 && file->version_ != 3) {
    const bool swapped = (file->version_ & 0xffff) == 0 && file->version_ != 0;
    return absl::UnimplementedError(absl::StrCat(src, ": unsupported GGUF version ", file->version_,
                                                 swapped ? " (big-endian file?)" : "", "; supported: 2, 3"));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  PS_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  PS_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  if (n_tensors > c.remaining() || n_kv > c.remaining()) return c.Truncated("header counts");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    PS_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t type = 0;
    PS_RETURN_IF_ERROR(c.Read(&type, "metadata type"));
    GgufValue value;
    PS_RETURN_IF_ERROR(ReadValue(c, static_cast<GgufValueType>(type), &value, key.c_str(), 0));
    if (!file->metadata_.emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": duplicate metadata key ", key));
    }
  }

  uint64_t alignment = 32;
  if (const GgufValue* a = file->Find("general.alignment")) {
    if (!a->IsInteger() || a->i <= 0 || (a->i & (a->i - 1)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": general.alignment must be a power of two"));
    }
    alignment = static_cast<uint64_t>(a->i);
  }

  std::vector<uint64_t> offsets(n_tensors);  // relative to the data section
  file->tensors_.resize(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor& tensor = file->tensors_[t];
    PS_RETURN_IF_ERROR(c.ReadString(&tensor.name, "tensor name"));
    uint32_t n_dims = 0;
    PS_RETURN_IF_ERROR(c.Read(&n_dims, "tensor dims"));
    if (n_dims == 0 || n_dims > 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": tensor ", tensor.name, " has ", n_dims, " dimensions (1..4 allowed)"));
    }
    tensor.dims.resize(n_dims);
    for (auto& d : tensor.dims) {
      uint64_t v = 0;
      PS_RETURN_IF_ERROR(c.Read(&v, "tensor dim"));
      if (v == 0 || v > (uint64_t{1} << 40)) {
        return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", tensor.name, " has bad dimension ", v));
      }
      d = static_cast<int64_t>(v);
    }
    uint32_t type = 0;
    PS_RETURN_IF_ERROR(c.Read(&type, "tensor type"));
    const DTypeTraits* traits = FindDType(type);
    if (traits == nullptr) {
      return absl::UnimplementedError(absl::StrCat(src, ": tensor ", tensor.name, " has unsupported type ", type,
                                                   " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)"));
    }
    tensor.type = static_cast<DType>(type);
    PS_RETURN_IF_ERROR(c.Read(&offsets[t], "tensor offset"));
    if (tensor.dims[0] % traits->block_elems != 0) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", tensor.name, " row length ", tensor.dims[0],
                                                     " is not a multiple of the ", std::string(traits->name),
                                                     " block size"));
    }
    __int128 elems = 1;
    for (int64_t d : tensor.dims) elems *= d;
    if (elems > (__int128{1} << 42)) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": tensor ", tensor.name, " is too large"));
    }
    tensor.nbytes = static_cast<size_t>(elems / traits->block_elems) * traits->block_bytes;
    if (!file->tensor_index_.emplace(tensor.name, t).second) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": duplicate tensor ", tensor.name));
    }
  }
  const uint64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor& tensor = file->tensors_[t];
    const uint64_t off = offsets[t];
    if (off % alignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": tensor ", tensor.name, " offset ", off, " is not aligned to ", alignment));
    }
    if (data_start > size || off > size - data_start || tensor.nbytes > size - data_start - off) {
      return absl::DataLossError(absl::StrCat(src, ": tensor ", tensor.name, " (", tensor.nbytes, " bytes at offset ",
                                              off, ") lies beyond the end of the file (", size, " bytes)"));
    }
    tensor.data = data + data_start + off;
  }
  return file;
}

const GgufTensor* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
absl::Status WrongType(const std::string& src, const std::string& key, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat(src, ": metadata ", key, " is not ", want));
}
}  // namespace

absl::StatusOr<std::optional<int64_t>> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->IsInteger()) return WrongType(source_, key, "an integer");
  return std::optional<int64_t>(v->i);
}

absl::StatusOr<std::optional<double>> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  if (v->IsFloat()) return std::optional<double>(v->f);
  if (v->IsInteger()) return std::optional<double>(static_cast<double>(v->i));
  return WrongType(source_, key, "a number");
}

absl::StatusOr<std::optional<bool>> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->IsInteger()) return WrongType(source_, key, "a bool");
  return std::optional<bool>(v->i != 0);
}

absl::StatusOr<std::optional<std::string>> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufValueType::kString) return WrongType(source_, key, "a string");
  return std::optional<std::string>(v->s);
}

}  // namespace ps
