// Helpers of the server tests (server_test.cc, server_faults_test.cc): the models,
// the engine's offline tokens to compare streams with, prompts, a drained server.
#pragma once

#include <string>
#include <vector>

#include "tests/server/server_process.h"

namespace ps::testing {

// stories260K, and for tests that need a request to outlast a few round trips even
// on a slow (sanitised) build, SmolLM2: it decodes ~30x slower and has an 8k context.
extern const std::string kStories;
extern const std::string kDefaultModel;

// Offline greedy tokens of the engine for the same prompt (and strategy: "name", key=value args).
std::vector<int32_t> Offline(const std::vector<int32_t>& prompt, int n, const std::string& strategy = "full",
                             const std::vector<std::string>& args = {});
// Flags of a stories260K server on an F32 KV cache, for the tests of tokens (see the .cc).
std::vector<std::string> StoriesOnF32Kv(std::vector<std::string> flags);
std::vector<int32_t> PromptOf(int i);  // 16 different prompts of 5..20 tokens
// Polls GetLoad until nothing runs or waits and the KV cache is empty.
bool Drained(ServerProcess& s);

}  // namespace ps::testing
