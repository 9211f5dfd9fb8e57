// Eager execution modes (docs/design.md "Execution"):
//   strict          every op is queued on the chip's stream (default);
//   debug           every op runs synchronously, index ops check bounds,
//                   optional NaN/Inf checks, errors raised at the op;
//   defer_and_fuse  fusible ops are recorded and run as fused regions.
// The global mode comes from set_eager_mode() or the environment
// (TORCH_TPU_LAUNCH_BLOCKING=1 -> debug, TORCH_TPU_DEFER_AND_FUSE=1 ->
// defer_and_fuse); a thread-local override (the Python context manager) wins.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace torch_tpu {

enum class EagerMode { kStrict = 0, kDebug = 1, kDeferAndFuse = 2 };

EagerMode eager_mode();  // effective mode of the calling thread
EagerMode global_eager_mode();
void set_global_eager_mode(EagerMode mode);
std::optional<EagerMode> thread_eager_mode();
void set_thread_eager_mode(std::optional<EagerMode> mode);

// "strict" | "debug" | "defer_and_fuse"; parse raises ValueError listing them.
const char* eager_mode_name(EagerMode mode);
EagerMode parse_eager_mode(const std::string& name);

// TORCH_TPU_CHECK_FINITE=1 (read once), or set from Python.
bool check_finite();
void set_check_finite(bool enabled);

// "file.py:123" of the innermost user frame of the calling thread, or "".
// Installed by the Python bindings (the ATen layer knows nothing of Python).
void set_source_line_provider(std::function<std::string()> provider);
std::string source_line();

}  // namespace torch_tpu
