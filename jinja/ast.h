// The parsed form of a template (jinja/template.h): statements and expressions.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace ps::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // [args...] (tuples too)
    kDict,     // {args[i].first-expr: ...}: keys in `keys`, values in args
    kAttr,     // subject.name
    kItem,     // subject[args[0]]
    kSlice,    // subject[args[0]:args[1]:args[2]] (null: omitted)
    kCall,     // subject(args)
    kFilter,   // subject | name(args)
    kTest,     // subject is [not] name(args)
    kUnary,    // name in {"-", "+", "not"} over subject
    kBinary,   // subject name args[0]
    kCond,     // args[0] if subject else args[1] (null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: `is not`
  ExprPtr subject;
  // Arguments; a keyword argument has its name (empty: positional).
  std::vector<std::pair<std::string, ExprPtr>> args;
  std::vector<ExprPtr> keys;  // kDict
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kBody,      // body
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches (cond, body); else_body
    kFor,       // targets in expr [if filter]: body; else_body
    kSet,       // targets (or namespace.attr: targets = {ns}, attr) = expr
    kSetBlock,  // {% set targets[0] %}body{% endset %}
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kBody;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (null: none)
};

}  // namespace ps::jinja
