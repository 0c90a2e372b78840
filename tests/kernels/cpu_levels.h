// Runs a kernel check at every CPU level this machine has (kernels/cpu/cpu_isa.h),
// lowest (the scalar reference) first, each under a trace naming the level.
#pragma once

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"

namespace ps::testing {

template <typename Fn>
void AtEveryCpuLevel(Fn fn) {
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa level(isa);
    SCOPED_TRACE(CpuIsaName(isa));
    fn();
  }
}

}  // namespace ps::testing
