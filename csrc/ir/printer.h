// StableHLO text of a graph: one func.func whose arguments are the
// parameters and whose results are the outputs. erf, which StableHLO leaves to
// CHLO, prints as chlo.erf; a reduce prints its init as a rank-0 constant.
#pragma once

#include <string>

#include "ir/graph.h"

namespace torch_tpu::ir {

std::string to_stablehlo(const Graph& g, const std::string& function_name = "region");
// "tensor<4x8xf32>", "tensor<f32>"
std::string mlir_tensor_type(const TensorType& t);

}  // namespace torch_tpu::ir
