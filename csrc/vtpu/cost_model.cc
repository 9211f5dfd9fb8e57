#include "vtpu/cost_model.h"

#include <algorithm>

namespace vtpu {
namespace {

double padded(int64_t x, int64_t multiple) { return static_cast<double>((x + multiple - 1) / multiple * multiple); }

}  // namespace

double mxu_efficiency(int64_t m, int64_t k, int64_t n, int mxu_size) {
  if (m <= 0 || k <= 0 || n <= 0) return 1.0;
  return (static_cast<double>(m) / padded(m, mxu_size)) * (static_cast<double>(k) / padded(k, mxu_size)) *
         (static_cast<double>(n) / padded(n, mxu_size));
}

double mxu_clock_hz(const ChipSpec& spec) {
  const double cells = static_cast<double>(spec.mxu_size) * spec.mxu_size;
  return spec.peak_bf16_flops / (2.0 * cells * spec.mxus_per_tensorcore * spec.tensorcores_per_chip);
}

double vpu_flops(const ChipSpec& spec) { return mxu_clock_hz(spec) * kVpuOpsPerCycle * spec.tensorcores_per_chip; }

CostBreakdown estimate(const ChipSpec& spec, const OpCost& cost) {
  CostBreakdown out;
  if (cost.mxu) {
    const double efficiency = mxu_efficiency(cost.m, cost.k, cost.n, spec.mxu_size);
    const int passes = cost.emulated ? 6 : std::max(1, cost.passes);
    out.mxu_seconds = cost.flops * passes / (spec.peak_bf16_flops * efficiency * spec.mxu_sustained_fraction);
  } else {
    out.vpu_seconds = cost.flops * (cost.emulated ? 6 : 1) / vpu_flops(spec);
  }
  out.hbm_seconds = (cost.bytes_read + cost.bytes_written) / (spec.hbm_bandwidth * spec.hbm_sustained_fraction);
  out.overhead_seconds = kLaunchOverheadSeconds;
  out.total_seconds = std::max(out.mxu_seconds + out.vpu_seconds, out.hbm_seconds) + out.overhead_seconds;
  return out;
}

CostBreakdown bound_split(const CostBreakdown& b) {
  CostBreakdown out;
  if (b.mxu_seconds + b.vpu_seconds >= b.hbm_seconds) {
    out.mxu_seconds = b.mxu_seconds;
    out.vpu_seconds = b.vpu_seconds;
  } else {
    out.hbm_seconds = b.hbm_seconds;
  }
  out.overhead_seconds = b.overhead_seconds;
  out.total_seconds = b.total_seconds;
  return out;
}

}  // namespace vtpu
