// torch_tpu._C: Python bindings of the runtime, nothing else.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <thread>
#include <unordered_map>

#include "aten/fallback_internal.h"
#include "aten/host_matmul.h"
#include "aten/matmul_precision.h"
#include "aten/meta_cache.h"
#include "aten/portability.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/eager_mode.h"
#include "runtime/errors.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "vtpu/layout.h"
#include "vtpu/runtime.h"

namespace py = pybind11;

namespace torch_tpu {
void register_hooks();                                     // hooks.cc
void register_distributed_bindings(pybind11::module_& m);  // distributed_bindings.cc
void register_defer_bindings(pybind11::module_& m);        // defer_bindings.cc
void register_pallas_bindings(pybind11::module_& m);       // pallas_bindings.cc
void register_profiler_bindings(pybind11::module_& m);     // profiler_bindings.cc
void register_compile_bindings(pybind11::module_& m);      // compile_bindings.cc
void register_dry_run_bindings(pybind11::module_& m);      // dry_run_bindings.cc
}  // namespace torch_tpu

namespace {

using namespace torch_tpu;

py::dict spec_dict(const vtpu::ChipSpec& s) {
  py::dict d;
  d["generation"] = s.generation;
  d["device_name"] = s.device_name;
  d["peak_bf16_flops"] = s.peak_bf16_flops;
  d["hbm_bytes"] = s.hbm_bytes;
  d["hbm_bandwidth"] = s.hbm_bandwidth;
  d["vmem_bytes"] = s.vmem_bytes;
  d["mxu_size"] = s.mxu_size;
  d["mxus_per_tensorcore"] = s.mxus_per_tensorcore;
  d["tensorcores_per_chip"] = s.tensorcores_per_chip;
  d["ici_links"] = s.ici_links;
  d["ici_link_bandwidth"] = s.ici_link_bandwidth;
  d["torus_dims"] = s.torus_dims;
  d["chips_per_host"] = s.chips_per_host;
  d["mxu_sustained_fraction"] = s.mxu_sustained_fraction;
  d["hbm_sustained_fraction"] = s.hbm_sustained_fraction;
  return d;
}

py::dict memory_stats_dict(c10::DeviceIndex index) {
  auto s = chip(resolve_index(index)).hbm().stats();
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["allocated_bytes_peak"] = s.allocated_bytes_peak;
  d["logical_bytes"] = s.logical_bytes;
  d["logical_bytes_peak"] = s.logical_bytes_peak;
  d["reserved_bytes"] = s.reserved_bytes;
  d["reserved_bytes_peak"] = s.reserved_bytes_peak;
  d["capacity_bytes"] = s.capacity_bytes;
  d["largest_free_block"] = s.largest_free_block;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  d["active_blocks"] = s.active_blocks;
  d["segments"] = s.segments;
  d["num_alloc_retries"] = s.num_alloc_retries;
  d["num_ooms"] = s.num_ooms;
  return d;
}

// torch.cuda.host_memory_stats_as_nested_dict()'s layout, for the tpu host allocator.
py::dict host_memory_stats_dict(const at::HostStats& s) {
  auto stat = [](const c10::CachingAllocator::Stat& v) {
    py::dict d;
    d["current"] = v.current;
    d["peak"] = v.peak;
    d["allocated"] = v.allocated;
    d["freed"] = v.freed;
    return d;
  };
  auto duration = [](const c10::CachingAllocator::DurationStat& v) {
    py::dict d;
    d["total"] = v.total;
    d["max"] = v.max;
    d["min"] = v.min;
    d["count"] = v.count;
    d["avg"] = v.count == 0 ? 0 : v.total / v.count;
    return d;
  };
  py::dict d;
  d["allocations"] = stat(s.allocations);
  d["allocated_bytes"] = stat(s.allocated_bytes);
  d["active_requests"] = stat(s.active_requests);
  d["active_bytes"] = stat(s.active_bytes);
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  d["host_alloc_time"] = duration(s.host_alloc_time);
  d["host_free_time"] = duration(s.host_free_time);
  return d;
}

// "file.py:123" of the innermost frame outside torch and torch_tpu.
// Per code file name object (a reference held, so the address stays its own): whether it is torch's or
// torch_tpu's own code (skipped), and its text. Called for every op defer_and_fuse records, so the
// file names are converted once, not once a frame a call.
struct SourceFile {
  bool internal = false;
  std::string text;
};

const SourceFile& source_file(PyObject* name) {
  static auto* files = new std::unordered_map<PyObject*, SourceFile>();  // under the GIL
  auto it = files->find(name);
  if (it != files->end()) return it->second;
  if (files->size() >= 4096) {
    for (auto& kv : *files) Py_DECREF(kv.first);
    files->clear();
  }
  SourceFile f;
  f.text = py::str(name);
  f.internal = f.text.find("/torch/") != std::string::npos || f.text.find("/torch_tpu/") != std::string::npos;
  Py_INCREF(name);
  return files->emplace(name, std::move(f)).first->second;
}

std::string python_source_line() {
  if (!Py_IsInitialized()) return "";
  py::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  std::string found;
  while (frame != nullptr && found.empty()) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const SourceFile& file = source_file(code->co_filename);
    Py_DECREF(code);
    if (!file.internal) found = file.text + ":" + std::to_string(PyFrame_GetLineNumber(frame));
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return found;
}

// Waits for a chip with the GIL released (when this thread holds it).
void release_gil_while(const std::function<void()>& wait) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release release;
    wait();
  } else {
    wait();
  }
}

