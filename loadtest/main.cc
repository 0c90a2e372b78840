// pruneserve-loadtest: a load generator for a running pruneserve (gRPC). Sends
// prompts from a JSONL dataset or synthetic ones of given token lengths at a
// Poisson or gamma rate (or a fixed concurrency), with a strategy mix and optional
// client cancels and deadlines, then prints vLLM `bench serve`'s figures and writes
// them as JSON; --sweep-rates repeats the run at each rate into one JSON
// (loadtest/plot.py draws it).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "loadtest/runner.h"
#include "proto/client_channel.h"

namespace {

namespace pb = ::pruneserve::v1;
namespace lt = ::ps::loadtest;
using Json = nlohmann::json;

struct Options {
  std::string addr = "127.0.0.1:50051", dataset = "synthetic",
              haystack = "../shared/testdata/haystack/paul_graham_essays", strategy_mix = "full", sweep_rates,
              result_file, progress = "auto";
  int64_t input_len = 1024, output_len = 128, documents = 4, questions = 8, question_len = 32, num_requests = 100,
          max_concurrency = 0, seed = 0, sampling_seed = -1, priorities = 1;
  double request_rate = std::numeric_limits<double>::infinity(), burstiness = 1.0, duration = 0, range_ratio = 0,
         cancel_fraction = 0, cancel_within = 1.0, deadline_fraction = 0, deadline = 1.0, abort_fraction = 0,
         abort_within = 1.0, temperature = 0, slo_ttft_ms = 0, slo_tpot_ms = 0, slo_e2el_ms = 0, connect_timeout = 30;
  bool ignore_eos = true;
  ps::ClientChannelOptions channel;
};

void AddFlags(ps::FlagParser& f, Options& o) {
  f.AddString("addr", &o.addr, "the server's gRPC address");
  f.AddString("dataset", &o.dataset,
              "synthetic (prompts of --input-len tokens cut from --haystack), shared-prefix (--documents documents "
              "of --input-len tokens cut from --haystack, each asked --questions questions of --question-len tokens: "
              "what a prefix cache serves) or a JSONL file: lines "
              "{\"prompt\": ..., \"max_tokens\": N}, {\"messages\": [...]} or ShareGPT {\"conversations\": [...]}");
  f.AddString("haystack", &o.haystack, "folder of text files the synthetic prompts are cut from");
  f.AddInt("input-len", &o.input_len, "synthetic prompt tokens (mean)");
  f.AddInt("documents", &o.documents, "shared-prefix: documents");
  f.AddInt("questions", &o.questions,
           "shared-prefix: questions per document (each prompt is a document and a question)");
  f.AddInt("question-len", &o.question_len, "shared-prefix: tokens per question");
  f.AddInt("output-len", &o.output_len, "tokens to generate where the dataset gives no max_tokens (mean)");
  f.AddFloat("range-ratio", &o.range_ratio, "synthetic lengths uniform in len * [1 - r, 1 + r]");
  f.AddInt("num-requests", &o.num_requests, "requests to send (0: send for --duration)");
  f.AddFloat("duration", &o.duration, "seconds to send for (with --num-requests 0)");
  f.AddFloat("request-rate", &o.request_rate, "requests per second (inf: all at once, paced by --max-concurrency)");
  f.AddFloat("burstiness", &o.burstiness, "gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier");
  f.AddInt("max-concurrency", &o.max_concurrency, "requests in flight at most (0: unbounded)");
  f.AddString("strategy-mix", &o.strategy_mix, "strategies and weights, e.g. full=0.5,lazyllm=0.25,gemfilter=0.25");
  f.AddFloat("cancel-fraction", &o.cancel_fraction, "share of requests the client cancels");
  f.AddFloat("cancel-within", &o.cancel_within, "cancel at a uniform time up to this many seconds after the send");
  f.AddFloat("deadline-fraction", &o.deadline_fraction, "share of requests sent with a deadline");
  f.AddFloat("deadline", &o.deadline, "that deadline, seconds after the send");
  f.AddFloat("abort-fraction", &o.abort_fraction, "share of requests ended by the server's Abort RPC (by request id)");
  f.AddFloat("abort-within", &o.abort_within, "abort at a uniform time up to this many seconds after the send");
  f.AddInt("priorities", &o.priorities, "request priorities drawn uniformly from [0, N)");
  f.AddFloat("temperature", &o.temperature, "sampling temperature (0 = greedy)");
  f.AddInt("sampling-seed", &o.sampling_seed, "sampling seed of every request (-1: the server's)");
  f.AddBool("ignore-eos", &o.ignore_eos, "generate exactly the requested tokens (--ignore-eos=false stops at EOS)");
  f.AddInt("seed", &o.seed, "seed of the arrivals, prompts, strategies and cancels");
  f.AddFloat("slo-ttft-ms", &o.slo_ttft_ms, "goodput SLO on TTFT (0: none)");
  f.AddFloat("slo-tpot-ms", &o.slo_tpot_ms, "goodput SLO on TPOT (0: none)");
  f.AddFloat("slo-e2el-ms", &o.slo_e2el_ms, "goodput SLO on end-to-end latency (0: none)");
  f.AddString("sweep-rates", &o.sweep_rates, "comma-separated request rates (inf allowed): one run per rate");
  f.AddString("result-file", &o.result_file, "write the results as JSON here");
  f.AddString("progress", &o.progress, "auto | on | off: a progress line on stderr (auto: when it is a terminal)");
  f.AddFloat("connect-timeout", &o.connect_timeout, "seconds to wait for the server to be serving");
  ps::AddClientChannelFlags(f, &o.channel);
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "pruneserve-loadtest: %s\n", msg.c_str());
  return 2;
}

