// Cost model: what an op would take on a real TPU generation.
//
// Each op is described by its FLOPs (torch.utils.flop_counter conventions:
// 2·M·K·N for a product), its HBM traffic in physical bytes, and for matrix
// products the GEMM dimensions M, K, N. Time is the roofline
//   max(mxu or vpu time, HBM bytes / bandwidth) + a per-launch overhead,
// the bandwidth being the generation's HBM bandwidth times its measured
// sustained fraction (ChipSpec::hbm_sustained_fraction, 1 where none is published),
// where the MXU runs at peak · efficiency · the generation's measured sustained
// fraction (ChipSpec::mxu_sustained_fraction, 1 where none is published),
// efficiency being the fraction of the array doing useful work once M, K and N
// are padded up to the MXU size.
// Output: estimated device seconds, never mixed with measured host seconds.
#pragma once

#include <cstdint>

#include "vtpu/spec.h"

namespace vtpu {

// A fixed cost per op launch on the device (pipeline fill, DMA setup): a
// modelling assumption, not a published figure.
constexpr double kLaunchOverheadSeconds = 2e-6;
// The VPU is an (8 sublanes x 128 lanes) SIMD array with 4 ALUs per lane
// ("How to Scale Your Model", ch. "All About TPUs", jax-ml.github.io/scaling-book).
constexpr double kVpuOpsPerCycle = 8 * 128 * 4;

struct OpCost {
  double flops = 0;             // useful floating-point operations
  double bytes_read = 0;        // HBM bytes read (physical, tiled layout)
  double bytes_written = 0;     // HBM bytes written (physical)
  bool mxu = false;             // a matrix product (runs on the MXU)
  int64_t m = 0, k = 0, n = 0;  // GEMM dimensions of a product (per batch item)
  int passes = 1;               // bf16 MXU passes per product: fp32 highest 6, high 3, medium/bf16 1
  bool emulated = false;        // float64/complex: no TPU units; priced as fp32 at 6 passes
};

struct CostBreakdown {
  double mxu_seconds = 0;
  double vpu_seconds = 0;
  double hbm_seconds = 0;
  double overhead_seconds = 0;
  double total_seconds = 0;  // max(mxu + vpu, hbm) + overhead
};

// Fraction of MXU work that is useful after padding M, K, N to `mxu_size`.
// K = 64 on a 128-wide MXU (M, N multiples of 128) gives 0.5.
double mxu_efficiency(int64_t m, int64_t k, int64_t n, int mxu_size);
// MXU clock implied by the peak: peak = 2 FLOP x MXU cells x MXUs x cores x clock.
double mxu_clock_hz(const ChipSpec& spec);
// Peak VPU operations per second of a chip: clock x kVpuOpsPerCycle x TensorCores.
double vpu_flops(const ChipSpec& spec);
CostBreakdown estimate(const ChipSpec& spec, const OpCost& cost);
// The same op's time split so that the parts add up to total_seconds: an op
// whose MXU + VPU time reaches its HBM time counts its mxu and vpu seconds,
// otherwise (HBM-bound) its hbm seconds; the launch overhead apart.
CostBreakdown bound_split(const CostBreakdown& b);

}  // namespace vtpu
