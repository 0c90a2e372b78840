// pruneserve-run: offline generation with the engine, no server.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/flags.h"
#include "base/mapped_file.h"
#include "engine/generator.h"
#include "engine/pruning/registry.h"
#include "kernels/cpu/cpu_backend.h"
#include "memory/kv_geometry.h"
#include "model/tokenizer/chat_template.h"

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-run: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ps;
  std::string model_path, prompt, prompt_file, system, chat_template, strategy = "full";
  std::vector<std::string> strategy_args;
  std::vector<std::string> stops;
  int64_t max_new = 128, top_k = 0, seed = 0, threads = 0, logprobs = 0, min_new = 0;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0, rep = 1.0, presence = 0.0, frequency = 0.0;
  std::string activations = "int8", cpu_isa, kv_dtype = kDefaultKvDTypeName;
  bool print_ids = false, chat = false, tokenize = false, ignore_eos = false, stats = false, no_special = false;
  FlagParser flags("pruneserve-run", "Generate text from a model offline (no server). Text goes to stdout.");
  flags.AddString("model", &model_path, "GGUF file or Hugging Face folder (required)");
  flags.AddString("prompt", &prompt, "prompt text");
  flags.AddString("prompt-file", &prompt_file, "read the prompt from this file");
  flags.AddBool("chat", &chat, "format the prompt as a user message with the model's chat template");
  flags.AddString("system", &system, "system message for --chat");
  flags.AddString("chat-template", &chat_template,
                  "a Jinja chat template file in place of the model's own (implies --chat)");
  flags.AddInt("max-new-tokens", &max_new, "tokens to generate at most");
  flags.AddInt("min-new-tokens", &min_new, "tokens to generate before end-of-sequence may stop");
  flags.AddFloat("temperature", &temperature, "0 = greedy");
  flags.AddInt("top-k", &top_k, "keep the k most likely tokens (0 = off)");
  flags.AddFloat("top-p", &top_p, "nucleus sampling mass (1 = off)");
  flags.AddFloat("min-p", &min_p, "drop tokens below min-p x the top probability (0 = off)");
  flags.AddFloat("repetition-penalty", &rep, "penalty for tokens already seen (1 = off)");
  flags.AddFloat("presence-penalty", &presence, "subtracted once from seen tokens' logits");
  flags.AddFloat("frequency-penalty", &frequency, "subtracted per occurrence from seen tokens' logits");
  flags.AddInt("seed", &seed, "random seed (same seed, same tokens)");
  flags.AddStringList("stop", &stops, "stop string");
  flags.AddBool("ignore-eos", &ignore_eos, "keep generating past end-of-sequence tokens");
  flags.AddInt("logprobs", &logprobs, "print the top-N log-probabilities of each token to stderr");
  flags.AddBool("print-ids", &print_ids, "print the generated token ids (one line) instead of text");
  flags.AddBool("tokenize", &tokenize, "print the prompt's token ids and exit");
  flags.AddBool("no-special", &no_special, "do not add BOS/EOS and do not parse special tokens in the prompt");
  flags.AddInt("threads", &threads, "compute threads (0 = number of cores)");
  flags.AddBool("stats", &stats, "print timings to stderr");
  flags.AddString("activations", &activations,
                  "int8 | f32: activations of products with quantised weights (int8: llama.cpp's numerics, the "
                  "packed int8 kernels; f32: exact, slower)");
  flags.AddString("cpu-isa", &cpu_isa, "scalar | avx2 | avx512 | avx512_bf16: cap the CPU kernels' level");
  flags.AddString("kv-dtype", &kv_dtype, "f32 | f16 | bf16 | q8_0: the KV cache's element type (as the server's)");
  std::string strategy_help = "token pruning strategy:";
  for (const StrategyInfo* s : Strategies()) absl::StrAppend(&strategy_help, "\n      ", s->name, ": ", s->summary);
  flags.AddString("strategy", &strategy, strategy_help);
  flags.AddStringList("strategy-arg", &strategy_args,
                      "strategy parameter key=value (the fields of the strategy's message in the API), lists "
                      "comma-separated (e.g. top_k=512, keep=0.5,0.3); unset ones take the model's defaults");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (model_path.empty()) return Fail("--model is required (see --help)");
  if (!prompt_file.empty()) {
    auto text = ReadFileToString(prompt_file);
    if (!text.ok()) return Fail(std::string(text.status().message()));
    prompt = *text;
  }
  if (threads < 0) return Fail("--threads must be >= 0");
  if (max_new <= 0) return Fail("--max-new-tokens must be > 0");
  if (min_new < 0) return Fail("--min-new-tokens must be >= 0");

  auto model = Model::Load(model_path);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  const Tokenizer* tok = (*model)->tokenizer();
  if (tok == nullptr) return Fail("the model has no tokenizer");

  std::vector<int32_t> ids;
  if (chat || !chat_template.empty()) {
    const absl::StatusOr<ChatTemplatePtr> tmpl = ChatTemplate::Load(*tok, chat_template);
    if (!tmpl.ok()) return Fail(std::string(tmpl.status().message()));
    std::vector<ChatMessage> msgs;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", prompt});
    absl::StatusOr<std::vector<int32_t>> formatted = (*tmpl)->Encode(msgs);
    if (!formatted.ok()) return Fail(std::string(formatted.status().message()));
    ids = *std::move(formatted);
  } else {
    ids = tok->Encode(prompt, !no_special, !no_special);
  }
  if (tokenize) {
    std::cout << absl::StrJoin(ids, " ") << "\n";
    return 0;
  }
  if (ids.empty()) return Fail("the prompt is empty (give --prompt or --prompt-file)");

  SamplingParams sp{.temperature = static_cast<float>(temperature),
                    .top_k = static_cast<int>(top_k),
                    .top_p = static_cast<float>(top_p),
                    .min_p = static_cast<float>(min_p),
                    .repetition_penalty = static_cast<float>(rep),
                    .presence_penalty = static_cast<float>(presence),
                    .frequency_penalty = static_cast<float>(frequency),
                    .seed = static_cast<uint64_t>(seed),
                    .top_logprobs = static_cast<int>(logprobs)};
  StopCriteria sc{.max_new_tokens = static_cast<int>(max_new),
                  .min_new_tokens = static_cast<int>(min_new),
                  .stop_strings = stops,
                  .ignore_eos = ignore_eos};
  const absl::StatusOr<StrategyDefaults> defaults = StrategyDefaults::ForModel((*model)->config());
  if (!defaults.ok()) return Fail(std::string(defaults.status().message()));
  const absl::StatusOr<PruningParams> pruning = defaults->WithArgs(strategy, strategy_args, "--strategy-arg");
  if (!pruning.ok()) return Fail(std::string(pruning.status().message()));
  const std::unique_ptr<PruningStrategy> pruner = pruning->Make((*model)->config());
  const absl::StatusOr<bool> int8 = ParseActivations(activations);
  if (!int8.ok()) return Fail(std::string(int8.status().message()));
  const absl::StatusOr<DType> kv = ParseKvDType(kv_dtype);
  if (!kv.ok()) return Fail(std::string(kv.status().message()));
  if (!cpu_isa.empty()) {
    if (absl::Status s = CapCpuKernels(cpu_isa); !s.ok()) return Fail(absl::StrCat("--cpu-isa: ", s.message()));
  }
  ThreadPool pool(static_cast<int>(threads));
  CpuBackend backend(pool, CpuBackendOptions{.int8_activations = *int8});
  if (const absl::StatusOr<size_t> packed = PrepareWeights(**model, backend); !packed.ok()) {
    return Fail(std::string(packed.status().message()));
  }
  Generator gen(**model, backend, *kv);
  auto result = gen.Generate(
      ids, sp, sc,
      [&](const SampledToken& t, std::string_view delta) {
        if (!print_ids) {
          std::cout << delta << std::flush;
        }
        if (logprobs > 0) {
          std::string line = absl::StrCat("token ", t.token, " logprob ", t.logprob, " top:");
          for (const auto& alt : t.top) absl::StrAppend(&line, " ", alt.token, "=", alt.logprob);
          std::fprintf(stderr, "%s\n", line.c_str());
        }
        return true;
      },
      pruner.get());
  if (!result.ok()) return Fail(std::string(result.status().message()));
  if (print_ids) {
    std::cout << absl::StrJoin(result->tokens, " ") << "\n";
  } else {
    std::cout << "\n";
  }
  if (stats) {
    const double n = static_cast<double>(result->tokens.size());
    std::fprintf(
        stderr,
        "prompt tokens %zu, generated %zu, finish %s\nprefill %.3f s (%.1f tok/s), decode %.3f s (%.1f tok/s)\n",
        ids.size(), result->tokens.size(), std::string(FinishReasonName(result->finish_reason)).c_str(),
        result->prefill_seconds, ids.size() / std::max(1e-9, result->prefill_seconds), result->decode_seconds,
        (n - 1) / std::max(1e-9, result->decode_seconds));
    std::fprintf(
        stderr, "strategy %s: prompt tokens computed %.1f%% (token-layer pairs / (prompt tokens x layers))\n",
        strategy.c_str(),
        100.0 * result->prompt_rows_computed / (static_cast<double>(ids.size()) * (*model)->config().n_layers));
  }
  return 0;
}
