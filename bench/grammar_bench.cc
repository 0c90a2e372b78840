// The cost of structured outputs per decoded token, next to the decode step's own
// time in the same run: a JSON schema compiled to a grammar, its token mask over the
// model's whole vocabulary (151,665 tokens for Qwen2.5) replayed along a reference
// document, then the model generating under the grammar and without it.
//   ps_bench_grammar [--model GGUF] [--threads N] [--tokens N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "base/flags.h"
#include "base/thread_pool.h"
#include "engine/generator.h"
#include "engine/sequence.h"
#include "grammar/json_schema.h"
#include "kernels/backend.h"
#include "model/tokenizer/chat_template.h"

namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

int Fail(const std::string& m) {
  std::fprintf(stderr, "ps_bench_grammar: %s\n", m.c_str());
  return 1;
}

// The schema of the issue's structured-output check: an object with an enum, an
// integer range, an array of objects, required and optional properties.
constexpr char kSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "role": {"enum": ["admin", "user", "guest"]},
    "age": {"type": "integer", "minimum": 18, "maximum": 99},
    "pets": {"type": "array", "maxItems": 4, "items": {"type": "object",
      "properties": {"kind": {"enum": ["cat", "dog", "fish"]}, "name": {"type": "string"}}, "required": ["kind"]}},
    "bio": {"type": "string"}
  },
  "required": ["name", "role", "age", "pets"]
})";

constexpr char kDocument[] = R"({
  "name": "Ada Lovelace",
  "role": "admin",
  "age": 36,
  "pets": [{"kind": "cat", "name": "Babbage"}, {"kind": "dog", "name": "Analytical Engine"}, {"kind": "fish"}],
  "bio": "An English mathematician and writer, chiefly known for her work on Charles Babbage's proposed mechanical general-purpose computer, the Analytical Engine. She was the first to recognise that the machine had applications beyond pure calculation."
})";

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
  int64_t threads = 2, tokens = 96;
  double top_p = 1.0;
  FlagParser flags("ps_bench_grammar",
                   "Structured outputs' cost per decoded token next to the decode step: the JSON-schema grammar's\n"
                   "token mask over the whole vocabulary, then generation with and without the grammar.");
  flags.AddString("model", &model_path, "a GGUF model (default: the evaluation model)");
  flags.AddInt("threads", &threads, "compute threads");
  flags.AddInt("tokens", &tokens, "tokens generated in each decode run");
  flags.AddFloat("top-p", &top_p, "the decode runs' top_p (below 1, the sampler sorts the vocabulary)");
  if (auto st = flags.Parse(argc, argv); !st.ok() || flags.help_requested()) {
    std::fprintf(st.ok() ? stdout : stderr, "%s%s\n", st.ok() ? "" : (std::string(st.message()) + "\n").c_str(),
                 flags.Help().c_str());
    return st.ok() ? 0 : 2;
  }
  ThreadPool pool(static_cast<int>(threads));
  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const Tokenizer* tok = (*model)->tokenizer();
  if (tok == nullptr) return Fail("the model has no tokenizer");

  auto t0 = Clock::now();
  const std::shared_ptr<const grammar::Vocabulary> vocab = GrammarVocabulary(*tok);
  auto t1 = Clock::now();
  const absl::StatusOr<std::string> gbnf = grammar::JsonSchemaToGbnf(nlohmann::ordered_json::parse(kSchema));
  if (!gbnf.ok()) return Fail(std::string(gbnf.status().message()));
  absl::StatusOr<grammar::Grammar> g = grammar::Grammar::FromGbnf(*gbnf);
  if (!g.ok()) return Fail(std::string(g.status().message()));
  auto start =
      std::make_shared<const grammar::Matcher>(std::make_shared<const grammar::CompiledGrammar>(*std::move(g)), vocab);
  auto t2 = Clock::now();
  std::printf("model %s, vocabulary %d tokens (sorted in %.1f ms); schema compiled in %.2f ms (%zu rules)\n",
              model_path.c_str(), vocab->size(), Ms(t0, t1), Ms(t1, t2),
              static_cast<size_t>(std::count(gbnf->begin(), gbnf->end(), '\n')));

  // The mask along the reference document's tokens: every token must be allowed.
  const std::vector<int32_t> doc = tok->Encode(kDocument, false, false);
  grammar::Matcher m = *start;
  std::vector<uint64_t> mask((vocab->size() + 63) / 64);
  std::vector<double> ms;
  for (int32_t t : doc) {
    const auto a = Clock::now();
    m.FillMask(mask);
    ms.push_back(Ms(a, Clock::now()));
    if (!((mask[t >> 6] >> (t & 63)) & 1) || !m.AcceptToken(t)) {
      return Fail("the reference document's token " + std::to_string(t) + " was not allowed");
    }
  }
  if (!m.CanEnd()) return Fail("the reference document did not complete the grammar");
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double mask_mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  std::printf("mask over %zu document tokens: mean %.3f ms, median %.3f ms, max %.3f ms (%lld walks, %lld cached)\n",
              ms.size(), mask_mean, sorted[sorted.size() / 2], sorted.back(), static_cast<long long>(m.cache_misses()),
              static_cast<long long>(m.cache_hits()));

  // Decode with and without the grammar, from the same chat prompt.
  std::string note;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu", pool, {}, &note);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  if (absl::StatusOr<size_t> p = PrepareWeights(**model, **backend); !p.ok())
    return Fail(std::string(p.status().message()));
  absl::StatusOr<ChatTemplatePtr> chat = ChatTemplate::Load(*tok, "");
  if (!chat.ok()) return Fail(std::string(chat.status().message()));
  const std::vector<ChatMessage> msgs = {
      {"user", "Describe a made-up person as JSON with name, role, age, pets (kind and name) and a long bio."}};
  const absl::StatusOr<std::vector<int32_t>> prompt = (*chat)->Encode(msgs);
  if (!prompt.ok()) return Fail(std::string(prompt.status().message()));
  Generator gen(**model, **backend);
  // A first run pages the weights in and warms the caches, so neither measured run pays for it.
  if (!gen.Generate(*prompt, SamplingParams{}, StopCriteria{.max_new_tokens = 8}).ok()) return Fail("warm-up failed");
  double per_token[2] = {0, 0};
  for (int constrained = 0; constrained < 2; ++constrained) {
    SamplingParams sp{.temperature = 0.8f, .top_p = static_cast<float>(top_p), .seed = 3};
    if (constrained) sp.grammar = start;
    const auto r =
        gen.Generate(*prompt, sp, StopCriteria{.max_new_tokens = static_cast<int>(tokens), .ignore_eos = !constrained});
    if (!r.ok()) return Fail(std::string(r.status().message()));
    const size_t n = r->tokens.size();
    per_token[constrained] = 1000 * r->decode_seconds / std::max<size_t>(n - 1, 1);
    std::printf("decode %s: %zu tokens, %.2f ms per token%s\n", constrained ? "with the grammar" : "unconstrained", n,
                per_token[constrained], constrained ? (", output: " + r->text.substr(0, 160)).c_str() : "");
  }
  std::printf(
      "grammar_mask_ms_per_token %.3f\ndecode_ms_per_token %.2f\nmask_share_of_decode %.1f%%\n"
      "decode_with_grammar_overhead %.1f%%\n",
      mask_mean, per_token[0], 100 * mask_mean / per_token[0], 100 * (per_token[1] / per_token[0] - 1));
  return 0;
}
