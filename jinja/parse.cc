// Template text to the tree of jinja/ast.h: the source split into text and tags
// (whitespace control, trim_blocks, lstrip_blocks), each tag's tokens, and a
// recursive-descent parser with Jinja2's precedence.
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "jinja/ast.h"
#include "jinja/parse.h"

namespace ps::jinja {
namespace {

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
  Value value;
};

absl::Status Error(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("template line ", line, ": ", what));
}

// One tag's tokens.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({.kind = Token::Kind::kName, .text = std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string num;
      for (char d : s.substr(i, j - i)) {
        if (d != '_') num += d;
      }
      Token t{.kind = is_float ? Token::Kind::kFloat : Token::Kind::kInt, .text = num};
      if (is_float) {
        t.value = Value(std::strtod(num.c_str(), nullptr));  // out of range: inf or 0, as Python's float()
      } else {
        int64_t v = 0;
        if (std::from_chars(num.data(), num.data() + num.size(), v).ec != std::errc()) {
          return Error(line, absl::StrCat("integer literal out of range: ", num));
        }
        t.value = Value(v);
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '0': v += '\0'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          case '\n': break;  // a line continuation
          default: v += '\\'; v += e;
        }
      }
      if (j >= s.size()) return Error(line, "unterminated string literal");
      out.push_back({.kind = Token::Kind::kString, .text = v, .value = Value(v)});
      i = j + 1;
    } else {
      static constexpr std::string_view kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (std::string_view two : kTwo) {
        if (s.substr(i, 2) == two) op = std::string(two);
      }
      if (std::string_view("()[]{},:.|~+-*/%<>=!").find(c) == std::string_view::npos) {
        return Error(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      out.push_back({.kind = Token::Kind::kOp, .text = op});
      i += op.size();
    }
  }
  out.push_back({.kind = Token::Kind::kEnd});
  return out;
}

// The source as text pieces and tags.
struct Piece {
  enum class Kind { kText, kExpr, kStmt };
  Kind kind;
  std::string text;
  int line;
};

absl::StatusOr<std::vector<Piece>> Split(std::string_view src, const Template::Options& o) {
  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  while (pos < src.size()) {
    size_t start = pos;
    char kind = 0;
    while ((start = src.find('{', start)) != std::string_view::npos) {
      if (start + 1 < src.size() && (src[start + 1] == '{' || src[start + 1] == '%' || src[start + 1] == '#')) {
        kind = src[start + 1];
        break;
      }
      ++start;
    }
    if (kind == 0) start = src.size();
    std::string text(src.substr(pos, start - pos));
    const int text_line = line;
    count_lines(pos, start);
    if (kind == 0) {
      if (!text.empty()) out.push_back({Piece::Kind::kText, std::move(text), text_line});
      break;
    }
    const int tag_line = line;
    size_t inner = start + 2;
    const bool block = kind == '%' || kind == '#';
    if (inner < src.size() && src[inner] == '-') {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
      ++inner;
    } else if (inner < src.size() && src[inner] == '+') {
      ++inner;
    } else if (block && o.lstrip_blocks) {
      // Spaces and tabs between the line's start and the tag go (as Jinja's lexer: the
      // line starts after a newline in the text, or where the text starts after one).
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool line_start = nl != std::string::npos || pos == 0 || src[pos - 1] == '\n';
      if (line_start && text.find_first_not_of(" \t", from) == std::string::npos) text.erase(from);
    }
    if (!text.empty()) out.push_back({Piece::Kind::kText, std::move(text), text_line});
    // The tag's end, outside string literals.
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end = inner;
    char quote = 0;
    for (; end + 1 < src.size(); ++end) {
      if (kind != '#') {
        if (quote != 0) {
          if (src[end] == '\\') {
            ++end;
          } else if (src[end] == quote) {
            quote = 0;
          }
          continue;
        }
        if (src[end] == '\'' || src[end] == '"') {
          quote = src[end];
          continue;
        }
      }
      if (src.substr(end, 2) == close) break;
    }
    if (end + 1 >= src.size()) return Error(tag_line, absl::StrCat("unclosed tag (no '", std::string(close), "')"));
    size_t inner_end = end;
    bool strip_after = false;
    if (inner_end > inner && src[inner_end - 1] == '-') {
      --inner_end;
      strip_after = true;
    }
    if (kind != '#') {
      out.push_back({kind == '{' ? Piece::Kind::kExpr : Piece::Kind::kStmt,
                     std::string(src.substr(inner, inner_end - inner)), tag_line});
    }
    count_lines(start, end + 2);
    pos = end + 2;
    if (strip_after) {
      const size_t p = pos;
      while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) ++pos;
      count_lines(p, pos);
    } else if (block && o.trim_blocks && pos < src.size() && src[pos] == '\n') {
      ++pos;
      ++line;
    }
  }
  return out;
}

