// Starts the real `pruneserve` binary on ephemeral loopback ports for a test and
// talks to it with real gRPC clients. Waiting is done by polling with deadlines,
// never by fixed sleeps.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fcntl.h>
#include <chrono>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "pruneserve/v1/generation.grpc.pb.h"

extern char** environ;

namespace ps::testing {

namespace pb = ::pruneserve::v1;

// Polls `cond` until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

class ServerProcess {
 public:
  // Starts pruneserve with `args` (plus ports and a port file) and waits for SERVING.
  explicit ServerProcess(std::vector<std::string> args) {
    static int counter = 0;
    dir_ = ::testing::TempDir() + "/server_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    std::filesystem::remove_all(dir_);  // a stale port file of an earlier process with this pid
    std::filesystem::create_directories(dir_);
    const std::string port_file = dir_ + "/ports", log = dir_ + "/server.log";
    std::vector<std::string> argv = {std::string(PS_BINARY_DIR) + "/pruneserve", "--host", "127.0.0.1", "--port", "0",
                                     "--metrics-port", "0", "--port-file", port_file, "--log-level", "info",
                                     // Hermetic: no calibration cached by another run (args may name another).
                                     "--calibration-cache", dir_ + "/calibration"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid_, cargv[0], &fa, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_EQ(rc, 0) << "cannot start " << cargv[0];
    const bool ready = WaitFor([&] { return ReadPorts(port_file); }, std::chrono::seconds(30)) &&
                       WaitFor([&] { return Health() == "SERVING"; }, std::chrono::seconds(60));
    EXPECT_TRUE(ready) << "server did not become ready:\n" << Log();
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int metrics_port() const { return metrics_port_; }
  std::shared_ptr<grpc::Channel> channel() {
    if (!channel_) channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
    return channel_;
  }
  std::unique_ptr<pb::Generation::Stub> Stub() { return pb::Generation::NewStub(channel()); }

  // "SERVING", "NOT_SERVING", or the error.
  std::string Health(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
    if (grpc_port_ == 0) return "no port";
    auto stub = grpc::health::v1::Health::NewStub(channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(&ctx, {}, &resp);
    if (!s.ok()) return "error " + std::to_string(s.error_code()) + ": " + s.error_message();
    return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  }

  void Signal(int sig) { ::kill(pid_, sig); }
  // Waits for the process to exit; returns its exit code (or 128 + signal), -1 on timeout.
  int WaitExit(std::chrono::milliseconds timeout) {
    int status = 0;
    const bool done = WaitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!done) return -1;
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string Log() const {
    std::ifstream in(dir_ + "/server.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // The /metrics page (plain HTTP GET over loopback).
  std::string Metrics() const;

 private:
  bool ReadPorts(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("grpc=", 0) == 0) grpc_port_ = std::stoi(line.substr(5));
      if (line.rfind("metrics=", 0) == 0) metrics_port_ = std::stoi(line.substr(8));
    }
    return grpc_port_ > 0;
  }

  std::string dir_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int grpc_port_ = 0, metrics_port_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
};

// Value of one sample of the Prometheus text page, e.g.
// MetricValue(page, "pruneserve_requests_total{finish_reason=\"stop\",strategy=\"full\"}"); 0 if absent.
double MetricValue(const std::string& page, const std::string& sample);

// Everything one Generate call returned.
struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  bool saw_prompt_info = false;
  int finished_events = 0;
  pb::Finished finished;  // the last
  // By choice (GenerateRequest.n): its tokens, and its Finished messages in order.
  std::map<uint32_t, std::vector<int32_t>> choice_tokens;
  std::map<uint32_t, std::vector<pb::Finished>> choice_finished;
  std::string request_id;
};

// Runs one Generate call to the end. `on_chunk` (optional) runs after each chunk
// with the context, so a test can cancel mid-stream.
// `api_key` (when not empty) goes in the authorization metadata.
StreamResult RunStream(pb::Generation::Stub& stub, const pb::GenerateRequest& req,
                       const std::function<void(grpc::ClientContext&, int chunk_index)>& on_chunk = nullptr,
                       std::chrono::milliseconds deadline = std::chrono::milliseconds(0),
                       const std::string& api_key = "");

// A greedy request for `ids` with max_new_tokens, ignoring EOS.
pb::GenerateRequest GreedyRequest(const std::vector<int32_t>& ids, int max_new_tokens, const std::string& id = "");

}  // namespace ps::testing
