#include "proto/field_args.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "pruneserve/v1/generation.pb.h"

namespace ps {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

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
    case FieldDescriptor::CPPTYPE_STRING:
      rep ? r->AddString(m, f, std::string(text)) : r->SetString(m, f, std::string(text));
      return absl::OkStatus();
    default: return absl::InvalidArgumentError(absl::StrCat(f->name(), ": this field cannot be set from text"));
  }
}

std::string ValueText(const Message& m, const FieldDescriptor* f, int i) {
  const auto* r = m.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_UINT32: return absl::StrCat(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT32: return absl::StrCat(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT: return absl::StrCat(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f)) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_STRING: return rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f);
    default: return "?";
  }
}

// The names of a message's fields, comma-separated, for error messages.
std::string FieldNames(const google::protobuf::Descriptor& d) {
  std::vector<std::string> names;
  for (int i = 0; i < d.field_count(); ++i) names.emplace_back(d.field(i)->name());
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::Status SetFieldsFromArgs(const std::vector<std::string>& args, std::string_view owner, Message* m) {
  const google::protobuf::Descriptor& d = *m->GetDescriptor();
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) return absl::InvalidArgumentError(absl::StrCat("'", a, "' is not key=value"));
    const std::string key = a.substr(0, eq);
    const FieldDescriptor* f = d.FindFieldByName(key);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(owner), " has no parameter '", key, "'",
                       d.field_count() == 0 ? "" : absl::StrCat(" (known: ", FieldNames(d), ")")));
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

std::vector<std::pair<std::string, std::string>> FieldsAsArgs(const Message& m) {
  std::vector<std::pair<std::string, std::string>> out;
  const google::protobuf::Descriptor& d = *m.GetDescriptor();
  const auto* r = m.GetReflection();
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor* f = d.field(i);
    if (f->is_repeated()) {
      std::vector<std::string> values;
      for (int k = 0; k < r->FieldSize(m, f); ++k) values.push_back(ValueText(m, f, k));
      if (!values.empty()) out.emplace_back(f->name(), absl::StrJoin(values, ","));
    } else if (r->HasField(m, f)) {
      out.emplace_back(f->name(), ValueText(m, f, 0));
    }
  }
  return out;
}

namespace {
const google::protobuf::OneofDescriptor& StrategyOneof() {
  return *pruneserve::v1::PruningConfig::descriptor()->FindOneofByName("strategy");
}
}  // namespace

std::vector<std::string> StrategyMessageNames() {
  std::vector<std::string> names;
  const google::protobuf::OneofDescriptor& oneof = StrategyOneof();
  for (int i = 0; i < oneof.field_count(); ++i) names.emplace_back(oneof.field(i)->name());
  return names;
}

absl::StatusOr<Message*> SelectStrategy(std::string_view name, pruneserve::v1::PruningConfig* config) {
  const FieldDescriptor* f = config->GetDescriptor()->FindFieldByName(std::string(name));
  if (f == nullptr || f->containing_oneof() != &StrategyOneof()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown strategy '", std::string(name),
                                                   "' (known: ", absl::StrJoin(StrategyMessageNames(), ", "), ")"));
  }
  return config->GetReflection()->MutableMessage(config, f);
}

absl::Status SetStrategyArgs(std::string_view name, const std::vector<std::string>& args,
                             pruneserve::v1::PruningConfig* config) {
  absl::StatusOr<Message*> msg = SelectStrategy(name, config);
  if (!msg.ok()) return msg.status();
  return SetFieldsFromArgs(args, absl::StrCat("strategy ", std::string(name)), *msg);
}

absl::Status SetStrategyJson(std::string_view name, std::string_view params, pruneserve::v1::PruningConfig* config) {
  absl::StatusOr<Message*> msg = SelectStrategy(name, config);
  if (!msg.ok()) return msg.status();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(params.data(), params.size()), *msg, options);
  if (parsed.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("strategy ", std::string(name), ": ",
                                                 std::string(parsed.message().data(), parsed.message().size()),
                                                 " (parameters: ", FieldNames(*(*msg)->GetDescriptor()), ")"));
}

const Message* SelectedStrategy(const pruneserve::v1::PruningConfig& config, std::string* name) {
  const FieldDescriptor* f = config.GetReflection()->GetOneofFieldDescriptor(config, &StrategyOneof());
  if (f == nullptr) {
    name->clear();
    return nullptr;
  }
  *name = f->name();
  return &config.GetReflection()->GetMessage(config, f);
}

}  // namespace ps
