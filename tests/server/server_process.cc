#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

namespace ps::testing {

std::string ServerProcess::Metrics() const {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(metrics_port_));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    (void)!::write(fd, req.data(), req.size());
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

double MetricValue(const std::string& page, const std::string& sample) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(sample + " ", 0) == 0) return std::stod(line.substr(sample.size() + 1));
  }
  return 0;
}

StreamResult RunStream(pb::Generation::Stub& stub, const pb::GenerateRequest& req,
                       const std::function<void(grpc::ClientContext&, int)>& on_chunk,
                       std::chrono::milliseconds deadline, const std::string& api_key) {
  grpc::ClientContext ctx;
  if (deadline.count() > 0) ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
  auto reader = stub.Generate(&ctx, req);
  StreamResult r;
  pb::GenerateResponse resp;
  int chunks = 0;
  while (reader->Read(&resp)) {
    if (resp.has_prompt_info()) {
      r.saw_prompt_info = true;
      r.request_id = resp.prompt_info().request_id();
    } else if (resp.has_chunk()) {
      r.tokens.insert(r.tokens.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
      std::vector<int32_t>& mine = r.choice_tokens[resp.chunk().index()];
      mine.insert(mine.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
      r.text += resp.chunk().text();
      if (on_chunk) on_chunk(ctx, chunks);
      ++chunks;
    } else if (resp.has_finished()) {
      ++r.finished_events;
      r.finished = resp.finished();
      r.choice_finished[resp.finished().index()].push_back(resp.finished());
    }
  }
  r.status = reader->Finish();
  return r;
}

pb::GenerateRequest GreedyRequest(const std::vector<int32_t>& ids, int max_new_tokens, const std::string& id) {
  pb::GenerateRequest req;
  req.set_request_id(id);
  for (int32_t t : ids) req.mutable_token_ids()->add_ids(t);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_new_tokens));
  req.mutable_stopping()->set_ignore_eos(true);
  return req;
}

}  // namespace ps::testing
