// torch_tpu._C._compile: the IR side of torch.compile(backend="tpu") programs
// (torch_tpu/compile/graph_compiler.py). A Region is built op by op from FX
// nodes through defer_and_fuse's ATen lowerings (defer/lower.cc), printed as
// StableHLO, serialized as plain op records for the disk cache, compiled
// through the process-wide CompileCache and queued on the chip's stream over
// tpu tensors (region_launch.h).
#include <ATen/ScalarOps.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/ScalarType.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "defer/lower.h"
#include "defer/region_launch.h"
#include "exec/compile_cache.h"
#include "ir/builder.h"
#include "ir/hash.h"
#include "ir/printer.h"
#include "runtime/errors.h"

namespace py = pybind11;

namespace torch_tpu {
namespace {

using ir::ValueId;

// A tensor argument of an op being lowered: the IR value that holds it.
struct ValueRef {
  ValueId id;
};

c10::ScalarType scalar_type_of(py::handle dtype) {
  if (!THPDtype_Check(dtype.ptr())) throw py::type_error("expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
}

ir::ElementType element_type_of(c10::ScalarType st) {
  auto e = defer::ir_type(st);
  if (!e) throw py::value_error(std::string("dtype ") + c10::toString(st) + " has no IR element type");
  return *e;
}

c10::ScalarType scalar_type_of(ir::ElementType t) {
  using ir::ElementType;
  switch (t) {
    case ElementType::f32: return c10::kFloat;
    case ElementType::bf16: return c10::kBFloat16;
    case ElementType::f16: return c10::kHalf;
    case ElementType::f64: return c10::kDouble;
    case ElementType::s64: return c10::kLong;
    case ElementType::s32: return c10::kInt;
    case ElementType::s8: return c10::kChar;
    case ElementType::u8: return c10::kByte;
    case ElementType::pred: return c10::kBool;
  }
  return c10::kFloat;
}

class Region {
 public:
  ValueId parameter(py::handle dtype, std::vector<int64_t> shape) {
    require_building();
    return builder_.parameter(element_type_of(scalar_type_of(dtype)), std::move(shape));
  }

  // Lowers the ATen op `name` (schema name, "aten::add") overload `overload`
  // ("Tensor", "" for the default one) with FX arguments args / kwargs, whose
  // tensor arguments are ValueRefs. out_types: (dtype, shape) per result.
  // Returns the result values, or None when the op (with these arguments) has
  // no lowering; nothing it built is then used.
  std::optional<std::vector<ValueId>> lower(const std::string& name, const std::string& overload,
                                            py::sequence args, py::dict kwargs, py::list out_types) {
    require_building();
    const std::string label = overload.empty() || overload == "default" ? name : name + "." + overload;
    defer::LowerFn fn = defer::find_lowering(label);
    if (!fn) return std::nullopt;
    auto handle = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
    if (!handle) return std::nullopt;
    const c10::FunctionSchema& schema = handle->schema();
    if (schema.returns().size() != 1) return std::nullopt;
    for (const auto& a : schema.arguments()) {
      if (a.alias_info() && a.alias_info()->isWrite()) return std::nullopt;  // functional graphs only
    }
    const size_t n = schema.arguments().size();
    std::vector<c10::IValue> ivalues(n);
    std::vector<defer::Operand> operands(n);
    try {
      for (size_t i = 0; i < n; ++i) {
        const c10::Argument& arg = schema.arguments()[i];
        py::object obj;
        if (i < py::len(args) && !arg.kwarg_only()) {
          obj = args[i];
        } else if (kwargs.contains(arg.name())) {
          obj = kwargs[py::str(arg.name())];
        }
        defer::Operand& o = operands[i];
        if (obj && py::isinstance<ValueRef>(obj)) {
          const ValueId v = obj.cast<ValueRef>().id;
          const ir::TensorType& t = builder_.type(v);
          ivalues[i] = at::empty(t.shape, at::TensorOptions().dtype(scalar_type_of(t.dtype)).device(c10::kMeta));
          o.kind = defer::Operand::Kind::kTensor;
          o.value = v;
          o.tensor = ivalues[i].toTensor();
        } else if (arg.real_type()->kind() == c10::TypeKind::TensorType &&
                   (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj))) {
          // A Python number where ATen takes a Tensor: a wrapped number, as eager passes it.
          const c10::Scalar sc = py::isinstance<py::bool_>(obj) ? c10::Scalar(obj.cast<bool>())
                                 : py::isinstance<py::int_>(obj) ? c10::Scalar(obj.cast<int64_t>())
                                                                 : c10::Scalar(obj.cast<double>());
          at::Tensor w = c10::scalar_to_tensor(sc);
          w.unsafeGetTensorImpl()->set_wrapped_number(true);
          ivalues[i] = w;
          o.kind = defer::Operand::Kind::kScalar;
          o.tensor = w;
          o.scalar = sc;
        } else if (!obj || obj.is_none()) {
          if (!obj && arg.default_value()) ivalues[i] = *arg.default_value();
        } else {
          ivalues[i] = torch::jit::toIValue(obj, arg.real_type());
        }
        o.ivalue = &ivalues[i];
        const c10::IValue& v = ivalues[i];
        if (o.kind == defer::Operand::Kind::kScalar) continue;
        if (o.kind == defer::Operand::Kind::kOther && (v.isDouble() || v.isInt() || v.isBool())) {
          o.kind = defer::Operand::Kind::kScalar;
          o.scalar = v.toScalar();
        } else if (v.isTensorList() || v.isComplexDouble()) {
          return std::nullopt;
        }
      }
    } catch (const std::exception&) {
      return std::nullopt;  // an argument our conversion does not take: a library call
    }
    std::vector<ir::TensorType> outs;
    std::vector<c10::ScalarType> out_dtypes;
    for (py::handle t : out_types) {
      py::tuple tt = t.cast<py::tuple>();
      const c10::ScalarType st = scalar_type_of(tt[0]);
      auto et = defer::ir_type(st);
      if (!et) return std::nullopt;
      ir::Shape shape = tt[1].cast<std::vector<int64_t>>();
      if (ir::numel(shape) == 0) return std::nullopt;
      outs.push_back(ir::TensorType{*et, shape});
      out_dtypes.push_back(st);
    }
    if (outs.size() != 1) return std::nullopt;
    const int64_t before = builder_.graph().num_ops();
    defer::Lowering L(builder_, operands, outs, out_dtypes, nullptr);
    try {
      fn(L);
    } catch (const defer::NotFusible&) {
      return std::nullopt;
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (L.results.size() != outs.size()) return std::nullopt;
    ops_lowered_ += builder_.graph().num_ops() > before ? 1 : 0;
    return L.results;
  }

  // A splat of `value` in dtype (ATen's conversion: ints truncate, bool = value != 0).
  ValueId constant(double value, py::handle dtype, std::vector<int64_t> shape) {
    require_building();
    const ir::ElementType t = element_type_of(scalar_type_of(dtype));
    ValueId c = ir::is_float(t)  ? builder_.constant(ir::round_to_type(value, t), t)
                : ir::is_pred(t) ? builder_.constant_int(value != 0 ? 1 : 0, t)
                                 : builder_.constant_int(ir::wrap_to_type(static_cast<int64_t>(value), t), t);
    return shape.empty() ? c : builder_.broadcast_in_dim(c, std::move(shape), {});
  }

  // Ends building: `outputs` leave the region, in order.
  void finish(const std::vector<ValueId>& outputs) {
    require_building();
    for (ValueId v : outputs) builder_.output(v);
    graph_ = builder_.build();
    translate_errors([&] { graph_.verify(); });
    built_ = true;
  }

  std::string stablehlo(const std::string& fn_name) const {
    require_built();
    return ir::to_stablehlo(graph_, fn_name);
  }

  uint64_t structural_hash() const {
    require_built();
    return ir::structural_hash(graph_);
  }

  // Plain-data form for the disk cache: per op (kind, operands, dtype, shape,
  // attrs), then the outputs.
  py::tuple records() const {
    require_built();
    py::list ops;
    for (const ir::Op& op : graph_.ops()) {
      const ir::Attributes& a = op.attrs;
      ops.append(py::make_tuple(static_cast<int>(op.kind), op.operands, static_cast<int>(op.type.dtype), op.type.shape,
                                py::make_tuple(a.parameter_index, a.value.f, a.value.i, static_cast<int>(a.direction),
                                               a.dimensions, static_cast<int>(a.reduce_kind), a.init.f, a.init.i)));
    }
    return py::make_tuple(ops, graph_.outputs());
  }

  static std::unique_ptr<Region> from_records(py::tuple rec) {
    auto r = std::make_unique<Region>();
    translate_errors([&] {
      for (py::handle h : rec[0].cast<py::list>()) {
        py::tuple t = h.cast<py::tuple>();
        const int kind = t[0].cast<int>(), dtype = t[2].cast<int>();
        if (kind < 0 || kind >= ir::kNumOpKinds || dtype < 0 || dtype >= ir::kNumElementTypes)
          throw std::invalid_argument("region record: bad op kind or element type");
        py::tuple at = t[4].cast<py::tuple>();
        ir::Attributes attrs;
        attrs.parameter_index = at[0].cast<int64_t>();
        attrs.value.f = at[1].cast<double>();
        attrs.value.i = at[2].cast<int64_t>();
        attrs.direction = static_cast<ir::CompareDirection>(at[3].cast<int>());
        attrs.dimensions = at[4].cast<std::vector<int64_t>>();
        attrs.reduce_kind = static_cast<ir::ReduceKind>(at[5].cast<int>());
        attrs.init.f = at[6].cast<double>();
        attrs.init.i = at[7].cast<int64_t>();
        r->graph_.add_op(static_cast<ir::OpKind>(kind), t[1].cast<std::vector<ValueId>>(),
                         ir::TensorType{static_cast<ir::ElementType>(dtype), t[3].cast<ir::Shape>()}, attrs);
      }
      r->graph_.set_outputs(rec[1].cast<std::vector<ValueId>>());
      r->graph_.verify();
    });
    r->built_ = true;
    return r;
  }

  // Compiles (CompileCache) the region; its per-row statistics become extra
  // outputs kept in scratch. Returns whether anything was compiled.
  bool compile() {
    require_built();
    ir::Graph g = graph_;
    num_outputs_ = g.outputs().size();
    std::vector<ValueId> outs = g.outputs();
    for (ValueId v : row_statistics(g)) outs.push_back(v);
    g.set_outputs(outs);
    bool miss = false;
    translate_errors([&] { launch_ = plan_region_launch(g, &miss); });
    return miss;
  }

  // Queues the region on `device`'s current stream over `inputs` (parameter
  // order); returns its outputs, new contiguous tensors on the device.
  // strides: per output, the strides eager PyTorch gives it (FX metadata), or
  // empty for row-major; views taken later (permute, then view) rely on them.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, int device, const std::string& name,
                              const std::vector<std::vector<int64_t>>& strides) {
    if (!launch_.region) throw std::runtime_error("region not compiled");
    const auto d = static_cast<c10::DeviceIndex>(device);
    std::vector<at::Tensor> outputs;
    outputs.reserve(num_outputs_);
    for (size_t j = 0; j < num_outputs_; ++j) {
      const ir::TensorType& t = launch_.output_types[j];
      auto opts = at::TensorOptions().dtype(scalar_type_of(t.dtype)).device(c10::Device(c10::DeviceType::PrivateUse1, d));
      if (j < strides.size() && !strides[j].empty()) {
        outputs.push_back(at::empty_strided(t.shape, strides[j], opts));
      } else {
        outputs.push_back(at::empty(t.shape, opts));
      }
    }
    translate_errors([&] { enqueue_region(launch_, d, inputs, outputs, name); });
    return outputs;
  }

  int64_t num_kernels() const { return launch_.region ? launch_.region->num_kernels() : 0; }
  int64_t num_ops() const { return built_ ? graph_.num_ops() : builder_.graph().num_ops(); }
  int64_t num_parameters() const {
    return static_cast<int64_t>(built_ ? graph_.parameters().size() : builder_.graph().parameters().size());
  }
  std::string describe() const { return launch_.region ? launch_.region->describe() : std::string(); }
  std::string plan() const { return launch_.region ? launch_.region->plan().to_string(launch_.region->graph()) : ""; }
  bool split() const { return launch_.split(); }

 private:
  void require_building() const {
    if (built_) throw std::runtime_error("region already finished");
  }
  void require_built() const {
    if (!built_) throw std::runtime_error("region not finished");
  }

  ir::Builder builder_;
  ir::Graph graph_;
  bool built_ = false;
  int64_t ops_lowered_ = 0;
  size_t num_outputs_ = 0;
  RegionLaunch launch_;
};

}  // namespace

void register_compile_bindings(py::module_& parent) {
  py::module_ m = parent.def_submodule("_compile", "IR regions of torch.compile(backend='tpu') programs");
  py::class_<ValueRef>(m, "Value")
      .def(py::init([](int id) { return ValueRef{id}; }))
      .def_property_readonly("id", [](const ValueRef& v) { return v.id; })
      .def("__repr__", [](const ValueRef& v) { return "%" + std::to_string(v.id); });
  py::class_<Region>(m, "Region")
      .def(py::init<>())
      .def("parameter", &Region::parameter, py::arg("dtype"), py::arg("shape"))
      .def("lower", &Region::lower, py::arg("name"), py::arg("overload"), py::arg("args"), py::arg("kwargs"),
           py::arg("out_types"))
      .def("constant", &Region::constant, py::arg("value"), py::arg("dtype"), py::arg("shape"))
      .def("finish", &Region::finish)
      .def("stablehlo", &Region::stablehlo, py::arg("name") = "region")
      .def("structural_hash", &Region::structural_hash)
      .def("records", &Region::records)
      .def_static("from_records", &Region::from_records)
      .def("compile", &Region::compile, py::call_guard<py::gil_scoped_release>())
      .def("run", &Region::run, py::arg("inputs"), py::arg("device"), py::arg("name"),
           py::arg("strides") = std::vector<std::vector<int64_t>>{})
      .def_property_readonly("num_kernels", &Region::num_kernels)
      .def_property_readonly("num_ops", &Region::num_ops)
      .def_property_readonly("num_parameters", &Region::num_parameters)
      .def_property_readonly("split", &Region::split)
      .def("describe", &Region::describe)
      .def("plan", &Region::plan);
  m.def("copy_many", [](const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, int device) {
    translate_errors([&] { enqueue_copies(static_cast<c10::DeviceIndex>(device), dsts, srcs); });
  }, py::arg("dsts"), py::arg("srcs"), py::arg("device"),
  "dsts[i].copy_(srcs[i]) for each pair, dense same-layout pairs as one queued item on the chip's stream");
  m.def("ir_signature", [] {
    std::string s;
    for (int k = 0; k < ir::kNumOpKinds; ++k) s += std::string(ir::op_name(static_cast<ir::OpKind>(k))) + ",";
    return s;
  });
  m.def("compile_cache_stats", [] {
    auto s = exec::CompileCache::global().stats();
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["entries"] = s.entries;
    return d;
  });
}

}  // namespace torch_tpu