absl::StatusOr<std::vector<double>> ParseRates(const Options& o) {
  if (o.sweep_rates.empty()) return std::vector<double>{o.request_rate};
  std::vector<double> rates;
  for (absl::string_view item : absl::StrSplit(o.sweep_rates, ',', absl::SkipWhitespace())) {
    double r = 0;
    if (!absl::SimpleAtod(item, &r) || !(r > 0))
      return absl::InvalidArgumentError(absl::StrCat("--sweep-rates: '", item, "' is not a rate > 0"));
    rates.push_back(r);
  }
  if (rates.empty()) return absl::InvalidArgumentError("--sweep-rates: no rates");
  return rates;
}

absl::Status Validate(const Options& o) {
  if (o.num_requests < 0 || (o.num_requests == 0 && !(o.duration > 0)))
    return absl::InvalidArgumentError("give --num-requests N > 0, or --num-requests 0 with --duration S > 0");
  if (o.input_len < 1 || o.output_len < 1)
    return absl::InvalidArgumentError("--input-len and --output-len must be >= 1");
  if (o.documents < 1 || o.questions < 1 || o.question_len < 1)
    return absl::InvalidArgumentError("--documents, --questions and --question-len must be >= 1");
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) return absl::InvalidArgumentError("--range-ratio must be in [0, 1)");
  if (!(o.request_rate > 0)) return absl::InvalidArgumentError("--request-rate must be > 0 (inf allowed)");
  if (!(o.burstiness > 0)) return absl::InvalidArgumentError("--burstiness must be > 0");
  for (double f : {o.cancel_fraction, o.deadline_fraction, o.abort_fraction}) {
    if (!(f >= 0 && f <= 1))
      return absl::InvalidArgumentError("--cancel-fraction, --deadline-fraction and --abort-fraction are in [0, 1]");
  }
  if (!(o.cancel_within > 0) || !(o.deadline > 0) || !(o.abort_within > 0))
    return absl::InvalidArgumentError("--cancel-within, --deadline and --abort-within must be > 0");
  if (o.priorities < 1 || o.priorities > 1000000)
    return absl::InvalidArgumentError("--priorities must be in [1, 10^6]");
  if (o.progress != "auto" && o.progress != "on" && o.progress != "off")
    return absl::InvalidArgumentError("--progress must be auto, on or off");
  return absl::OkStatus();
}

