// torch_tpu._C bindings of tpu_dist (csrc/distributed): the backend class the
// Python creator returns to torch.distributed, and diagnostics.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/arguments.h"
#include "distributed/backend.h"
#include "distributed/collectives.h"
#include "distributed/shm.h"
#include "runtime/device.h"
#include "runtime/errors.h"
#include "vtpu/runtime.h"

namespace py = pybind11;

namespace torch_tpu {

void register_distributed_bindings(py::module_& m) {
  using dist::TpuBackend;
  // The base class must be registered (by torch's c10d module) before ours.
  py::module_::import("torch._C._distributed_c10d");
  py::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "_TpuDistBackend")
      .def_property_readonly("timeout_seconds",
                             [](const TpuBackend& b) { return std::chrono::duration<double>(b.timeout()).count(); })
      .def_property_readonly("buffer_bytes", [](const TpuBackend& b) { return b.config().buffer_bytes; })
      .def_property_readonly("group_name", [](const TpuBackend& b) { return b.config().group_name; })
      .def_property_readonly("hosts", [](const TpuBackend& b) { return b.config().hosts; });

  m.def(
      "_tpu_dist_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_seconds,
         const std::string& group_name, const std::vector<int64_t>& global_ranks, const std::vector<int>& hosts,
         std::optional<c10::intrusive_ptr<c10d::Backend>> cross,
         std::optional<c10::intrusive_ptr<c10d::Backend>> flat) {
        TpuBackend::Config config;
        config.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
        config.group_name = group_name;
        config.global_ranks = global_ranks;
        config.hosts = hosts;
        if (cross) config.cross = *cross;
        if (flat) config.flat = *flat;
        return c10::make_intrusive<TpuBackend>(store, rank, size, std::move(config));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_seconds"), py::arg("group_name"),
      py::arg("global_ranks"), py::arg("hosts") = std::vector<int>(), py::arg("cross") = py::none(),
      py::arg("flat") = py::none(), py::call_guard<py::gil_scoped_release>());

  // torch.tpu.distributed.spmd_safe: the calling thread's check; returns the previous setting.
  m.def("_tpu_dist_set_spmd_check", [](bool enabled) { return dist::set_spmd_check(enabled); });
  m.def("_tpu_dist_spmd_check", [] { return dist::spmd_check(); });
  m.def("_tpu_dist_segments", [] { return dist::list_segments(); });
  m.def("_tpu_dist_remove_stale_segments", [] { return dist::remove_stale_segments(); });
  m.def("_tpu_dist_ring_order", [](const std::vector<int>& chips) {
    return translate_errors([&] { return dist::ring_order(chips, runtime().topology()); });
  });
  m.def("_tpu_dist_ring_links", [](const std::vector<int>& chips) {
    return translate_errors([&] { return dist::ring_links(chips, runtime().topology()); });
  });
  m.def("_tpu_dist_host_chips",
        [](int host) { return translate_errors([&] { return runtime().topology().chips_of_host(host); }); });
  m.def("_tpu_dist_chip_coords", [](int chip_id) {
    return translate_errors([&] {
      const auto c = runtime().topology().coords(chip_id);
      return py::make_tuple(c[0], c[1], c[2]);
    });
  });
  m.def("_collective_stats", [](int index) {
    return translate_errors([&] {
      auto s = chip(resolve_index(static_cast<c10::DeviceIndex>(index))).counters();
      py::dict d;
      d["collectives"] = s.collectives;
      d["collective_bytes"] = s.collective_bytes;
      d["ici_bytes"] = s.ici_bytes;
      d["ici_seconds"] = s.ici_seconds;
      py::dict by_gen;
      const auto& specs = vtpu::all_specs();
      for (size_t g = 0; g < specs.size() && g < s.ici_seconds_by_generation.size(); ++g) {
        by_gen[py::str(specs[g].generation)] = s.ici_seconds_by_generation[g];
      }
      d["ici_seconds_by_generation"] = by_gen;
      d["dcn_bytes"] = s.dcn_bytes;
      d["dcn_seconds"] = s.dcn_seconds;
      return d;
    });
  });
}

}  // namespace torch_tpu
