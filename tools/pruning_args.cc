#include "tools/pruning_args.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ps::tools {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

std::string FieldNames(const google::protobuf::Descriptor& d) {
  std::vector<std::string> names;
  for (int i = 0; i < d.field_count(); ++i) names.emplace_back(d.field(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::Status SetOne(Message* m, const FieldDescriptor* f, absl::string_view text) {
  const auto* r = m->GetReflection();
  const bool rep = f->is_repeated();
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(f->name(), ": '", std::string(text), "' is not ", what));
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return bad("a non-negative integer");
      rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (!absl::SimpleAtoi(text, &v)) return bad("an integer");
      rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      float v = 0;
      if (!absl::SimpleAtof(text, &v)) return bad("a number");
      rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool v = false;
      if (!absl::SimpleAtob(text, &v)) return bad("true or false");
      rep ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(f->name(), ": this field cannot be set from the command line"));
  }
}

}  // namespace

absl::Status SetPruning(const std::string& strategy, const std::vector<std::string>& args,
                        ::pruneserve::v1::PruningConfig* out) {
  const google::protobuf::OneofDescriptor* oneof = out->GetDescriptor()->FindOneofByName("strategy");
  const FieldDescriptor* sf = out->GetDescriptor()->FindFieldByName(strategy);
  if (sf == nullptr || sf->containing_oneof() != oneof) {
    std::vector<std::string> names;
    for (int i = 0; i < oneof->field_count(); ++i) names.emplace_back(oneof->field(i)->name());
    return absl::InvalidArgumentError(
        absl::StrCat("--strategy: unknown strategy '", strategy, "' (known: ", absl::StrJoin(names, ", "), ")"));
  }
  Message* m = out->GetReflection()->MutableMessage(out, sf);
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("--strategy-arg '", a, "' is not key=value"));
    const std::string key = a.substr(0, eq);
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--strategy-arg: ", strategy, " has no parameter '", key, "' (known: ",
                                                     FieldNames(*m->GetDescriptor()), ")"));
    }
    const absl::string_view value = absl::string_view(a).substr(eq + 1);
    if (f->is_repeated()) {
      m->GetReflection()->ClearField(m, f);
      for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
        if (absl::Status s = SetOne(m, f, part); !s.ok()) return s;
      }
    } else if (absl::Status s = SetOne(m, f, value); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace ps::tools
