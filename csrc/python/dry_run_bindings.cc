// torch_tpu._C bindings of the dry-run mode (csrc/runtime/dry_run.h) and of the
// collective cost formulas it prices parallelism with (csrc/distributed).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "distributed/collectives.h"
#include "runtime/device.h"
#include "runtime/dry_run.h"
#include "runtime/errors.h"
#include "vtpu/runtime.h"

namespace py = pybind11;

namespace torch_tpu {

void register_dry_run_bindings(py::module_& m) {
  m.def("_dry_run", [] { return dry_run(); });
  m.def("_set_dry_run", [](bool enabled) { set_dry_run(enabled); });
  // tpu_dist's ring formulas for `n` ranks: {"ici_bytes", "ici_steps"} this rank sends.
  m.def("_ring_cost", [](const std::string& op, int n, double payload_bytes) {
    dist::OpKind kind;
    if (op == "all_reduce")
      kind = dist::OpKind::kAllReduce;
    else if (op == "all_gather")
      kind = dist::OpKind::kAllGather;
    else if (op == "reduce_scatter")
      kind = dist::OpKind::kReduceScatter;
    else if (op == "broadcast")
      kind = dist::OpKind::kBroadcast;
    else
      throw py::value_error("_ring_cost: unknown collective '" + op +
                            "'; valid: all_reduce, all_gather, reduce_scatter, broadcast");
    auto c = dist::ring_cost(kind, n, payload_bytes);
    py::dict d;
    d["ici_bytes"] = c.ici_bytes;
    d["ici_steps"] = c.ici_steps;
    return d;
  });
  // Adds one collective to a chip's counters, as tpu_dist does when one runs.
  m.def("_record_collective",
        [](int index, double payload_bytes, double ici_bytes, int ici_links, int ici_steps, double dcn_bytes) {
          translate_errors([&] {
            vtpu::CollectiveCost c;
            c.payload_bytes = payload_bytes;
            c.ici_bytes = ici_bytes;
            c.ici_links = ici_links;
            c.ici_steps = ici_steps;
            c.dcn_bytes = dcn_bytes;
            chip(resolve_index(static_cast<c10::DeviceIndex>(index))).record_collective(c);
          });
        });
  // Seconds of one collective on a generation (vtpu::collective_seconds).
  m.def("_collective_seconds",
        [](const std::string& generation, double ici_bytes, int ici_links, int ici_steps, double dcn_bytes) {
          return translate_errors([&] {
            vtpu::CollectiveCost c;
            c.ici_bytes = ici_bytes;
            c.ici_links = ici_links;
            c.ici_steps = ici_steps;
            c.dcn_bytes = dcn_bytes;
            return vtpu::collective_seconds(vtpu::spec_for(generation), c);
          });
        });
}

}  // namespace torch_tpu
