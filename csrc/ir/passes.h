// Graph -> Graph rewrites, each named and testable alone, and a pipeline
// that runs them in order with an optional dump hook after each one.
// Every pass keeps the signature: all parameters (in order, even unused
// ones) and the outputs (in order).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace torch_tpu::ir {

// Removes ops whose values reach no output.
Graph dead_code_elimination(const Graph& g);
// Merges ops with the same kind, operands, attributes and result type
// (constants with the same splat value included); users are rewired to the
// first one. The duplicates are left dead for dead_code_elimination.
Graph common_subexpression_elimination(const Graph& g);

struct Pass {
  std::string name;
  std::function<Graph(const Graph&)> run;
};
// Called after each pass with its name and result (e.g. to print
// to_stablehlo()).
using DumpHook = std::function<void(const std::string& pass, const Graph& after)>;

// cse then dce: what compile() runs before fusion planning.
std::vector<Pass> default_passes();
Graph run_passes(const Graph& g, const std::vector<Pass>& passes, const DumpHook& dump = {});

}  // namespace torch_tpu::ir
