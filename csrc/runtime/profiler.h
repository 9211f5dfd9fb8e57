// torch.profiler support: records the chip's work while a profiler with
// ProfilerActivity.PrivateUse1 runs, and hands it to Kineto as device
// activities (profiler.cc registers a libkineto::IActivityProfiler through
// PyTorch's PrivateUse1 profiler registry).
//
// Each priced op becomes one device event: its chip, the Kineto correlation id
// of the host op that issued it, the record_function ranges around it, its
// measured run on the stream worker and its cost (vtpu::OpCost). In the trace
// its duration is the cost model's *estimated* time on the chosen generation.
#pragma once

#include <cstdint>
#include <string>

namespace torch_tpu::profiler {

// The generation whose estimated time the device tracks show: "v4", "v5e",
// "v5p", "v6e", "tpu7x". Empty resets to the topology's generation.
// Raises ValueError (std::invalid_argument) listing the valid names.
void set_generation(const std::string& generation);
// The generation in effect: set_generation's, else TORCH_TPU_PROFILER_GENERATION's,
// else the topology's. Throws std::invalid_argument for a bad environment value.
std::string generation();
// What set_generation() last stored ("" when unset).
std::string generation_setting();

struct RecorderStats {
  bool recording = false;  // hooks installed (a profiler with PrivateUse1 runs)
  uint64_t ops = 0;        // device events of the current or last session
  uint64_t collectives = 0;
  uint64_t hbm_samples = 0;
  uint64_t ranges = 0;   // record_function ranges entered
  uint64_t session = 0;  // sessions started so far
};
RecorderStats recorder_stats();

}  // namespace torch_tpu::profiler
