// tpu_dist's view of this process's chips, through the PrivateUse1 runtime glue:
// which chip a tensor is on, the current device and streams, and cost records.
// With host_view.h, the only place csrc/distributed reaches the runtime glue.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "distributed/shm_group.h"
#include "vtpu/counters.h"
#include "vtpu/stream.h"
#include "vtpu/topology.h"

namespace torch_tpu::dist {

const vtpu::Topology& topology();  // raises ValueError for a bad topology environment
bool is_tpu(const c10::Device& device);
// The tpu index of a tensor, -1 for host tensors.
int tpu_index(const at::Tensor& t);
// The distinct tpu indices of `tensors`, in first-seen order.
std::vector<int> tpu_indices(const std::vector<at::Tensor>& tensors);
// The current tpu device, -1 when this process has no chip.
int current_tpu();
// The tpu a barrier waits on: `device` when it is a tpu (its index, or the current one), else the current one.
int barrier_tpu(const std::optional<c10::Device>& device);
// Sets the chip (and host) of `d` to those of tpu `device`; no-op for -1.
void set_chip(Descriptor& d, int device);
// Records a collective's cost on the chip of tpu `device` (no-op for -1); `name`: a static
// string naming it in profiler traces, or null.
void record_cost(int device, const vtpu::CollectiveCost& cost, const char* name = nullptr);
// Events at the current point of the current streams of tpu `devices`.
std::vector<vtpu::Event> stream_points(const std::vector<int>& devices);
void make_current(int device);  // no-op for -1

}  // namespace torch_tpu::dist