// Waits until the server's health is SERVING (it answers NOT_SERVING while it loads).
absl::Status WaitServing(const std::shared_ptr<grpc::Channel>& channel, double timeout_s) {
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto health = grpc::health::v1::Health::NewStub(channel);
  std::string last = "unreachable";
  while (std::chrono::system_clock::now() < deadline) {
    if (!channel->WaitForConnected(deadline)) break;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    if (s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) return absl::OkStatus();
    last = s.ok() ? "not serving yet" : s.error_message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling the server's state
  }
  return absl::UnavailableError(absl::StrCat("the server is not serving after ", timeout_s, " s (", last, ")"));
}

// The prompts: the dataset's, or synthetic windows of the haystack as the server tokenizes it.
absl::StatusOr<lt::Workload> MakeWorkload(const Options& o, pb::Generation::Stub& stub) {
  auto tokenize = [&](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::TokenizeRequest req;
    req.set_text(text);
    req.set_add_special_tokens(false);
    pb::TokenizeResponse resp;
    const grpc::Status s = stub.Tokenize(&ctx, req, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("Tokenize: ", s.error_message()));
    return std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end());
  };
  if (o.dataset == "synthetic" || o.dataset == "shared-prefix") {
    // Roughly 4 bytes per token; twice the longest prompt so windows vary.
    const size_t want = static_cast<size_t>(o.input_len * (1 + o.range_ratio)) * 8 + 4096;
    absl::StatusOr<std::string> text = lt::ReadTextFiles(o.haystack, want);
    if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("--haystack: ", text.status().message()));
    absl::StatusOr<std::vector<int32_t>> ids = tokenize(*text);
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return absl::InvalidArgumentError("--haystack: the text has no tokens");
    const lt::SyntheticOptions lengths{.input_len = static_cast<int>(o.input_len),
                                       .output_len = static_cast<int>(o.output_len),
                                       .range_ratio = o.range_ratio};
    if (o.dataset == "shared-prefix") {
      return lt::Workload::SharedPrefix(*ids, lengths,
                                        {.documents = static_cast<int>(o.documents),
                                         .questions = static_cast<int>(o.questions),
                                         .question_len = static_cast<int>(o.question_len)},
                                        static_cast<uint64_t>(o.seed));
    }
    return lt::Workload::Synthetic(*std::move(ids), lengths, static_cast<uint64_t>(o.seed));
  }
  std::ifstream in(o.dataset);
  if (!in) return absl::NotFoundError(absl::StrCat("--dataset: cannot open ", o.dataset));
  absl::StatusOr<std::vector<lt::Prompt>> prompts =
      lt::ParseDataset(in, [&](const std::string& text) -> absl::StatusOr<int> {
        absl::StatusOr<std::vector<int32_t>> ids = tokenize(text);
        if (!ids.ok()) return ids.status();
        return static_cast<int>(ids->size());
      });
  if (!prompts.ok())
    return absl::Status(prompts.status().code(), absl::StrCat(o.dataset, ": ", prompts.status().message()));
  return lt::Workload::FromDataset(*std::move(prompts), static_cast<uint64_t>(o.seed));
}

