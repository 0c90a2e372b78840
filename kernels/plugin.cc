#include "kernels/plugin.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps {
namespace {

// $PS_CUDA_PLUGIN, else libps_cuda.so in the program's folder.
std::string PluginPath() {
  if (const char* env = std::getenv("PS_CUDA_PLUGIN"); env != nullptr && *env != '\0') return env;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
  dir = dir.substr(0, dir.find_last_of('/') + 1);
  return dir + "libps_cuda.so";
}

}  // namespace

absl::StatusOr<void*> CudaPluginSymbol(const char* name) {
  static std::once_flag once;
  static void* handle = nullptr;
  static std::string error;
  std::call_once(once, [] {
    const std::string path = PluginPath();
    if (access(path.c_str(), F_OK) != 0) {
      error = absl::StrCat("this build has no CUDA backend (no ", path, "; nvcc was not found at configure time)");
      return;
    }
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) error = absl::StrCat("cannot load the CUDA backend: ", dlerror());
  });
  if (handle == nullptr) return absl::FailedPreconditionError(error);
  void* sym = dlsym(handle, name);
  if (sym == nullptr) return absl::FailedPreconditionError(absl::StrCat("the CUDA backend lacks ", name));
  return sym;
}

}  // namespace ps
