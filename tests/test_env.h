// What a test run can be pointed at from outside the build: the shared test data
// ($PS_TESTDATA, else the path CMake compiled in: a bundle of the tests run on
// another machine, scripts/gpu_bundle.sh) and the backend of the tests that run the
// serving core ($PS_TEST_DEVICE: cpu, the default, or cuda).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/thread_pool.h"
#include "kernels/backend.h"

namespace ps::testing {

inline std::string TestDataDir() {
  const char* env = std::getenv("PS_TESTDATA");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(PS_TESTDATA);
}

// $PS_TEST_DEVICE, "cpu" when unset.
inline std::string TestDevice() {
  const char* env = std::getenv("PS_TEST_DEVICE");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("cpu");
}

// The backend $PS_TEST_DEVICE names. A run that asked for a device it cannot have
// stops here: it must not pass on the CPU instead.
inline std::unique_ptr<Backend> TestBackend(ThreadPool& pool) {
  std::string note;
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(TestDevice(), pool, {}, &note);
  if (!b.ok()) {
    std::fprintf(stderr, "PS_TEST_DEVICE=%s: %s\n", TestDevice().c_str(), std::string(b.status().message()).c_str());
    std::abort();
  }
  return std::move(*b);
}

}  // namespace ps::testing
