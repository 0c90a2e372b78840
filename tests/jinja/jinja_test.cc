// The Jinja interpreter on the constructs chat templates use, each expectation what
// Jinja2 (transformers' environment: trim_blocks, lstrip_blocks) renders; errors name
// the line. tests/jinja/chat_template_reference_test.py compares whole templates with
// transformers itself.
#include "jinja/template.h"

#include <gtest/gtest.h>

namespace ps::jinja {
namespace {

Dict Context(const char* json) { return Value::FromJson(nlohmann::ordered_json::parse(json)).dict(); }

std::string Render(std::string_view source, const char* json = "{}") {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(Context(json));
  if (!out.ok()) return "RENDER ERROR: " + std::string(out.status().message());
  return *out;
}

TEST(Jinja, TextAndOutput) {
  EXPECT_EQ(Render("a {{ x }} b", R"({"x": "X"})"), "a X b");
  EXPECT_EQ(Render("{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ true }} {{ none }} {{ missing }}."), "1 1.5 2.0 True None .");
  EXPECT_EQ(Render("{{ [1, 'a', none, true] }} {{ {'k': [1.0]} }}"), "[1, 'a', None, True] {'k': [1.0]}");
  EXPECT_EQ(Render("{{ \"it's\" }} {{ ['it\\'s'] }}"), "it's [\"it's\"]");
  EXPECT_EQ(Render("{# a comment #}x"), "x");
}

TEST(Jinja, WhitespaceControlTrimAndLstripBlocks) {
  EXPECT_EQ(Render("a  {{- ' b ' -}}  c"), "a b c");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indent before it.
  EXPECT_EQ(Render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(Render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(Render("a  {% if true %}x{% endif %}"), "a  x") << "not at a line start: kept";
  EXPECT_EQ(Render("  {{ 'x' }}\n\n"), "  x\n") << "expressions are not blocks; one trailing newline goes";
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(Render("{%- if true -%}\n\n x \n{%- endif %}"), "x");
}

TEST(Jinja, Conditionals) {
  constexpr const char* kT = "{% if n > 2 %}big{% elif n == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(Render(kT, R"({"n": 3})"), "big");
  EXPECT_EQ(Render(kT, R"({"n": 2})"), "two");
  EXPECT_EQ(Render(kT, R"({"n": 1})"), "small");
  EXPECT_EQ(Render("{{ 'y' if x else 'n' }}{{ 'y' if not x }}", R"({"x": []})"), "ny");
  EXPECT_EQ(Render("{{ a or 'd' }} {{ a and b }} {{ b and 0 }}", R"({"a": "", "b": "B"})"), "d  0");
}

TEST(Jinja, LoopsAndTheLoopVariable) {
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
                   R"({"xs": ["a", "b", "c"]})"),
            "0a,1b,2c");
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.previtem is defined }}/{{ loop.nextitem | default('-') }} {% endfor %}",
                   R"({"xs": [1, 2]})"),
            "False/2 True/- ");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})"),
            "b=1;a=2;");
  EXPECT_EQ(Render("{% for x in range(5) if x is odd %}{{ x }}{% endfor %}"), "13");
  EXPECT_EQ(Render("{% for x in range(9) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(Render("{% for x in 'ab' %}{{ loop.cycle('+', '-') }}{{ x }}{% endfor %}"), "+a-b");
}

TEST(Jinja, ScopesAndNamespaces) {
  // A set inside a loop does not leak out of it; a namespace's attribute does.
  EXPECT_EQ(Render("{% set n = 0 %}{% for x in [1, 2] %}{% set n = n + x %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(Render("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}{% endfor %}"
                   "{{ ns.n }}"),
            "3");
  EXPECT_EQ(Render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  EXPECT_EQ(Render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  // A namespace holding itself is a cycle, freed when the rendering ends (LeakSanitizer
  // in the ASan build and fuzz_jinja check that).
  EXPECT_EQ(Render("{% set ns = namespace(x=0) %}{% set ns.x = [ns, ns.items] %}{{ ns.x | length }}"), "2");
  EXPECT_EQ(Render("{% set s %}x{{ 1 + 1 }}{% endset %}[{{ s }}]"), "[x2]");
  EXPECT_EQ(Render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}"), "<1B><23>");
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}"),
            "3 -4 2 3.5 1024 7");
  EXPECT_EQ(Render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}"), "a1None abab [1, 2]");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}"),
            "True True True False");
  EXPECT_EQ(Render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[::-1] }}{{ 'hello'[1:3] }}", R"({"xs": [1, 2, 3]})"),
            "13[2, 3][3, 2, 1]el");
  EXPECT_EQ(Render("{{ m.role }} {{ m['content'] }} {{ m.missing is defined }}",
                   R"({"m": {"role": "user", "content": "hi"}})"),
            "user hi False");
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }}"), "True True True True");
}

