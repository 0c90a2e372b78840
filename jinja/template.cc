// Rendering: statements executed over a stack of scopes, expressions evaluated with
// Python's semantics, and the globals chat templates use (the filters and tests:
// jinja/filters.h; the methods of values: jinja/methods.h).
#include "jinja/template.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "jinja/filters.h"
#include "jinja/methods.h"
#include "jinja/parse.h"

namespace ps::jinja {
namespace {

// What one rendering may cost before it fails (besides Options::max_steps): output
// bytes, macro calls nested.
constexpr size_t kMaxOutput = size_t{64} << 20;
constexpr int kMaxCallDepth = 64;

class Renderer {
 public:
  ~Renderer() {
    for (Value& ns : namespaces_) ns.dict().items.clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  Renderer(const Dict& context, int64_t max_steps) : max_steps_(max_steps) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context.items) scopes_.back()[k] = v;
    AddGlobals();
  }

  absl::Status Exec(const Body& body) {
    for (const NodePtr& n : body) {
      PS_RETURN_IF_ERROR(Exec(*n));
      if (flow_ != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  std::string& out() { return out_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Exec(const Node& n) {
    if (++steps_ > max_steps_) return Error(n.line, "the template takes too long to render");
    if (out_.size() > kMaxOutput) return Error(n.line, "the template's output is too long");
    switch (n.kind) {
      case Node::Kind::kBody: return Exec(n.body);
      case Node::Kind::kText: out_ += n.text; return absl::OkStatus();
      case Node::Kind::kOutput: {
        PS_ASSIGN_OR_RETURN(const Value v, Eval(*n.expr));
        out_ += v.Str();
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          PS_ASSIGN_OR_RETURN(const Value c, Eval(*cond));
          if (c.Truthy()) return Exec(body);
        }
        return Exec(n.else_body);
      case Node::Kind::kFor: return For(n);
      case Node::Kind::kSet: {
        PS_ASSIGN_OR_RETURN(const Value v, Eval(*n.expr));
        if (!n.attr.empty()) {
          const Value ns = Lookup(n.targets[0]);
          if (!ns.is_dict() || !ns.dict().is_namespace) {
            return Error(n.line, absl::StrCat("cannot assign attribute on non-namespace object '", n.targets[0], "'"));
          }
          ns.dict().Set(n.attr, v);
          return absl::OkStatus();
        }
        return Assign(n.targets, v, n.line);
      }
      case Node::Kind::kSetBlock: {
        std::string saved;
        std::swap(saved, out_);
        const absl::Status st = Exec(n.body);
        std::swap(saved, out_);
        PS_RETURN_IF_ERROR(st);
        scopes_.back()[n.targets[0]] = Value(saved);
        return absl::OkStatus();
      }
      case Node::Kind::kMacro: {
        const Node* macro = &n;
        scopes_.back()[n.attr] = Value(Function([this, macro](const Args& args) { return CallMacro(*macro, args); }));
        return absl::OkStatus();
      }
      case Node::Kind::kBreak: flow_ = Flow::kBreak; return absl::OkStatus();
      case Node::Kind::kContinue: flow_ = Flow::kContinue; return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return absl::OkStatus();
    }
    PS_ASSIGN_OR_RETURN(const List items, Iterate(v, line));
    if (items.size() != targets.size()) {
      return Error(line, absl::StrCat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = items[i];
    return absl::OkStatus();
  }

  absl::Status For(const Node& n) {
    PS_ASSIGN_OR_RETURN(const Value seq, Eval(*n.expr));
    PS_ASSIGN_OR_RETURN(List items, Iterate(seq, n.line));
    scopes_.emplace_back();
    if (n.filter != nullptr) {  // {% for x in xs if cond %}: the loop sees the kept items only
      List kept;
      for (const Value& item : items) {
        PS_RETURN_IF_ERROR(Assign(n.targets, item, n.line));
        PS_ASSIGN_OR_RETURN(const Value keep, Eval(*n.filter));
        if (keep.Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    absl::Status st;
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len && st.ok(); ++i) {
      if (++steps_ > max_steps_) {
        st = Error(n.line, "the template takes too long to render");
        break;
      }
      Dict loop;
      loop.items = {{"index", Value(i + 1)},      {"index0", Value(i)},
                    {"revindex", Value(len - i)}, {"revindex0", Value(len - i - 1)},
                    {"first", Value(i == 0)},     {"last", Value(i == len - 1)},
                    {"length", Value(len)},       {"depth", Value(1)},
                    {"depth0", Value(0)}};
      if (i > 0) loop.items.emplace_back("previtem", items[i - 1]);
      if (i + 1 < len) loop.items.emplace_back("nextitem", items[i + 1]);
      loop.items.emplace_back("cycle", Value(Function([i](const Args& a) -> absl::StatusOr<Value> {
                                if (a.positional.empty())
                                  return absl::InvalidArgumentError("no items for cycling given");
                                return a.positional[static_cast<size_t>(i) % a.positional.size()];
                              })));
      scopes_.back()["loop"] = Value(std::move(loop));
      st = Assign(n.targets, items[i], n.line);
      if (st.ok()) st = Exec(n.body);
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    scopes_.pop_back();
    PS_RETURN_IF_ERROR(st);
    if (items.empty()) return Exec(n.else_body);
    return absl::OkStatus();
  }

  absl::StatusOr<Value> CallMacro(const Node& m, const Args& args) {
    if (call_depth_ >= kMaxCallDepth) return Error(m.line, "macro calls nested too deeply");
    std::unordered_map<std::string, Value> scope;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      if (const Value* v = args.Get(name, i)) {
        scope[name] = *v;
      } else if (def != nullptr) {
        PS_ASSIGN_OR_RETURN(scope[name], Eval(*def));
      } else {
        scope[name] = Value::MakeUndefined(name);
      }
    }
    std::string saved;
    std::swap(saved, out_);
    scopes_.push_back(std::move(scope));
    ++call_depth_;
    const absl::Status st = Exec(m.body);
    --call_depth_;
    scopes_.pop_back();
    std::swap(saved, out_);
    PS_RETURN_IF_ERROR(st);
    return Value(saved);
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (auto f = it->find(name); f != it->end()) return f->second;
    }
    return Value::MakeUndefined(name);
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    if (++steps_ > max_steps_) return Error(e.line, "the template takes too long to render");
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: {
        List l;
        for (const auto& [_, a] : e.args) {
          PS_ASSIGN_OR_RETURN(Value v, Eval(*a));
          l.push_back(std::move(v));
        }
        return Value(std::move(l));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i < e.keys.size(); ++i) {
          PS_ASSIGN_OR_RETURN(const Value k, Eval(*e.keys[i]));
          if (!k.is_string()) return Error(e.line, "dict keys must be strings");
          PS_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i].second));
          d.Set(k.as_string(), std::move(v));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kAttr: {
        PS_ASSIGN_OR_RETURN(const Value s, Eval(*e.subject));
        return Attr(s, e.name, e.line);
      }
      case Expr::Kind::kItem: {
        PS_ASSIGN_OR_RETURN(const Value s, Eval(*e.subject));
        PS_ASSIGN_OR_RETURN(const Value k, Eval(*e.args[0].second));
        return Item(s, k, e.line);
      }
      case Expr::Kind::kSlice: return Slice(e);
      case Expr::Kind::kCall: {
        PS_ASSIGN_OR_RETURN(const Value f, Eval(*e.subject));
        PS_ASSIGN_OR_RETURN(const Args args, EvalArgs(e));
        if (!f.is_callable()) {
          return Error(e.line, f.is_undefined() ? absl::StrCat("'", f.undefined_name(), "' is undefined")
                                                : absl::StrCat("'", f.TypeName(), "' object is not callable"));
        }
        absl::StatusOr<Value> r = f.function()(args);
        if (!r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument &&
            !absl::StartsWith(r.status().message(), "template line")) {
          return Error(e.line, std::string(r.status().message()));
        }
        return r;
      }
      case Expr::Kind::kFilter: {
        PS_ASSIGN_OR_RETURN(const Value s, Eval(*e.subject));
        PS_ASSIGN_OR_RETURN(const Args args, EvalArgs(e));
        absl::StatusOr<Value> r = Filter(e.name, s, args);
        if (!r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument) {
          return Error(e.line, absl::StrCat("filter '", e.name, "': ", r.status().message()));
        }
        return r;
      }
      case Expr::Kind::kTest: {
        PS_ASSIGN_OR_RETURN(const Value s, Eval(*e.subject));
        PS_ASSIGN_OR_RETURN(const Args args, EvalArgs(e));
        absl::StatusOr<bool> r = Test(e.name, s, args, e.line);
        if (!r.ok()) return r.status();
        return Value(*r != e.negated);
      }
      case Expr::Kind::kUnary: {
        PS_ASSIGN_OR_RETURN(const Value s, Eval(*e.subject));
        if (e.name == "not") return Value(!s.Truthy());
        if (!s.is_number() && !s.is_bool()) return Error(e.line, absl::StrCat("bad operand for unary ", e.name));
        if (e.name == "+") return s;
        if (s.is_int() && s.as_int() == INT64_MIN) return Error(e.line, "integer overflow");
        return s.is_float() ? Value(-s.as_double()) : Value(-s.as_int());
      }
      case Expr::Kind::kBinary: return Binary(e);
      case Expr::Kind::kCond: {
        PS_ASSIGN_OR_RETURN(const Value c, Eval(*e.subject));
        if (c.Truthy()) return Eval(*e.args[0].second);
        if (e.args[1].second == nullptr) return Value::MakeUndefined("else");
        return Eval(*e.args[1].second);
      }
    }
    return Error(e.line, "unknown expression");
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e) {
    Args a;
    for (const auto& [name, x] : e.args) {
      PS_ASSIGN_OR_RETURN(Value v, Eval(*x));
      if (name.empty()) {
        a.positional.push_back(std::move(v));
      } else {
        a.keyword.emplace_back(name, std::move(v));
      }
    }
    return a;
  }

  absl::StatusOr<Value> Binary(const Expr& e) {
    const std::string& op = e.name;
    PS_ASSIGN_OR_RETURN(const Value a, Eval(*e.subject));
    if (op == "and") return a.Truthy() ? Eval(*e.args[0].second) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.args[0].second);
    PS_ASSIGN_OR_RETURN(const Value b, Eval(*e.args[0].second));
    const int line = e.line;
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      PS_ASSIGN_OR_RETURN(const bool r, Compare(op, a, b, line));
      return Value(r);
    }
    if (op == "in" || op == "not in") {
      PS_ASSIGN_OR_RETURN(const bool in, Contains(b, a, line));
      return Value(in == (op == "in"));
    }
    if (op == "~") return Value(a.Str() + b.Str());
    auto undefined = [&](const Value& v) {
      return Error(line, absl::StrCat("'", v.undefined_name(), "' is undefined"));
    };
    if (a.is_undefined()) return undefined(a);
    if (b.is_undefined()) return undefined(b);
    const bool numbers = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
    const bool floats = a.is_float() || b.is_float();
    // Python's integers do not overflow; ours are 64-bit and say so.
    auto checked = [&](bool (*op)(int64_t, int64_t, int64_t*)) -> absl::StatusOr<Value> {
      int64_t r = 0;
      if (op(a.as_int(), b.as_int(), &r)) return Error(line, "integer overflow");
      return Value(r);
    };
    static constexpr auto kAdd = [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); };
    static constexpr auto kSub = [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); };
    static constexpr auto kMul = [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); };
    if (op == "+") {
      if (numbers && !floats) return checked(kAdd);
      if (numbers) return Value(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        if (!a.is_markup() && !b.is_markup()) return Value(a.as_string() + b.as_string());
        // Markup + str escapes the str (and str + Markup likewise).
        return Value::Markup((a.is_markup() ? a.as_string() : Escape(a.as_string())) +
                             (b.is_markup() ? b.as_string() : Escape(b.as_string())));
      }
      if (a.is_list() && b.is_list()) {
        List l = a.list();
        l.insert(l.end(), b.list().begin(), b.list().end());
        return Value(std::move(l));
      }
    } else if (op == "-" && numbers) {
      if (!floats) return checked(kSub);
      return Value(a.as_double() - b.as_double());
    } else if (op == "*") {
      if (numbers && !floats) return checked(kMul);
      if (numbers) return Value(a.as_double() * b.as_double());
      const Value* seq = a.is_int() ? &b : &a;
      const Value* count = a.is_int() ? &a : &b;
      if (count->is_int() && (seq->is_string() || seq->is_list())) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        const size_t unit = seq->is_string() ? seq->as_string().size() : seq->list().size();
        if (unit > 0 && n > static_cast<int64_t>(kMaxOutput / unit)) return Error(line, "repetition too long");
        if (seq->is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq->as_string();
          return Value(s);
        }
        List l;
        for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq->list().begin(), seq->list().end());
        return Value(std::move(l));
      }
    } else if ((op == "/" || op == "//" || op == "%") && numbers) {
      if (b.as_double() == 0) return Error(line, "division by zero");
      if (op == "/") return Value(a.as_double() / b.as_double());
      if (floats) {
        const double q = std::floor(a.as_double() / b.as_double());
        return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
      }
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) return Error(line, "integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value(q) : Value(x - q * y);
    } else if (op == "**" && numbers) {
      if (!floats && b.as_int() >= 0) {
        int64_t r = 1;
        int64_t base = a.as_int();
        for (int64_t e = b.as_int(); e > 0; e >>= 1) {  // by squaring
          if ((e & 1) != 0 && __builtin_mul_overflow(r, base, &r)) return Error(line, "integer overflow");
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return Error(line, "integer overflow");
        }
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    return Error(line,
                 absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(), "' and '", b.TypeName(), "'"));
  }

  absl::StatusOr<Value> Slice(const Expr& e) {
    PS_ASSIGN_OR_RETURN(const Value obj, Eval(*e.subject));
    std::optional<int64_t> parts[3];
    for (int k = 0; k < 3; ++k) {
      if (e.args[k].second == nullptr) continue;
      PS_ASSIGN_OR_RETURN(const Value v, Eval(*e.args[k].second));
      if (v.is_none()) continue;
      if (!v.is_int()) return Error(e.line, "slice indices must be integers or None");
      parts[k] = v.as_int();
    }
    List items;
    if (obj.is_list()) {
      items = obj.list();
    } else if (obj.is_string()) {
      for (std::string& c : CodePoints(obj.as_string())) items.emplace_back(std::move(c));
    } else {
      return Error(e.line, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
    }
    const int64_t n = static_cast<int64_t>(items.size());
    if (parts[2] == 0) return Error(e.line, "slice step cannot be zero");
    const int64_t step = std::clamp<int64_t>(parts[2].value_or(1), -n - 1, n + 1);  // the same items, no overflow
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t x = *v < 0 ? *v + n : *v;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(parts[0], step > 0 ? 0 : n - 1), stop = clamp(parts[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[i]);
    if (obj.is_list()) return Value(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(s);
  }

  void AddGlobals() {
    auto& g = scopes_.front();
    auto define = [&](const std::string& name, Function f) {
      if (!g.contains(name)) g[name] = Value(std::move(f));
    };
    define("raise_exception", [](const Args& a) -> absl::StatusOr<Value> {
      return absl::FailedPreconditionError(a.positional.empty() ? "raise_exception" : a.positional[0].Str());
    });
    define("range", [](const Args& a) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : a.positional) {
        if (!v.is_int()) return absl::InvalidArgumentError("range() needs integers");
      }
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() >= 3) step = a.positional[2].as_int();
      } else {
        return absl::InvalidArgumentError("range() needs 1 to 3 arguments");
      }
      if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
      List l;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (l.size() >= 1'000'000) return absl::InvalidArgumentError("range() too long");
        l.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return Value(std::move(l));
    });
    auto make_dict = [](bool ns) {
      return [ns](const Args& a) -> absl::StatusOr<Value> {
        Dict d;
        d.is_namespace = ns;
        for (const Value& p : a.positional) {
          if (!p.is_dict()) return absl::InvalidArgumentError("namespace()/dict() take a mapping or keywords");
          for (const auto& [k, v] : p.dict().items) d.Set(k, v);
        }
        for (const auto& [k, v] : a.keyword) d.Set(k, v);
        return Value(std::move(d));
      };
    };
    // Every namespace is kept until the rendering ends, then emptied: an attribute set
    // to the namespace itself (or to a list or method holding it) is a cycle of shared
    // pointers that would otherwise never be freed.
    define("namespace", [this, make = make_dict(true)](const Args& a) -> absl::StatusOr<Value> {
      PS_ASSIGN_OR_RETURN(Value ns, make(a));
      namespaces_.push_back(ns);
      return ns;
    });
    define("dict", make_dict(false));
    define("strftime_now", [](const Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty() || !a.positional[0].is_string()) {
        return absl::InvalidArgumentError("strftime_now() needs a format");
      }
      const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].as_string().c_str(), &tm);
      return Value(std::string(buf, n));
    });
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  Flow flow_ = Flow::kNormal;
  std::vector<Value> namespaces_;  // made by namespace(): emptied at the end
  const int64_t max_steps_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

// The tree's root, kept alive by every Template copy.
absl::StatusOr<Template> Template::Parse(std::string_view source, Options options) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Node> root, ParseTemplate(source, options));
  return Template(std::shared_ptr<const Node>(std::move(root)), options);
}

absl::StatusOr<std::string> Template::Render(const Dict& context) const {
  Renderer r(context, options_.max_steps);
  PS_RETURN_IF_ERROR(r.Exec(root_->body));
  return std::move(r.out());
}

}  // namespace ps::jinja
