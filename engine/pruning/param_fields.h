// A strategy's parameter struct bound, field by field and by name, to its message
// of PruningConfig, read and written by reflection (as proto/field_args.h reads
// `key=value` text): the one conversion between parameters and messages, both ways.
// Members are int (from a uint32 or int32 field; a value above INT32_MAX is an
// error), float or double (a float field), bool, std::vector<int> or
// std::vector<float> (repeated fields).
#pragma once

#include <cstddef>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace google::protobuf {
class Message;
}

namespace ps {

// A member of P and the name of the message field it binds to.
template <typename P>
struct StructField {
  std::string_view name;
  std::variant<int P::*, float P::*, double P::*, bool P::*, std::vector<int> P::*, std::vector<float> P::*> member;
};

using FieldRef = std::variant<int*, float*, double*, bool*, std::vector<int>*, std::vector<float>*>;
using ConstFieldRef = std::variant<const int*, const float*, const double*, const bool*, const std::vector<int>*,
                                   const std::vector<float>*>;

// Field `name` of `msg` into *out when it is set; a repeated field with values
// replaces the list, one without leaves it. Errors name the field as
// `<owner>.<name>` (`<owner>.<name>[i]` for a list's value). The field must exist
// and fit the member's type (checked: a binding error is a bug).
absl::Status ReadField(const google::protobuf::Message& msg, std::string_view name, std::string_view owner,
                       FieldRef out);
// The value into field `name` of `msg` (a list replaces the repeated field's values).
void WriteField(ConstFieldRef in, std::string_view name, google::protobuf::Message* msg);

// Every bound field that `msg` sets, into *p; the first error.
template <typename P, size_t N>
absl::Status ReadFields(const StructField<P> (&fields)[N], const google::protobuf::Message& msg, std::string_view owner,
                        P* p) {
  for (const StructField<P>& f : fields) {
    absl::Status s = std::visit([&](auto m) { return ReadField(msg, f.name, owner, FieldRef(&(p->*m))); }, f.member);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Every bound field of p into `msg`.
template <typename P, size_t N>
void WriteFields(const StructField<P> (&fields)[N], const P& p, google::protobuf::Message* msg) {
  for (const StructField<P>& f : fields) {
    std::visit([&](auto m) { WriteField(ConstFieldRef(&(p.*m)), f.name, msg); }, f.member);
  }
}

}  // namespace ps
