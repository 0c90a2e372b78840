#include "engine/pruning/param_fields.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace ps {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

const FieldDescriptor& Field(const Message& msg, std::string_view name) {
  const FieldDescriptor* f = msg.GetDescriptor()->FindFieldByName(std::string(name));
  PS_CHECK(f != nullptr) << msg.GetDescriptor()->full_name() << " has no field " << name;
  return *f;
}

// Value i of f (a singular field: i is ignored) as an int; too large for one is an error naming `what`.
absl::Status IntValue(const Message& msg, const FieldDescriptor& f, int i, const std::string& what, int* out) {
  const auto* r = msg.GetReflection();
  const bool rep = f.is_repeated();
  if (f.cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
    *out = rep ? r->GetRepeatedInt32(msg, &f, i) : r->GetInt32(msg, &f);
    return absl::OkStatus();
  }
  PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_UINT32) << f.full_name() << " is bound to an int";
  const uint32_t v = rep ? r->GetRepeatedUInt32(msg, &f, i) : r->GetUInt32(msg, &f);
  if (v > static_cast<uint32_t>(INT32_MAX))
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", v, " is too large"));
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

float FloatValue(const Message& msg, const FieldDescriptor& f, int i) {
  PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) << f.full_name() << " is bound to a real";
  return f.is_repeated() ? msg.GetReflection()->GetRepeatedFloat(msg, &f, i) : msg.GetReflection()->GetFloat(msg, &f);
}

void AddInt(Message* msg, const FieldDescriptor& f, int v) {
  const auto* r = msg->GetReflection();
  if (f.cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
    f.is_repeated() ? r->AddInt32(msg, &f, v) : r->SetInt32(msg, &f, v);
    return;
  }
  PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_UINT32) << f.full_name() << " is bound to an int";
  const auto u = static_cast<uint32_t>(v);
  f.is_repeated() ? r->AddUInt32(msg, &f, u) : r->SetUInt32(msg, &f, u);
}

void AddFloat(Message* msg, const FieldDescriptor& f, float v) {
  PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) << f.full_name() << " is bound to a real";
  f.is_repeated() ? msg->GetReflection()->AddFloat(msg, &f, v) : msg->GetReflection()->SetFloat(msg, &f, v);
}

bool IsList(const ConstFieldRef& ref) {
  return std::holds_alternative<const std::vector<int>*>(ref) || std::holds_alternative<const std::vector<float>*>(ref);
}

// A list binds to a repeated field, a value to a singular one.
void CheckShape(const FieldDescriptor& f, bool list) {
  PS_CHECK(list == f.is_repeated()) << f.full_name() << " is " << (f.is_repeated() ? "repeated" : "singular")
                                    << ": bound to a " << (list ? "list" : "value");
}

}  // namespace

absl::Status ReadField(const Message& msg, std::string_view name, std::string_view owner, FieldRef out) {
  const FieldDescriptor& f = Field(msg, name);
  const auto* r = msg.GetReflection();
  const std::string what = absl::StrCat(std::string(owner), ".", std::string(name));
  const bool list = std::holds_alternative<std::vector<int>*>(out) || std::holds_alternative<std::vector<float>*>(out);
  CheckShape(f, list);
  if (list ? r->FieldSize(msg, &f) == 0 : !r->HasField(msg, &f)) return absl::OkStatus();
  if (auto* v = std::get_if<int*>(&out)) return IntValue(msg, f, 0, what, *v);
  if (auto* v = std::get_if<float*>(&out)) {
    **v = FloatValue(msg, f, 0);
  } else if (auto* v = std::get_if<double*>(&out)) {
    **v = FloatValue(msg, f, 0);
  } else if (auto* v = std::get_if<bool*>(&out)) {
    PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_BOOL) << f.full_name() << " is bound to a bool";
    **v = r->GetBool(msg, &f);
  } else if (auto* v = std::get_if<std::vector<int>*>(&out)) {
    std::vector<int> values(r->FieldSize(msg, &f));
    for (int i = 0; i < static_cast<int>(values.size()); ++i) {
      PS_RETURN_IF_ERROR(IntValue(msg, f, i, absl::StrCat(what, "[", i, "]"), &values[i]));
    }
    **v = std::move(values);
  } else {
    std::vector<float>& values = *std::get<std::vector<float>*>(out);
    values.resize(r->FieldSize(msg, &f));
    for (int i = 0; i < static_cast<int>(values.size()); ++i) values[i] = FloatValue(msg, f, i);
  }
  return absl::OkStatus();
}

void WriteField(ConstFieldRef in, std::string_view name, Message* msg) {
  const FieldDescriptor& f = Field(*msg, name);
  CheckShape(f, IsList(in));
  if (f.is_repeated()) msg->GetReflection()->ClearField(msg, &f);
  if (auto* v = std::get_if<const int*>(&in)) {
    AddInt(msg, f, **v);
  } else if (auto* v = std::get_if<const float*>(&in)) {
    AddFloat(msg, f, **v);
  } else if (auto* v = std::get_if<const double*>(&in)) {
    AddFloat(msg, f, static_cast<float>(**v));
  } else if (auto* v = std::get_if<const bool*>(&in)) {
    PS_CHECK(f.cpp_type() == FieldDescriptor::CPPTYPE_BOOL) << f.full_name() << " is bound to a bool";
    msg->GetReflection()->SetBool(msg, &f, **v);
  } else if (auto* v = std::get_if<const std::vector<int>*>(&in)) {
    for (int x : **v) AddInt(msg, f, x);
  } else {
    for (float x : *std::get<const std::vector<float>*>(in)) AddFloat(msg, f, x);
  }
}

}  // namespace ps
