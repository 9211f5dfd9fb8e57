// Bindings torch.tpu.pallas uses: kernel prices from Python and donated inputs.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <memory>
#include <string>
#include <vector>

#include "aten/op_cost.h"
#include "runtime/allocator.h"

namespace py = pybind11;

namespace torch_tpu {

void register_pallas_bindings(py::module_& m) {
  // fn(args: tuple, results: list[Tensor]) -> dict | None, called when an op named `op`
  // is issued. The dict's keys: flops, bytes_read, bytes_written (physical HBM bytes),
  // and for a matrix product mxu=True with m, k, n. None (or an exception, which is
  // swallowed: a price must not fail an op) prices the op as any other.
  m.def("_set_custom_op_cost", [](const std::string& op, py::object fn) {
    if (fn.is_none()) {
      set_custom_op_cost(op, {});
      return;
    }
    // Dropped under the GIL: entries are removed from Python (at the latest at exit, by
    // torch.tpu.pallas's atexit hook), never by static destructors after finalization.
    std::shared_ptr<py::object> held(new py::object(std::move(fn)), [](py::object* o) {
      py::gil_scoped_acquire gil;
      delete o;
    });
    set_custom_op_cost(op, [held](c10::ArrayRef<c10::IValue> args, const std::vector<at::Tensor>& results,
                                  vtpu::OpCost* cost) {
      py::gil_scoped_acquire gil;
      try {
        py::tuple py_args(args.size());
        for (size_t i = 0; i < args.size(); ++i) py_args[i] = torch::jit::toPyObject(args[i]);
        py::list py_results;
        for (const auto& r : results) py_results.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(r)));
        py::object out = (*held)(py_args, py_results);
        if (out.is_none()) return false;
        py::dict d = out.cast<py::dict>();
        auto get = [&](const char* key, double fallback) { return d.contains(key) ? d[key].cast<double>() : fallback; };
        cost->flops = get("flops", 0);
        cost->bytes_read = get("bytes_read", 0);
        cost->bytes_written = get("bytes_written", 0);
        cost->mxu = d.contains("mxu") && d["mxu"].cast<bool>();
        cost->m = static_cast<int64_t>(get("m", 0));
        cost->k = static_cast<int64_t>(get("k", 0));
        cost->n = static_cast<int64_t>(get("n", 0));
        return true;
      } catch (py::error_already_set& e) {
        e.restore();
        PyErr_Clear();
        return false;
      }
    });
  });
  m.def("_mark_donated", [](const at::Tensor& t, const std::string& op) { mark_donated(t, op); });
}

}  // namespace torch_tpu