// c10 errors leaving these bindings become PyTorch's Python exception types,
// without C++ backtraces (PyTorch's own translators do not see this module).
void translate_c10_error(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError& e) {
    PyErr_SetString(py::module_::import("torch").attr("OutOfMemoryError").ptr(), e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  py::register_local_exception_translator(&translate_c10_error);
  set_blocking_runner(&release_gil_while);
  m.doc() = "torch_tpu runtime bindings";
  m.attr("_DEVICE_TYPE") = static_cast<int>(kTPU);
  register_distributed_bindings(m);
  register_defer_bindings(m);
  register_pallas_bindings(m);
  register_profiler_bindings(m);
  register_compile_bindings(m);
  register_dry_run_bindings(m);
  m.def("_init", [] {
    translate_errors([] {
      register_hooks();
      runtime();
    });
    set_source_line_provider(&python_source_line);
  });
  m.def("_get_eager_mode", [] { return std::string(eager_mode_name(global_eager_mode())); });
  m.def("_set_eager_mode", [](const std::string& name) { set_global_eager_mode(parse_eager_mode(name)); });
  m.def("_get_thread_eager_mode", []() -> py::object {
    auto mode = thread_eager_mode();
    return mode ? py::object(py::str(eager_mode_name(*mode))) : py::object(py::none());
  });
  m.def("_set_thread_eager_mode", [](std::optional<std::string> name) {
    set_thread_eager_mode(name ? std::optional<EagerMode>(parse_eager_mode(*name)) : std::nullopt);
  });
  m.def("_effective_eager_mode", [] { return std::string(eager_mode_name(eager_mode())); });
  // torch.tpu.precision: the tokens are the names themselves (str objects kept forever).
  set_matmul_precision_tokens({
      std::make_shared<c10::SafePyObject>(py::str("highest").release().ptr(), getPyInterpreter()),
      std::make_shared<c10::SafePyObject>(py::str("high").release().ptr(), getPyInterpreter()),
      std::make_shared<c10::SafePyObject>(py::str("medium").release().ptr(), getPyInterpreter()),
  });
  m.def("_matmul_precision_override", []() -> py::object {
    auto precision = matmul_precision_override();
    return precision ? py::object(py::str(matmul_precision_name(*precision))) : py::object(py::none());
  });
  m.def("_set_matmul_precision_override", [](std::optional<std::string> name) {
    set_matmul_precision_override(name ? std::optional(parse_matmul_precision(*name)) : std::nullopt);
  });
  m.def("_effective_matmul_precision", [] { return std::string(matmul_precision_name(effective_matmul_precision())); });
  m.def("_set_check_finite", [](bool enabled) { set_check_finite(enabled); });
  m.def("_check_finite", [] { return check_finite(); });
  m.def("_device_count", [] { return translate_errors([] { return static_cast<int>(device_count()); }); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int i) { translate_errors([&] { set_current_device(static_cast<c10::DeviceIndex>(i)); }); });
  m.def("_set_validate_first_call", [](bool on) { set_validate_first_calls(on); });
  m.def("_validate_first_call", [] { return validating_first_calls(); });
  m.def("_fast_kept_calls", [] { return fast_kept_calls(); });
  m.def("_widening_half_products", [] { return widening_half_products(); });
  m.def("_onednn_gemm", [] { return onednn_gemm_on_this_host(); });
  m.def("_meta_kernel_calls", [] { return meta_kernel_calls_on_this_thread(); });
  m.def("_set_onednn_gemm", [](bool on) { return translate_errors([&] { return set_onednn_gemm(on); }); });
  m.def(
      "_wait_all_chips_idle", [] { wait_all_chips_idle(); }, py::call_guard<py::gil_scoped_release>());
  // Through torch's warning buffer: the warnings of queued work it delivers reach Python's warnings.
  m.def("_synchronize", [](int i) {
    HANDLE_TH_ERRORS
    py::gil_scoped_release no_gil;
    synchronize_device(static_cast<c10::DeviceIndex>(i));
    END_HANDLE_TH_ERRORS_PYBIND
  });
  // At interpreter exit: the autograd engine's thread for a chip may still hold
  // the last reference to the last backward's graph task, whose thread-local
  // state holds Python objects; released during finalization, taking the GIL
  // makes Python call pthread_exit and the forced unwind aborts the process
  // ("terminate called without an active exception"). The engine thread runs
  // graph tasks one after another, so after two tiny backwards from a thread
  // that never touched Python (no Python objects in their state), earlier tasks
  // are released.
  m.def("_settle_autograd_threads", [](int devices) {
    py::gil_scoped_release no_gil;
    std::thread settle([devices] {
      try {
        for (int d = 0; d < devices; ++d) {
          auto options =
              at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
          for (int i = 0; i < 2; ++i) {
            auto leaf = torch::zeros({}, options.requires_grad(true));
            torch::autograd::backward({leaf.mul(1)});
          }
        }
      } catch (const std::exception&) {
        // best effort at exit
      }
    });
    settle.join();
  });
  m.def("_memory_stats", [](int i) { return translate_errors([&] { return memory_stats_dict(i); }); });
  m.def(
      "_empty_cache", [] { tpu_allocator().emptyCache(); }, py::call_guard<py::gil_scoped_release>());
  m.def("_host_memory_stats", [] { return host_memory_stats_dict(host_allocator().get_stats()); });
  m.def("_reset_peak_host_memory_stats", [] { host_allocator().reset_peak_stats(); });
  m.def("_reset_accumulated_host_memory_stats", [] { host_allocator().reset_accumulated_stats(); });
  m.def("_reset_peak_memory_stats", [](int i) { translate_errors([&] { tpu_allocator().resetPeakStats(i); }); });
  m.def("_rng_kind",
        [] { return translate_errors([] { return std::string(rng_kind() == RngKind::kCpu ? "cpu" : "philox"); }); });
  m.def("_default_generator", [](int i) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(translate_errors([&] { return default_generator(i); })));
  });
  m.def("_topology", [] {
    return translate_errors([] {
      const auto& t = runtime().topology();
      py::dict d;
      d["name"] = t.name();
      d["shape"] = py::make_tuple(t.shape()[0], t.shape()[1], t.shape()[2]);
      d["num_chips"] = t.num_chips();
      d["num_hosts"] = t.num_hosts();
      d["chips_per_host"] = t.chips_per_host();
      d["num_slices"] = t.num_slices();
      d["slice"] = runtime().slice();  // this process's
      d["host"] = runtime().host();    // TORCH_TPU_HOST_ID, counted over all slices
      d["wraps"] = py::make_tuple(t.wraps(0), t.wraps(1), t.wraps(2));
      d["spec"] = spec_dict(t.spec());
      return d;
    });
  });
  m.def("_chip_info", [](int i) {
    return translate_errors([&] {
      auto& c = chip(resolve_index(i));
      const auto& t = runtime().topology();
      py::dict d;
      d["index"] = c.index();
      d["global_id"] = c.global_id();
      auto xyz = c.coords();
      d["coords"] = py::make_tuple(xyz[0], xyz[1], xyz[2]);
      // Hosts count over all slices, as TORCH_TPU_HOST_ID does.
      d["host"] = runtime().slice() * t.num_hosts() + t.host_of(c.global_id());
      d["slice"] = runtime().slice();
      d["neighbours"] = t.neighbours(c.global_id());
      d["hbm_bytes"] = c.hbm().capacity();
      return d;
    });
  });
  m.def("_parse_topology", [](const std::string& name) {
    return translate_errors([&] {
      auto t = vtpu::Topology::parse(name);
      return py::make_tuple(t.name(), t.spec().generation, t.num_chips(),
                            py::make_tuple(t.shape()[0], t.shape()[1], t.shape()[2]));
    });
  });
  m.def("_generations", [] {
    py::list out;
    for (const auto& s : vtpu::all_specs()) out.append(spec_dict(s));
    return out;
  });
  m.def("_stats", [](int i) {
    return translate_errors([&] {
      auto s = chip(resolve_index(i)).counters();
      py::dict d;
      d["ops"] = s.ops;
      d["emulated_ops"] = s.emulated_ops;
      d["flops"] = s.flops;
      d["bytes_read"] = s.bytes_read;
      d["bytes_written"] = s.bytes_written;
      d["host_seconds"] = s.host_seconds;
      d["device_seconds"] = s.device.total_seconds;
      d["mxu_seconds"] = s.device.mxu_seconds;
      d["vpu_seconds"] = s.device.vpu_seconds;
      d["hbm_seconds"] = s.device.hbm_seconds;
      d["overhead_seconds"] = s.device.overhead_seconds;
      py::dict by_gen;
      const auto& specs = vtpu::all_specs();
      for (size_t g = 0; g < specs.size() && g < s.device_seconds_by_generation.size(); ++g) {
        by_gen[py::str(specs[g].generation)] = s.device_seconds_by_generation[g];
      }
      d["device_seconds_by_generation"] = by_gen;
      py::dict bound;  // by generation, split by the bounding unit (parts add up to the total)
      for (size_t g = 0; g < specs.size() && g < s.bound_by_generation.size(); ++g) {
        const auto& b = s.bound_by_generation[g];
        py::dict e;
        e["mxu"] = b.mxu_seconds;
        e["vpu"] = b.vpu_seconds;
        e["hbm"] = b.hbm_seconds;
        e["overhead"] = b.overhead_seconds;
        e["total"] = b.total_seconds;
        bound[py::str(specs[g].generation)] = e;
      }
      d["device_bound_by_generation"] = bound;
      d["generation"] = runtime().topology().spec().generation;
      return d;
    });
  });
  m.def("_reset_stats", [](int i) { translate_errors([&] { chip(resolve_index(i)).reset_counters(); }); });
  m.def("_unsupported_on_tpu", [] {
    py::dict out;
    for (const auto& [key, count] : unsupported_report()) {
      py::str op(key.first);
      if (!out.contains(op)) out[op] = py::dict();
      out[op][py::str(key.second)] = count;
    }
    return out;
  });
  m.def("_reset_unsupported_on_tpu", [] { reset_unsupported_report(); });
  m.def("_hops", [](int a, int b) { return translate_errors([&] { return runtime().topology().hops(a, b); }); });
  m.def("_physical_bytes",
        [](std::vector<int64_t> shape, int64_t element_size) { return vtpu::physical_bytes(shape, element_size); });
}