// Nesting deeper than this (blocks, parentheses, unary operators) is an error, not a
// stack overflow.
constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::StatusOr<NodePtr> Root() {
    auto root = std::make_unique<Node>();
    std::string end;
    if (absl::Status st = ParseBody(&root->body, {}, &end); !st.ok()) return st;
    return root;
  }

 private:
  // Statements until one of `ends` (its keyword into *end); at the top level, until the end.
  absl::Status ParseBody(Body* body, std::vector<std::string_view> ends, std::string* end) {
    const Nesting nesting(this);
    if (depth_ > kMaxDepth) return Error(line_, "blocks nested too deeply");
    while (next_ < pieces_.size()) {
      const Piece& p = pieces_[next_++];
      line_ = p.line;
      if (p.kind == Piece::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = p.line;
        n->text = p.text;
        body->push_back(std::move(n));
        continue;
      }
      auto tokens = Tokenize(p.text, p.line);
      if (!tokens.ok()) return tokens.status();
      toks_ = std::move(*tokens);
      at_ = 0;
      if (p.kind == Piece::Kind::kExpr) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = p.line;
        auto e = Expression();
        if (!e.ok()) return e.status();
        n->expr = std::move(*e);
        if (absl::Status st = ExpectEnd(); !st.ok()) return st;
        body->push_back(std::move(n));
        continue;
      }
      if (Peek().kind != Token::Kind::kName) return Error(line_, "a statement must start with a keyword");
      const std::string kw = Take().text;
      for (std::string_view e : ends) {
        if (kw == e) {
          *end = kw;
          return absl::OkStatus();
        }
      }
      auto n = Statement(kw);
      if (!n.ok()) return n.status();
      if (*n != nullptr) body->push_back(std::move(*n));
    }
    if (!ends.empty()) {
      return Error(line_, absl::StrCat("unexpected end of template: missing '", std::string(ends.back()), "'"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<NodePtr> Statement(const std::string& kw) {
    auto n = std::make_unique<Node>();
    n->line = line_;
    std::string end;
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      std::string_view keyword = "if";
      while (true) {
        ExprPtr cond;
        if (keyword != "else") {
          auto c = Expression();
          if (!c.ok()) return c.status();
          cond = std::move(*c);
        }
        if (absl::Status st = ExpectEnd(); !st.ok()) return st;
        Body body;
        if (absl::Status st = ParseBody(&body, {"elif", "else", "endif"}, &end); !st.ok()) return st;
        if (keyword == "else") {
          n->else_body = std::move(body);
        } else {
          n->branches.emplace_back(std::move(cond), std::move(body));
        }
        if (end == "endif") break;
        if (keyword == "else") return Error(line_, "'elif' or 'else' after 'else'");
        keyword = end == "elif" ? "elif" : "else";
      }
      return ExpectEndThen(std::move(n));
    }
    if (kw == "for") {
      n->kind = Node::Kind::kFor;
      if (absl::Status st = Targets(&n->targets); !st.ok()) return st;
      if (!TakeName("in")) return Error(line_, "expected 'in' in a for loop");
      auto iter = Expression(/*allow_cond=*/false);
      if (!iter.ok()) return iter.status();
      n->expr = std::move(*iter);
      if (TakeName("if")) {
        auto f = Expression(false);
        if (!f.ok()) return f.status();
        n->filter = std::move(*f);
      }
      if (TakeName("recursive")) return Error(line_, "recursive loops are not supported");
      if (absl::Status st = ExpectEnd(); !st.ok()) return st;
      if (absl::Status st = ParseBody(&n->body, {"else", "endfor"}, &end); !st.ok()) return st;
      if (end == "else") {
        if (absl::Status st = ExpectEnd(); !st.ok()) return st;
        if (absl::Status st = ParseBody(&n->else_body, {"endfor"}, &end); !st.ok()) return st;
      }
      return ExpectEndThen(std::move(n));
    }
    if (kw == "set") {
      if (Peek().kind == Token::Kind::kName && Peek(1).text == "." && Peek(2).kind == Token::Kind::kName) {
        n->kind = Node::Kind::kSet;
        n->targets.push_back(Take().text);
        Take();
        n->attr = Take().text;
      } else {
        if (absl::Status st = Targets(&n->targets); !st.ok()) return st;
        if (Peek().kind == Token::Kind::kEnd) {  // {% set x %}...{% endset %}
          if (n->targets.size() != 1) return Error(line_, "a set block assigns one name");
          n->kind = Node::Kind::kSetBlock;
          if (absl::Status st = ParseBody(&n->body, {"endset"}, &end); !st.ok()) return st;
          return ExpectEndThen(std::move(n));
        }
        n->kind = Node::Kind::kSet;
      }
      if (!TakeOp("=")) return Error(line_, "expected '=' in set");
      auto e = Expression();
      if (!e.ok()) return e.status();
      if (Peek().text == ",") {  // a tuple
        auto list = std::make_unique<Expr>();
        list->kind = Expr::Kind::kList;
        list->line = line_;
        list->args.emplace_back("", std::move(*e));
        while (TakeOp(",")) {
          auto item = Expression();
          if (!item.ok()) return item.status();
          list->args.emplace_back("", std::move(*item));
        }
        n->expr = std::move(list);
      } else {
        n->expr = std::move(*e);
      }
      return ExpectEndThen(std::move(n));
    }
    if (kw == "macro") {
      n->kind = Node::Kind::kMacro;
      if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a macro name");
      n->attr = Take().text;
      if (!TakeOp("(")) return Error(line_, "expected '(' after the macro name");
      while (!TakeOp(")")) {
        if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a parameter name");
        std::string name = Take().text;
        ExprPtr def;
        if (TakeOp("=")) {
          auto d = Expression();
          if (!d.ok()) return d.status();
          def = std::move(*d);
        }
        n->params.emplace_back(std::move(name), std::move(def));
        if (!TakeOp(",") && Peek().text != ")") return Error(line_, "expected ',' or ')' in the parameters");
      }
      if (absl::Status st = ExpectEnd(); !st.ok()) return st;
      if (absl::Status st = ParseBody(&n->body, {"endmacro"}, &end); !st.ok()) return st;
      return ExpectEndThen(std::move(n));
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      return ExpectEndThen(std::move(n));
    }
    if (kw == "generation") {  // transformers' marker of the assistant's tokens: its body as is
      if (absl::Status st = ExpectEnd(); !st.ok()) return st;
      n->kind = Node::Kind::kBody;
      if (absl::Status st = ParseBody(&n->body, {"endgeneration"}, &end); !st.ok()) return st;
      return ExpectEndThen(std::move(n));
    }
    return Error(line_, absl::StrCat("unknown or misplaced statement '", kw, "'"));
  }

  absl::StatusOr<NodePtr> ExpectEndThen(NodePtr n) {
    if (absl::Status st = ExpectEnd(); !st.ok()) return st;
    return n;
  }

  absl::Status Targets(std::vector<std::string>* targets) {
    const bool paren = TakeOp("(");
    do {
      if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a variable name");
      targets->push_back(Take().text);
    } while (TakeOp(","));
    if (paren && !TakeOp(")")) return Error(line_, "expected ')'");
    return absl::OkStatus();
  }

  // ---- Expressions, lowest precedence first.
  absl::StatusOr<ExprPtr> Expression(bool allow_cond = true) {
    const Nesting nesting(this);
    if (depth_ > kMaxDepth) return Error(line_, "expression nested too deeply");
    auto e = Or();
    if (!e.ok() || !allow_cond || !(Peek().kind == Token::Kind::kName && Peek().text == "if")) return e;
    Take();
    auto cond = Or();
    if (!cond.ok()) return cond.status();
    auto n = Make(Expr::Kind::kCond);
    n->subject = std::move(*cond);
    n->args.emplace_back("", std::move(*e));
    if (TakeName("else")) {
      auto other = Expression();
      if (!other.ok()) return other.status();
      n->args.emplace_back("", std::move(*other));
    } else {
      n->args.emplace_back("", nullptr);
    }
    return n;
  }

  absl::StatusOr<ExprPtr> Or() { return BinaryLevel({"or"}, &Parser::And, true); }
  absl::StatusOr<ExprPtr> And() { return BinaryLevel({"and"}, &Parser::Not, true); }
  absl::StatusOr<ExprPtr> Not() {
    const Nesting nesting(this);
    if (depth_ > kMaxDepth) return Error(line_, "expression nested too deeply");
    if (Peek().kind == Token::Kind::kName && Peek().text == "not") {
      Take();
      auto e = Not();
      if (!e.ok()) return e;
      auto n = Make(Expr::Kind::kUnary);
      n->name = "not";
      n->subject = std::move(*e);
      return n;
    }
    return Compare();
  }
  absl::StatusOr<ExprPtr> Compare() {
    auto left = Math1();
    if (!left.ok()) return left;
    ExprPtr e = std::move(*left);
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == Token::Kind::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = Take().text;
      } else if (t.kind == Token::Kind::kName && t.text == "in") {
        op = Take().text;
      } else if (t.kind == Token::Kind::kName && t.text == "not" && Peek(1).text == "in") {
        Take();
        Take();
        op = "not in";
      } else {
        return e;
      }
      auto right = Math1();
      if (!right.ok()) return right;
      e = BinaryNode(op, std::move(e), std::move(*right));
    }
  }
  absl::StatusOr<ExprPtr> Math1() { return BinaryLevel({"+", "-"}, &Parser::Concat, false); }
  absl::StatusOr<ExprPtr> Concat() { return BinaryLevel({"~"}, &Parser::Math2, false); }
  absl::StatusOr<ExprPtr> Math2() { return BinaryLevel({"*", "/", "//", "%"}, &Parser::Pow, false); }
  absl::StatusOr<ExprPtr> Pow() { return BinaryLevel({"**"}, &Parser::Unary, false); }
  absl::StatusOr<ExprPtr> Unary() {
    const Nesting nesting(this);
    if (depth_ > kMaxDepth) return Error(line_, "expression nested too deeply");
    if (Peek().kind == Token::Kind::kOp && (Peek().text == "-" || Peek().text == "+")) {
      auto n = Make(Expr::Kind::kUnary);
      n->name = Take().text;
      auto e = Unary();
      if (!e.ok()) return e;
      n->subject = std::move(*e);
      return n;
    }
    auto p = Primary();
    if (!p.ok()) return p;
    return Postfix(std::move(*p));
  }

  absl::StatusOr<ExprPtr> BinaryLevel(std::vector<std::string_view> ops, absl::StatusOr<ExprPtr> (Parser::*next)(),
                                      bool names) {
    auto left = (this->*next)();
    if (!left.ok()) return left;
    ExprPtr e = std::move(*left);
    while (true) {
      const Token& t = Peek();
      const bool match = (names ? t.kind == Token::Kind::kName : t.kind == Token::Kind::kOp) &&
                         std::ranges::find(ops, std::string_view(t.text)) != ops.end();
      if (!match) return e;
      const std::string op = Take().text;
      auto right = (this->*next)();
      if (!right.ok()) return right;
      e = BinaryNode(op, std::move(e), std::move(*right));
    }
  }

  ExprPtr BinaryNode(const std::string& op, ExprPtr a, ExprPtr b) {
    auto n = Make(Expr::Kind::kBinary);
    n->name = op;
    n->subject = std::move(a);
    n->args.emplace_back("", std::move(b));
    return n;
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token t = Take();
    switch (t.kind) {
      case Token::Kind::kString: {
        std::string s = t.text;
        while (Peek().kind == Token::Kind::kString) s += Take().text;  // adjacent literals concatenate
        auto n = Make(Expr::Kind::kLiteral);
        n->literal = Value(s);
        return n;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        auto n = Make(Expr::Kind::kLiteral);
        n->literal = t.value;
        return n;
      }
      case Token::Kind::kName: {
        auto n = Make(Expr::Kind::kLiteral);
        if (t.text == "true" || t.text == "True") {
          n->literal = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          n->literal = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          n->literal = Value::MakeNone();
        } else {
          n->kind = Expr::Kind::kName;
          n->name = t.text;
        }
        return n;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          auto e = Expression();
          if (!e.ok()) return e;
          if (Peek().text != ",") {
            if (!TakeOp(")")) return Error(line_, "expected ')'");
            return e;
          }
          auto list = Make(Expr::Kind::kList);  // a tuple
          list->args.emplace_back("", std::move(*e));
          while (TakeOp(",")) {
            if (Peek().text == ")") break;
            auto item = Expression();
            if (!item.ok()) return item;
            list->args.emplace_back("", std::move(*item));
          }
          if (!TakeOp(")")) return Error(line_, "expected ')'");
          return list;
        }
        if (t.text == "[") {
          auto list = Make(Expr::Kind::kList);
          while (!TakeOp("]")) {
            auto item = Expression();
            if (!item.ok()) return item;
            list->args.emplace_back("", std::move(*item));
            if (!TakeOp(",") && Peek().text != "]") return Error(line_, "expected ',' or ']'");
          }
          return list;
        }
        if (t.text == "{") {
          auto dict = Make(Expr::Kind::kDict);
          while (!TakeOp("}")) {
            auto key = Expression();
            if (!key.ok()) return key;
            if (!TakeOp(":")) return Error(line_, "expected ':' in a dict literal");
            auto value = Expression();
            if (!value.ok()) return value;
            dict->keys.push_back(std::move(*key));
            dict->args.emplace_back("", std::move(*value));
            if (!TakeOp(",") && Peek().text != "}") return Error(line_, "expected ',' or '}'");
          }
          return dict;
        }
        break;
      case Token::Kind::kEnd: return Error(line_, "unexpected end of expression");
    }
    return Error(line_, absl::StrCat("unexpected '", t.text, "'"));
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
    while (true) {
      if (TakeOp(".")) {
        if (Peek().kind != Token::Kind::kName && Peek().kind != Token::Kind::kInt) {
          return Error(line_, "expected an attribute name after '.'");
        }
        auto n = Make(Expr::Kind::kAttr);
        n->name = Take().text;
        n->subject = std::move(e);
        e = std::move(n);
      } else if (TakeOp("[")) {
        auto n = Make(Expr::Kind::kItem);
        n->subject = std::move(e);
        ExprPtr parts[3];
        int part = 0;
        bool slice = false;
        while (true) {
          if (Peek().text == ":") {
            Take();
            slice = true;
            if (++part > 2) return Error(line_, "too many ':' in a slice");
            continue;
          }
          if (Peek().text == "]") break;
          auto x = Expression();
          if (!x.ok()) return x;
          parts[part] = std::move(*x);
        }
        Take();
        if (slice) {
          n->kind = Expr::Kind::kSlice;
          for (auto& p : parts) n->args.emplace_back("", std::move(p));
        } else {
          if (parts[0] == nullptr) return Error(line_, "empty subscript");
          n->args.emplace_back("", std::move(parts[0]));
        }
        e = std::move(n);
      } else if (TakeOp("(")) {
        auto n = Make(Expr::Kind::kCall);
        n->subject = std::move(e);
        if (absl::Status st = CallArgs(&n->args); !st.ok()) return st;
        e = std::move(n);
      } else if (TakeOp("|")) {
        if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a filter name after '|'");
        auto n = Make(Expr::Kind::kFilter);
        n->name = Take().text;
        n->subject = std::move(e);
        if (TakeOp("(")) {
          if (absl::Status st = CallArgs(&n->args); !st.ok()) return st;
        }
        e = std::move(n);
      } else if (Peek().kind == Token::Kind::kName && Peek().text == "is") {
        Take();
        auto n = Make(Expr::Kind::kTest);
        n->negated = TakeName("not");
        if (Peek().kind != Token::Kind::kName) return Error(line_, "expected a test name after 'is'");
        n->name = Take().text;
        n->subject = std::move(e);
        if (TakeOp("(")) {
          if (absl::Status st = CallArgs(&n->args); !st.ok()) return st;
        } else if (Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt ||
                   Peek().kind == Token::Kind::kFloat) {  // `is divisibleby 3`, `is eq 'x'`
          auto arg = Primary();
          if (!arg.ok()) return arg;
          n->args.emplace_back("", std::move(*arg));
        }
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  absl::Status CallArgs(std::vector<std::pair<std::string, ExprPtr>>* args) {
    while (!TakeOp(")")) {
      std::string name;
      if (Peek().kind == Token::Kind::kName && Peek(1).text == "=") {
        name = Take().text;
        Take();
      }
      auto e = Expression();
      if (!e.ok()) return e.status();
      args->emplace_back(std::move(name), std::move(*e));
      if (!TakeOp(",") && Peek().text != ")") return Error(line_, "expected ',' or ')' in the arguments");
    }
    return absl::OkStatus();
  }

  ExprPtr Make(Expr::Kind k) {
    auto n = std::make_unique<Expr>();
    n->kind = k;
    n->line = line_;
    return n;
  }
  const Token& Peek(size_t ahead = 0) const { return toks_[std::min(at_ + ahead, toks_.size() - 1)]; }
  Token Take() { return at_ < toks_.size() - 1 ? toks_[at_++] : toks_.back(); }
  bool TakeOp(std::string_view op) {
    if (Peek().kind != Token::Kind::kOp || Peek().text != op) return false;
    ++at_;
    return true;
  }
  bool TakeName(std::string_view name) {
    if (Peek().kind != Token::Kind::kName || Peek().text != name) return false;
    ++at_;
    return true;
  }
  absl::Status ExpectEnd() {
    if (Peek().kind != Token::Kind::kEnd) return Error(line_, absl::StrCat("unexpected '", Peek().text, "'"));
    return absl::OkStatus();
  }

  struct Nesting {
    explicit Nesting(Parser* p) : p(p) { ++p->depth_; }
    ~Nesting() { --p->depth_; }
    Parser* p;
  };

  std::vector<Piece> pieces_;
  int depth_ = 0;
  size_t next_ = 0;
  std::vector<Token> toks_;
  size_t at_ = 0;
  int line_ = 1;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Node>> ParseTemplate(std::string_view source, const Template::Options& options) {
  // One trailing newline is not part of the output (Jinja's keep_trailing_newline=False).
  if (source.ends_with("\r\n")) {
    source.remove_suffix(2);
  } else if (source.ends_with('\n') || source.ends_with('\r')) {
    source.remove_suffix(1);
  }
  auto pieces = Split(source, options);
  if (!pieces.ok()) return pieces.status();
  return Parser(std::move(*pieces)).Root();
}

}  // namespace ps::jinja
