// torch_tpu._C bindings of the profiler (runtime/profiler.h): the generation the
// device tracks are estimated for, and the recorder's state.
#include <pybind11/pybind11.h>

#include "runtime/errors.h"
#include "runtime/profiler.h"

namespace py = pybind11;

namespace torch_tpu {

void register_profiler_bindings(py::module_& m) {
  m.def("_profiler_set_generation",
        [](const std::string& generation) { translate_errors([&] { profiler::set_generation(generation); }); });
  m.def("_profiler_generation", [] { return translate_errors([] { return profiler::generation(); }); });
  m.def("_profiler_generation_setting", [] { return profiler::generation_setting(); });
  m.def("_profiler_stats", [] {
    profiler::RecorderStats s = profiler::recorder_stats();
    py::dict d;
    d["recording"] = s.recording;
    d["ops"] = s.ops;
    d["collectives"] = s.collectives;
    d["hbm_samples"] = s.hbm_samples;
    d["ranges"] = s.ranges;
    d["session"] = s.session;
    return d;
  });
}

}  // namespace torch_tpu
