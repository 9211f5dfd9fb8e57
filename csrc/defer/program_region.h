// The IR region of a torch.compile(backend="tpu") program
// (torch_tpu/compile/builder.py): built op by op from FX nodes through
// defer_and_fuse's ATen lowerings (lower.h), printed as StableHLO, compiled
// through the process-wide CompileCache and queued on the chip's stream over
// tpu tensors (region_launch.h). The bindings (python/compile_bindings.cc)
// turn Python objects into the plain values taken here.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "defer/lower.h"
#include "defer/region_launch.h"
#include "ir/builder.h"

namespace torch_tpu {

// One argument of an FX node, as the bindings found it.
struct NodeArg {
  enum class Kind {
    kAbsent,  // not passed: the schema's default, if it has one
    kNone,    // None
    kValue,   // a value of the region
    kNumber,  // a Python number where ATen takes a Tensor: a wrapped number, as eager passes it
    kIValue,  // anything else, converted for the argument's type
  } kind = Kind::kAbsent;
  ir::ValueId value = -1;  // kValue
  c10::Scalar number;      // kNumber
  c10::IValue ivalue;      // kIValue
};

// An ATen operator that a program region can lower: it has a lowering, one
// result and no argument it writes (programs are functional graphs).
struct LowerableOp {
  const c10::FunctionSchema* schema = nullptr;
  defer::LowerFn lower = nullptr;
};

// A result type of an FX node: (dtype, shape).
using NodeType = std::pair<c10::ScalarType, ir::Shape>;

class ProgramRegion {
 public:
  ProgramRegion() = default;
  // A finished region over `graph` (read back from the disk cache); verifies it.
  explicit ProgramRegion(ir::Graph graph);

  // Raise std::invalid_argument for a dtype the IR has no element type for.
  ir::ValueId parameter(c10::ScalarType dtype, std::vector<int64_t> shape);
  // A splat of `value` in dtype (ATen's conversion: ints truncate, bool = value != 0).
  ir::ValueId constant(double value, c10::ScalarType dtype, std::vector<int64_t> shape);

  // The op `name` (schema name, "aten::add") overload `overload` ("Tensor";
  // "" or "default" for the default one), or nullopt when it is not lowerable.
  std::optional<LowerableOp> find_op(const std::string& name, const std::string& overload) const;
  // Lowers `op` over `args` (one per schema argument) into results of
  // `out_types`. Returns the result values, or nullopt when the op (with these
  // arguments) has no lowering; nothing it built is then used.
  std::optional<std::vector<ir::ValueId>> lower(const LowerableOp& op, const std::vector<NodeArg>& args,
                                                const std::vector<NodeType>& out_types);

  // Ends building: `outputs` leave the region, in order.
  void finish(const std::vector<ir::ValueId>& outputs);
  const ir::Graph& graph() const;  // once finished
  std::string stablehlo(const std::string& fn_name) const;
  uint64_t structural_hash() const;

  // Compiles (CompileCache) the region; its per-row statistics become extra
  // outputs kept in scratch. Returns whether anything was compiled.
  bool compile();
  // Queues the region on `device`'s current stream over `inputs` (parameter
  // order); returns its outputs, new contiguous tensors on the device.
  // strides: per output, the strides eager PyTorch gives it (FX metadata), or
  // empty for row-major; views taken later (permute, then view) rely on them.
  // into: per output, an existing dense tpu tensor of the output's dtype and
  // shape on `device` that receives it in place (a program's updated parameter
  // or optimizer state; it may also be an input when every element of the
  // output depends only on the same element of that input), or undefined for a
  // new tensor. Raises std::invalid_argument when a given tensor does not fit.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, c10::DeviceIndex device, const std::string& name,
                              const std::vector<std::vector<int64_t>>& strides,
                              const std::vector<std::optional<at::Tensor>>& into = {});

  int64_t num_kernels() const { return launch_.region ? launch_.region->num_kernels() : 0; }
  int64_t num_ops() const { return built_ ? graph_.num_ops() : builder_.graph().num_ops(); }
  int64_t num_parameters() const {
    return static_cast<int64_t>(built_ ? graph_.parameters().size() : builder_.graph().parameters().size());
  }
  std::string describe() const { return launch_.region ? launch_.region->describe() : std::string(); }
  std::string plan() const { return launch_.region ? launch_.region->plan().to_string(launch_.region->graph()) : ""; }
  bool split() const { return launch_.split(); }
  int64_t chunks() const { return launch_.chunks; }  // row chunks on the intra-op threads (1: whole)
  // outputs computed per chunk as partial reductions and combined (RegionLaunch::partial_outputs)
  std::vector<int> partial_outputs() const { return launch_.partial_outputs; }

 private:
  void require_building() const;
  void require_built() const;

  ir::Builder builder_;
  ir::Graph graph_;
  bool built_ = false;
  size_t num_outputs_ = 0;
  RegionLaunch launch_;
};

}  // namespace torch_tpu
