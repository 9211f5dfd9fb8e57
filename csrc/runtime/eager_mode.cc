#include "runtime/eager_mode.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "runtime/dry_run.h"
#include "vtpu/env.h"

namespace torch_tpu {
namespace {

EagerMode initial_mode() {
  if (vtpu::env_flag("TORCH_TPU_LAUNCH_BLOCKING", false)) return EagerMode::kDebug;
  if (vtpu::env_flag("TORCH_TPU_DEFER_AND_FUSE", false)) return EagerMode::kDeferAndFuse;
  return EagerMode::kStrict;
}

std::atomic<int>& global_mode() {
  static std::atomic<int> mode{static_cast<int>(initial_mode())};
  return mode;
}

thread_local int tls_mode = -1;  // -1: no override

std::atomic<bool>& finite_flag() {
  static std::atomic<bool> flag{vtpu::env_flag("TORCH_TPU_CHECK_FINITE", false)};
  return flag;
}

std::function<std::string()>& provider() {
  static std::function<std::string()> p;
  return p;
}

}  // namespace

// A dry run prices ops as the mode issues them: one by one (strict; debug's checks need values,
// so it runs as strict) or as defer_and_fuse's fused regions.
EagerMode eager_mode() {
  const EagerMode m = tls_mode >= 0 ? static_cast<EagerMode>(tls_mode) : global_eager_mode();
  if (dry_run()) return m == EagerMode::kDeferAndFuse ? m : EagerMode::kStrict;
  return tls_mode >= 0 ? static_cast<EagerMode>(tls_mode) : global_eager_mode();
}
EagerMode global_eager_mode() { return static_cast<EagerMode>(global_mode().load(std::memory_order_relaxed)); }
void set_global_eager_mode(EagerMode mode) { global_mode().store(static_cast<int>(mode)); }
std::optional<EagerMode> thread_eager_mode() {
  return tls_mode >= 0 ? std::optional<EagerMode>(static_cast<EagerMode>(tls_mode)) : std::nullopt;
}
void set_thread_eager_mode(std::optional<EagerMode> mode) { tls_mode = mode ? static_cast<int>(*mode) : -1; }

const char* eager_mode_name(EagerMode mode) {
  switch (mode) {
    case EagerMode::kStrict:
      return "strict";
    case EagerMode::kDebug:
      return "debug";
    case EagerMode::kDeferAndFuse:
      return "defer_and_fuse";
  }
  return "strict";
}

EagerMode parse_eager_mode(const std::string& name) {
  if (name == "strict") return EagerMode::kStrict;
  if (name == "debug") return EagerMode::kDebug;
  if (name == "defer_and_fuse") return EagerMode::kDeferAndFuse;
  TORCH_CHECK_VALUE(false, "unknown eager mode '", name, "'; valid modes: strict, debug, defer_and_fuse");
}

bool check_finite() { return finite_flag().load(std::memory_order_relaxed); }
void set_check_finite(bool enabled) { finite_flag().store(enabled); }

void set_source_line_provider(std::function<std::string()> p) { provider() = std::move(p); }
std::string source_line() { return provider() ? provider()() : std::string(); }

}  // namespace torch_tpu
