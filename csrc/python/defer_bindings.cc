// torch_tpu._C bindings of defer_and_fuse: region counters and flush.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "defer/defer.h"
#include "defer/lower.h"
#include "exec/compile_cache.h"
#include "runtime/errors.h"

namespace py = pybind11;

namespace torch_tpu {

void register_defer_bindings(py::module_& m) {
  m.def("_defer_region_stats", [] {
    DeferStats s = defer_stats();
    auto cache = exec::CompileCache::global().stats();
    py::dict d;
    d["ops_recorded"] = s.ops_recorded;
    d["ops_fused"] = s.ops_fused;
    d["ops_pending"] = defer_pending_ops();
    d["regions_flushed"] = s.regions_flushed;
    d["regions_run"] = s.regions_run;
    d["regions_compiled"] = s.regions_compiled;
    d["cache_hits"] = s.cache_hits;
    d["cache_entries"] = cache.entries;
    d["kernels_launched"] = s.kernels_launched;
    d["regions_split"] = s.regions_split;
    d["regions_in_parts"] = s.regions_in_parts;
    d["regions_replayed"] = s.regions_replayed;
    d["single_op_regions"] = s.single_op_regions;
    d["outputs_materialized"] = s.outputs_materialized;
    d["outputs_dead"] = s.outputs_dead;
    d["hbm_bytes_avoided"] = s.hbm_bytes_avoided;
    d["hbm_bytes_allocated"] = s.hbm_bytes_allocated;
    d["fallbacks"] = s.fallbacks;
    d["rng_vectorized"] = defer::bernoulli_mask_is_vectorized();
    py::dict why;
    why["conflict"] = s.flush_conflict;
    why["sync"] = s.flush_sync;
    why["stream"] = s.flush_stream;
    why["size_cap"] = s.flush_size_cap;
    why["view"] = s.flush_view;
    why["repeat"] = s.flush_repeat;
    why["other"] = s.flush_other;
    d["flush_reasons"] = why;
    return d;
  });
  m.def("_defer_reset_region_stats", [] { defer_reset_stats(); });
  m.def("_defer_flush", [] { translate_errors([] { defer_flush_all(); }); });
  m.def("_defer_pending_ops", [] { return defer_pending_ops(); });
  m.def("_defer_set_single_op_aten", [](bool enabled) { defer_set_single_op_aten(enabled); });
  m.def("_defer_single_op_aten", [] { return defer_single_op_aten(); });
  m.def("_defer_fusible_ops", [] { return defer::fusible_op_labels(); });
}

}  // namespace torch_tpu
