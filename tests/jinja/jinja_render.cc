// Renders a chat template for the reference comparison (tests/jinja/chat_template_reference_test.py):
//   jinja_render TEMPLATE_FILE < CONTEXT_JSON
// prints the rendering, or the error on stderr with exit status 1.
#include <fstream>
#include <iostream>
#include <sstream>

#include "jinja/template.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: jinja_render TEMPLATE_FILE < CONTEXT_JSON\n";
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  std::stringstream source;
  source << f.rdbuf();
  const nlohmann::ordered_json context = nlohmann::ordered_json::parse(std::cin, nullptr, false);
  if (!f || context.is_discarded() || !context.is_object()) {
    std::cerr << "cannot read the template or the context (a JSON object)\n";
    return 2;
  }
  const absl::StatusOr<ps::jinja::Template> t = ps::jinja::Template::Parse(source.str());
  if (!t.ok()) {
    std::cerr << t.status() << "\n";
    return 1;
  }
  const ps::jinja::Value ctx = ps::jinja::Value::FromJson(context);
  const absl::StatusOr<std::string> out = t->Render(ctx.dict());
  if (!out.ok()) {
    std::cerr << out.status() << "\n";
    return 1;
  }
  std::cout << *out;
  return 0;
}