Json ConfigJson(const Options& o) {
  return {{"addr", o.addr},
          {"dataset", o.dataset},
          {"input_len", o.input_len},
          {"documents", o.documents},
          {"questions", o.questions},
          {"question_len", o.question_len},
          {"output_len", o.output_len},
          {"range_ratio", o.range_ratio},
          {"num_requests", o.num_requests},
          {"duration", o.duration},
          {"burstiness", o.burstiness},
          {"max_concurrency", o.max_concurrency},
          {"strategy_mix", o.strategy_mix},
          {"cancel_fraction", o.cancel_fraction},
          {"deadline_fraction", o.deadline_fraction},
          {"abort_fraction", o.abort_fraction},
          {"priorities", o.priorities},
          {"temperature", o.temperature},
          {"ignore_eos", o.ignore_eos},
          {"seed", o.seed},
          {"slo", {{"ttft_ms", o.slo_ttft_ms}, {"tpot_ms", o.slo_tpot_ms}, {"e2el_ms", o.slo_e2el_ms}}}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  ps::FlagParser flags("pruneserve-loadtest",
                       "Load-tests a running pruneserve over gRPC and reports throughput, goodput and TTFT / TPOT / "
                       "ITL / E2E latency percentiles (vLLM bench serve's definitions), overall and per strategy.");
  AddFlags(flags, o);
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return Fail(std::string(s.message()));
  if (flags.help_requested()) {
    std::printf("%s", flags.Help().c_str());
    return 0;
  }
  if (absl::Status s = Validate(o); !s.ok()) return Fail(std::string(s.message()));
  absl::StatusOr<std::vector<double>> rates = ParseRates(o);
  if (!rates.ok()) return Fail(std::string(rates.status().message()));
  absl::StatusOr<lt::StrategyMix> mix = lt::StrategyMix::Parse(o.strategy_mix);
  if (!mix.ok()) return Fail(std::string(mix.status().message()));

  o.channel.max_receive_message_bytes = 64 << 20;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ps::CreateClientChannel(o.addr, o.channel);
  if (!channel.ok()) return Fail(std::string(channel.status().message()));
  if (absl::Status s = WaitServing(*channel, o.connect_timeout); !s.ok()) return Fail(std::string(s.message()));
  auto stub = pb::Generation::NewStub(*channel);
  absl::StatusOr<lt::Workload> workload = MakeWorkload(o, *stub);
  if (!workload.ok()) return Fail(std::string(workload.status().message()));

  const bool progress = o.progress == "on" || (o.progress == "auto" && isatty(STDERR_FILENO));
  const lt::RequestOptions request{.output_len = static_cast<int>(o.output_len),
                                   .ignore_eos = o.ignore_eos,
                                   .temperature = o.temperature,
                                   .seed = o.sampling_seed};
  Json result = {{"config", ConfigJson(o)}, {"runs", Json::array()}};
  int failed = 0;
  for (double rate : *rates) {
    lt::RunOptions run{.arrivals = {.rate = rate, .burstiness = o.burstiness, .seed = static_cast<uint64_t>(o.seed)},
                       .num_requests = static_cast<int>(o.num_requests),
                       .duration_s = o.duration,
                       .max_concurrency = static_cast<int>(o.max_concurrency),
                       .cancel_fraction = o.cancel_fraction,
                       .cancel_within_s = o.cancel_within,
                       .deadline_fraction = o.deadline_fraction,
                       .deadline_s = o.deadline,
                       .abort_fraction = o.abort_fraction,
                       .abort_within_s = o.abort_within,
                       .priorities = static_cast<int>(o.priorities),
                       .seed = static_cast<uint64_t>(o.seed),
                       .progress = progress};
    std::fprintf(stderr, "pruneserve-loadtest: rate %g req/s, %s\n", rate,
                 o.num_requests > 0 ? absl::StrCat(o.num_requests, " requests").c_str()
                                    : absl::StrCat(o.duration, " s").c_str());
    lt::RunResult r = lt::Run(*stub, *workload, *mix, request, run);
    Json summary = lt::Summarize(r.records, r.duration_s,
                                 {.ttft_ms = o.slo_ttft_ms, .tpot_ms = o.slo_tpot_ms, .e2el_ms = o.slo_e2el_ms});
    summary["request_rate"] = std::isinf(rate) ? Json("inf") : Json(rate);
    std::printf("Request rate: %g req/s\n%s", rate, lt::FormatSummary(summary).c_str());
    for (const lt::RequestRecord& rec : r.records) {
      if (rec.outcome == lt::Outcome::kFailed && failed++ < 5)
        std::fprintf(stderr, "pruneserve-loadtest: a request failed: %d %s\n", rec.status_code, rec.error.c_str());
    }
    result["runs"].push_back(std::move(summary));
  }
  if (!o.result_file.empty()) {
    std::ofstream out(o.result_file);
    out << result.dump(2) << "\n";
    if (!out) return Fail(absl::StrCat("cannot write ", o.result_file));
    std::fprintf(stderr, "pruneserve-loadtest: results in %s\n", o.result_file.c_str());
  }
  return failed > 0 ? 1 : 0;
}
