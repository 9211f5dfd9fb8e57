#include "runtime/dry_run.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace torch_tpu {
namespace {
std::atomic<bool> dry_run_flag{false};
}  // namespace

bool dry_run() { return dry_run_flag.load(std::memory_order_relaxed); }
void set_dry_run(bool enabled) { dry_run_flag.store(enabled); }

void dry_run_host_read(const std::string& what) {
  TORCH_CHECK(false, "tpu dry run: ", what,
              " needs tensor values, but a dry run computes none (ops are only shaped, "
              "allocated and priced); leave torch_tpu.estimate.dry_run() to read values");
}

}  // namespace torch_tpu