TEST(Jinja, FiltersTestsAndMethods) {
  EXPECT_EQ(Render("{{ '  x  ' | trim }}|{{ ' x '.strip() }}|{{ 'xay'.strip('xy') }}|{{ 'a,b'.split(',') }}"),
            "x|x|a|['a', 'b']");
  EXPECT_EQ(Render("{{ xs | length }} {{ xs | join('-') }} {{ xs | first }} {{ xs | last }} {{ 'Ab' | upper }}",
                   R"({"xs": [1, 2, 3]})"),
            "3 1-2-3 1 3 AB");
  EXPECT_EQ(Render("{{ t | tojson }}", R"({"t": {"name": "f", "args": {"x": [1, 2.5, null, true]}, "u": "é\n\""}})"),
            R"({"name": "f", "args": {"x": [1, 2.5, null, true]}, "u": "é\n\""})");
  EXPECT_EQ(Render("{{ t | tojson(indent=2) }}", R"({"t": {"a": [1], "b": {}}})"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(Render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}",
                   R"({"ms": [{"role": "user", "c": 1}, {"role": "x", "c": 2}, {"role": "user", "c": 3}]})"),
            "[1, 3]");
  EXPECT_EQ(Render("{{ x is string }} {{ x is mapping }} {{ n is number }} {{ n is divisibleby 3 }} {{ none is none }}",
                   R"({"x": "s", "n": 9})"),
            "True False True True True");
  EXPECT_EQ(
      Render("{{ 'hi'.startswith('h') }} {{ 'a_b'.replace('_', ' ').title() }} {{ d.get('k', 5) }}", R"({"d": {}})"),
      "True A B 5");
  EXPECT_EQ(Render("{{ 'a\nb' | indent(2) }}|{{ 1.0e-5 }}|{{ 123456789.0 * 1e9 }}"), "a\n  b|1e-05|1.23456789e+17");
}

TEST(Jinja, ErrorsNameTheLine) {
  EXPECT_EQ(Render("x\n{{ raise_exception('no system role') }}"), "RENDER ERROR: no system role");
  EXPECT_EQ(Render("x\n{% if %}"), "PARSE ERROR: template line 2: unexpected end of expression");
  EXPECT_EQ(Render("{% for x in y %}"), "PARSE ERROR: template line 1: unexpected end of template: missing 'endfor'");
  EXPECT_EQ(Render("{% include 'x' %}"), "PARSE ERROR: template line 1: unknown or misplaced statement 'include'");
  EXPECT_EQ(Render("\n\n{{ x.y.z }}", R"({"x": {}})"), "RENDER ERROR: template line 3: 'y' is undefined");
  EXPECT_EQ(Render("{{ 1 + 'a' }}"), "RENDER ERROR: template line 1: unsupported operand types for +: 'int' and 'str'");
  EXPECT_EQ(Render("{{ x | nosuch }}"), "RENDER ERROR: template line 1: filter 'nosuch': unknown filter");
  EXPECT_EQ(Render("\n{{ 3 | map('upper') | list }}"),
            "RENDER ERROR: template line 2: filter 'map': 'int' object is not iterable");
  EXPECT_EQ(Render("{{ 'unterminated }}"), "PARSE ERROR: template line 1: unclosed tag (no '}}')");
}

TEST(Jinja, RunawayTemplatesFailInsteadOfExhaustingTheMachine) {
  EXPECT_EQ(Render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}"),
            "PARSE ERROR: template line 1: expression nested too deeply");
  EXPECT_EQ(Render("{{ " + std::string(300, '-') + "1 }}"),
            "PARSE ERROR: template line 1: expression nested too deeply");
  EXPECT_EQ(Render("{{ 1e999 }} {{ -1e999 }} {{ 1e-999 }}"), "inf -inf 0.0");  // fuzz_jinja found stod's throw
  EXPECT_EQ(Render("{{ 99999999999999999999 }}"),
            "PARSE ERROR: template line 1: integer literal out of range: "
            "99999999999999999999");
  EXPECT_EQ(Render("{{ 9223372036854775807 + 1 }}"), "RENDER ERROR: template line 1: integer overflow");
  EXPECT_EQ(Render("{{ 3 ** 99 }}"), "RENDER ERROR: template line 1: integer overflow");
  EXPECT_EQ(Render("{{ 'x' * 100000000000 }}"), "RENDER ERROR: template line 1: repetition too long");
  EXPECT_EQ(Render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
            "RENDER ERROR: template line 1: macro calls nested too deeply");
  absl::StatusOr<Template> loops = Template::Parse(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", {.max_steps = 100'000});
  ASSERT_TRUE(loops.ok()) << loops.status();
  EXPECT_EQ(loops->Render({}).status().message(), "template line 1: the template takes too long to render");
}

}  // namespace
}  // namespace ps::jinja
