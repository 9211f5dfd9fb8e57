// torch_tpu._C._compile: the bindings of torch.compile(backend="tpu") program
// regions (defer/program_region.h), used by torch_tpu/compile/builder.py.
// Converts FX arguments and the disk cache's plain op records to and from the
// region's C++ values.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "defer/program_region.h"
#include "defer/region_launch.h"
#include "exec/compile_cache.h"
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

// Argument i of `schema` from an FX node's args / kwargs.
NodeArg node_arg(const c10::Argument& arg, size_t i, const py::sequence& args, const py::dict& kwargs) {
  py::object obj;
  if (i < py::len(args) && !arg.kwarg_only()) {
    obj = args[i];
  } else if (kwargs.contains(arg.name())) {
    obj = kwargs[py::str(arg.name())];
  }
  NodeArg a;
  if (obj && py::isinstance<ValueRef>(obj)) {
    a.kind = NodeArg::Kind::kValue;
    a.value = obj.cast<ValueRef>().id;
  } else if (arg.real_type()->kind() == c10::TypeKind::TensorType &&
             (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj))) {
    a.kind = NodeArg::Kind::kNumber;
    a.number = py::isinstance<py::bool_>(obj)  ? c10::Scalar(obj.cast<bool>())
               : py::isinstance<py::int_>(obj) ? c10::Scalar(obj.cast<int64_t>())
                                               : c10::Scalar(obj.cast<double>());
  } else if (!obj) {
    a.kind = NodeArg::Kind::kAbsent;
  } else if (obj.is_none()) {
    a.kind = NodeArg::Kind::kNone;
  } else {
    a.kind = NodeArg::Kind::kIValue;
    a.ivalue = torch::jit::toIValue(obj, arg.real_type());
  }
  return a;
}

// Lowers the ATen op `name` overload `overload` with FX arguments args /
// kwargs, whose tensor arguments are ValueRefs. out_types: (dtype, shape) per
// result. None when the op (with these arguments) has no lowering.
std::optional<std::vector<ValueId>> lower(ProgramRegion& r, const std::string& name, const std::string& overload,
                                          py::sequence args, py::dict kwargs, py::list out_types) {
  std::optional<LowerableOp> op = r.find_op(name, overload);
  if (!op) return std::nullopt;
  std::vector<NodeArg> node_args;
  try {
    for (size_t i = 0; i < op->schema->arguments().size(); ++i)
      node_args.push_back(node_arg(op->schema->arguments()[i], i, args, kwargs));
  } catch (const std::exception&) {
    return std::nullopt;  // an argument our conversion does not take: a library call
  }
  std::vector<NodeType> types;
  for (py::handle t : out_types) {
    py::tuple tt = t.cast<py::tuple>();
    types.emplace_back(scalar_type_of(tt[0]), tt[1].cast<std::vector<int64_t>>());
  }
  return r.lower(*op, node_args, types);
}

// Plain-data form for the disk cache: per op (kind, operands, dtype, shape,
// attrs), then the outputs.
py::tuple records(const ProgramRegion& r) {
  const ir::Graph& g = r.graph();
  py::list ops;
  for (const ir::Op& op : g.ops()) {
    const ir::Attributes& a = op.attrs;
    ops.append(py::make_tuple(static_cast<int>(op.kind), op.operands, static_cast<int>(op.type.dtype), op.type.shape,
                              py::make_tuple(a.parameter_index, a.value.f, a.value.i, static_cast<int>(a.direction),
                                             a.dimensions, static_cast<int>(a.reduce_kind), a.init.f, a.init.i)));
  }
  return py::make_tuple(ops, g.outputs());
}

std::unique_ptr<ProgramRegion> from_records(py::tuple rec) {
  return translate_errors([&] {
    ir::Graph g;
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
      g.add_op(static_cast<ir::OpKind>(kind), t[1].cast<std::vector<ValueId>>(),
               ir::TensorType{static_cast<ir::ElementType>(dtype), t[3].cast<ir::Shape>()}, attrs);
    }
    g.set_outputs(rec[1].cast<std::vector<ValueId>>());
    return std::make_unique<ProgramRegion>(std::move(g));
  });
}

}  // namespace

void register_compile_bindings(py::module_& parent) {
  py::module_ m = parent.def_submodule("_compile", "IR regions of torch.compile(backend='tpu') programs");
  py::class_<ValueRef>(m, "Value")
      .def(py::init([](int id) { return ValueRef{id}; }))
      .def_property_readonly("id", [](const ValueRef& v) { return v.id; })
      .def("__repr__", [](const ValueRef& v) { return "%" + std::to_string(v.id); });
  py::class_<ProgramRegion>(m, "Region")
      .def(py::init<>())
      .def(
          "parameter",
          [](ProgramRegion& r, py::handle dtype, std::vector<int64_t> shape) {
            return r.parameter(scalar_type_of(dtype), std::move(shape));
          },
          py::arg("dtype"), py::arg("shape"))
      .def("lower", &lower, py::arg("name"), py::arg("overload"), py::arg("args"), py::arg("kwargs"),
           py::arg("out_types"))
      .def(
          "constant",
          [](ProgramRegion& r, double value, py::handle dtype, std::vector<int64_t> shape) {
            return r.constant(value, scalar_type_of(dtype), std::move(shape));
          },
          py::arg("value"), py::arg("dtype"), py::arg("shape"))
      .def("finish", &ProgramRegion::finish)
      .def("stablehlo", &ProgramRegion::stablehlo, py::arg("name") = "region")
      .def("structural_hash", &ProgramRegion::structural_hash)
      .def("records", &records)
      .def_static("from_records", &from_records)
      .def("compile", &ProgramRegion::compile, py::call_guard<py::gil_scoped_release>())
      .def(
          "run",
          [](ProgramRegion& r, const std::vector<at::Tensor>& inputs, int device, const std::string& name,
             const std::vector<std::vector<int64_t>>& strides, const std::vector<std::optional<at::Tensor>>& into) {
            return r.run(inputs, static_cast<c10::DeviceIndex>(device), name, strides, into);
          },
          py::arg("inputs"), py::arg("device"), py::arg("name"),
          py::arg("strides") = std::vector<std::vector<int64_t>>{},
          py::arg("into") = std::vector<std::optional<at::Tensor>>{})
      .def_property_readonly("num_kernels", &ProgramRegion::num_kernels)
      .def_property_readonly("chunks", &ProgramRegion::chunks)
      .def_property_readonly("partial_outputs", &ProgramRegion::partial_outputs)
      .def_property_readonly("num_ops", &ProgramRegion::num_ops)
      .def_property_readonly("num_parameters", &ProgramRegion::num_parameters)
      .def_property_readonly("split", &ProgramRegion::split)
      .def("describe", &ProgramRegion::describe)
      .def("plan", &ProgramRegion::plan);
  m.def(
      "copy_many",
      [](const std::vector<at::Tensor>& dsts, const std::vector<at::Tensor>& srcs, int device) {
        translate_errors([&] { enqueue_copies(static_cast<c10::DeviceIndex>(device), dsts, srcs); });
      },
      py::arg("dsts"), py::arg("srcs"), py::arg("device"),
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
