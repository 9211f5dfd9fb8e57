// The argument checks and descriptions of tpu_dist's c10d entry points: the
// messages a caller sees for a bad call (tests assert them), and what a rank
// publishes about a collective at arrival.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "distributed/collectives.h"
#include "distributed/shm_group.h"
#include "distributed/transport.h"

namespace torch_tpu::dist {

// "float32[2, 3] on tpu:0"
std::string describe_tensor(const at::Tensor& t);
// "all_reduce (collective #3, float32[4] on tpu:0)"; `tensor` empty: "barrier (collective #3)".
std::string what_of(const char* op, uint64_t seq, const std::string& tensor);

// The one tensor of a per-process tensor list (one chip per rank).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* op);
// Defined, dense, on tpu or cpu. `role` names it: "tensor", "input", "output".
void check_tensor(const at::Tensor& t, const char* op, const char* role);
// Same dtype and device.
void check_same(const at::Tensor& a, const at::Tensor& b, const char* op, const char* what_a, const char* what_b);
// check_tensor of both, then check_same.
void check_pair(const at::Tensor& output, const at::Tensor& input, const char* op, const char* what_output,
                const char* what_input);
// The reduce op is defined for the dtype.
void check_redop(int redop, at::ScalarType dtype, const char* op);
void check_root(int64_t root, int size, const char* op);
// PREMUL_SUM's factor (1 for other ops); a tpu factor tensor is synchronized.
double premul_factor(const c10d::ReduceOp& op);

// What this rank publishes at arrival; `t` gives dtype, sizes and chip (undefined: none).
// Marked `spmd` when the calling thread is inside spmd_safe (set_spmd_check).
Descriptor describe(OpKind op, const at::Tensor& t, int redop, int64_t numel, int64_t root);
// The calling thread's spmd_safe check (torch.tpu.distributed.spmd_safe): while on, the
// collectives it issues are compared with the sizes of their tensors too, and across hosts
// (over DCN) as well as within a host. Returns the previous setting.
bool set_spmd_check(bool enabled);
bool spmd_check();
// The packing of an all_to_all that sends `send_bytes[q]` to and receives `recv_bytes[q]` from each peer q.
Splits splits_of(const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& recv_bytes);

}  // namespace torch_tpu::dist
