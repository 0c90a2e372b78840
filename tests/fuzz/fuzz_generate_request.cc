// libFuzzer target: GenerateRequest bytes through the server's validation and
// conversion (no engine): a request for stories260K, or an error naming a field.
#include <cstddef>
#include <cstdint>

#include <google/protobuf/stubs/logging.h>

#include "base/status.h"
#include "tests/fuzz/fuzz_model.h"

// Protobuf logs every string field with invalid UTF-8 it drops: mutations make many.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ps::fuzz::Served& s = ps::fuzz::StoriesModel();
  pruneserve::v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  auto r = ps::server::RequestFromProto(req, *s.model, s.defaults);
  if (!r.ok()) {
    PS_CHECK(!r.status().message().empty()) << "an error without a message";
    return 0;
  }
  const int n_ctx = s.model->config().n_ctx;
  PS_CHECK(!(*r)->spec.prompt.empty() && static_cast<int>((*r)->spec.prompt.size()) < n_ctx);
  PS_CHECK((*r)->spec.stop.max_new_tokens > 0);
  return 0;
}
