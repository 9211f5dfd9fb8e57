// The generation table. Sources, by page:
//   [v4]    https://cloud.google.com/tpu/docs/v4        (system architecture)
//   [v5e]   https://cloud.google.com/tpu/docs/v5e
//   [v5p]   https://cloud.google.com/tpu/docs/v5p
//   [v6e]   https://cloud.google.com/tpu/docs/v6e
//   [7x]    https://cloud.google.com/tpu/docs/tpu7x     (also compares v5p, v6e)
//   [jax]   jax/_src/pallas/mosaic/tpu_info.py (JAX's per-TensorCore hardware
//           table; the Cloud pages do not list VMEM)
//   [maxtext] MaxText accelerator_to_spec_map.py: host block of every slice
//   [amb]   github.com/AI-Hypercomputer/accelerator-microbenchmarks,
//           Ironwood/Ironwood_Microbenchmarks_readme.md at 900dce3 (2025-11-19),
//           "GEMM Results": gemm_multiple_run, bf16, m=n=k, TFLOP/s per device
//           (a TPU7x chip is two JAX devices, one per TensorCore);
//           Ironwood/guides/hbm/hbm.md at 8fd8a3e (2025-12-06), "Expected bandwidth
//           for different matrix size": HBM copy, read + write bytes, GB/s per chip
//   [v4paper] Jouppi et al., "TPU v4: An Optically Reconfigurable
//           Supercomputer...", ISCA 2023 (arXiv 2304.01433)
// Per-link ICI bandwidth is the per-chip bidirectional figure divided by the
// number of links and by 2 directions.
#include "vtpu/spec.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace vtpu {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

std::vector<ChipSpec> build_table() {
  std::vector<ChipSpec> t;

  ChipSpec v4;
  v4.generation = "v4";
  v4.device_name = "TPU v4";
  v4.peak_bf16_flops = 275e12;        // [v4] "275 teraflops (bf16 or int8)"
  v4.hbm_bytes = 32 * kGiB;           // [v4] "HBM2 capacity ... 32 GiB"
  v4.hbm_bandwidth = 1200e9;          // [v4] "1200 GBps"
  v4.vmem_bytes = 16 * kMiB;          // [jax] TPU v4: 16 MiB per core
  v4.mxu_size = 128;                  // [jax] mxu_column_size 128 before v6
  v4.mxus_per_tensorcore = 4;         // [v4] "Each TensorCore has four MXUs"
  v4.tensorcores_per_chip = 2;        // [v4] "contains two TensorCores"
  v4.ici_links = 6;                   // [v4] "direct connection to the nearest
                                      // neighboring chips in 3 dimensions": 6
  v4.ici_link_bandwidth = 50e9;       // [v4paper] 50 GB/s per link, each way
  v4.torus_dims = 3;                  // [v4] "3D mesh ... 3D torus"
  v4.chips_per_host = 4;              // [maxtext] host bounds 2x2x1
  v4.names_count_tensorcores = true;  // [v4] "v4-128 ... 128 TensorCores"
  v4.pod_chips = 4096;                // [v4] "TPU Pod size 4096 chips"
  t.push_back(v4);

  ChipSpec v5e;
  v5e.generation = "v5e";
  v5e.device_name = "TPU v5e";
  v5e.peak_bf16_flops = 197e12;         // [v5e] "197 TFLOPs"
  v5e.hbm_bytes = 16 * kGiB;            // [v5e] "16 GB" (16 GiB as devices report)
  v5e.hbm_bandwidth = 819e9;            // [v5e] "819 GBps"
  v5e.vmem_bytes = 128 * kMiB;          // [jax] TPU v5e: 128 MiB per core
  v5e.mxu_size = 128;                   // [jax] mxu_column_size 128 before v6
  v5e.mxus_per_tensorcore = 4;          // [v5e] "four matrix-multiply units"
  v5e.tensorcores_per_chip = 1;         // [v5e] "Each v5e chip contains one TensorCore"
  v5e.ici_links = 4;                    // [v5e] "ICI ports per chip 4"
  v5e.ici_link_bandwidth = 50e9;        // [v5e] 400 GBps bidirectional / 4 / 2
  v5e.torus_dims = 2;                   // [v5e] "2D torus"
  v5e.chips_per_host = 4;               // [maxtext] multi-host bounds 2x2x1
  v5e.names_count_tensorcores = false;  // [v5e] "v$VERSION-$CHIP_COUNT"
  v5e.pod_chips = 256;                  // [v5e] "TPU Pod size 256 chips"
  t.push_back(v5e);

  ChipSpec v5p;
  v5p.generation = "v5p";
  v5p.device_name = "TPU v5p";
  v5p.peak_bf16_flops = 459e12;        // [v5p] "459 TFLOPs"
  v5p.hbm_bytes = 95 * kGiB;           // [v5p] "HBM capacity per chip (GiB) 95"
  v5p.hbm_bandwidth = 2765e9;          // [v5p] "2765 GBps"
  v5p.vmem_bytes = 64 * kMiB;          // [jax] TPU v5p: 64 MiB per core
  v5p.mxu_size = 128;                  // [jax] mxu_column_size 128 before v6
  v5p.mxus_per_tensorcore = 4;         // [v5p] "four Matrix Multiply Units"
  v5p.tensorcores_per_chip = 2;        // [v5p] "TensorCores per chip 2"
  v5p.ici_links = 6;                   // [v5p] 3D torus: one link per direction
  v5p.ici_link_bandwidth = 100e9;      // [v5p] 1200 GBps bidirectional / 6 / 2
  v5p.torus_dims = 3;                  // [v5p] "3D torus"
  v5p.chips_per_host = 4;              // [v5p] 2x2x1 = 4 chips, 1 host
  v5p.names_count_tensorcores = true;  // [v5p] "2x2x1 | 8 cores | 4 chips"
  v5p.pod_chips = 8960;                // [v5p] "8960 chips in a v5p Pod"
  t.push_back(v5p);

  ChipSpec v6e;
  v6e.generation = "v6e";
  v6e.device_name = "TPU v6e";
  v6e.peak_bf16_flops = 918e12;         // [v6e] "918 TFLOPs"
  v6e.hbm_bytes = 32 * kGiB;            // [v6e] "32 GB"; [7x] "(GiB) 32"
  v6e.hbm_bandwidth = 1638e9;           // [v6e] "1638 GBps" (earlier: 1640)
  v6e.vmem_bytes = 128 * kMiB;          // [jax] TPU v6e: 128 MiB per core
  v6e.mxu_size = 256;                   // [v6e] "two 256x256 ... (MXU)"
  v6e.mxus_per_tensorcore = 2;          // [v6e] "two 256x256 ... (MXU)"
  v6e.tensorcores_per_chip = 1;         // [v6e] "Each v6e chip contains one TensorCore"
  v6e.ici_links = 4;                    // [v6e] "ICI ports per chip 4"
  v6e.ici_link_bandwidth = 100e9;       // [v6e] 800 GBps bidirectional / 4 / 2
  v6e.torus_dims = 2;                   // [v6e] "2D torus"
  v6e.chips_per_host = 4;               // [maxtext] multi-host bounds 2x2x1
  v6e.names_count_tensorcores = false;  // v6e-8 = 8 chips, as v5e
  v6e.pod_chips = 256;                  // [v6e] "TPU Pod size 256 chips"
  t.push_back(v6e);

  ChipSpec tpu7x;
  tpu7x.generation = "tpu7x";
  tpu7x.device_name = "TPU7x";
  tpu7x.peak_bf16_flops = 2307e12;       // [7x] "(BF16) (TFLOPs) 2307" (FP8: 4614)
  tpu7x.hbm_bytes = 192 * kGiB;          // [7x] "HBM capacity per chip (GiB) 192"
  tpu7x.hbm_bandwidth = 7380e9;          // [7x] "HBM bandwidth per chip (GBps) 7380"
  tpu7x.vmem_bytes = 64 * kMiB;          // [jax] TPU7x: 64 MiB per core
  tpu7x.mxu_size = 256;                  // [jax] TPU7x mxu_column_size 256
  tpu7x.mxus_per_tensorcore = 4;         // not published; assumed: 2307 TFLOP/s over
                                         // 2 cores of 256x256 MXUs fits 4 at ~2.2 GHz
  tpu7x.tensorcores_per_chip = 2;        // [7x] "two TensorCores and four SparseCores"
  tpu7x.ici_links = 6;                   // assumed as v5p: [7x] says TPU7x "shares
                                         // many similarities with TPU v5p" (3D torus)
  tpu7x.ici_link_bandwidth = 100e9;      // [7x] 1200 GBps bidirectional / 6 / 2
  tpu7x.torus_dims = 3;                  // 3D torus of 4x4x4 cubes, as v5p
  tpu7x.chips_per_host = 4;              // [7x] "Number of vCPUs (4-chip VM)"
  tpu7x.names_count_tensorcores = true;  // tpu7x-8 is one 4-chip VM (2x2x1)
  tpu7x.pod_chips = 9216;                // [7x] "Number of chips per pod 9216"
  // [amb] m=n=k=32768: 956.3824592 TFLOP/s per device, of the device's half of
  // the chip's 2307 TFLOP/s: 0.829 (16384: 950.13, 0.824; 4096: 892.94, 0.774).
  tpu7x.mxu_sustained_fraction = 956.3824592e12 / (tpu7x.peak_bf16_flops / tpu7x.tensorcores_per_chip);
  // [amb] HBM copy of 8 GiB: 6420.961823 GB/s per chip of the 7380: 0.870 (at 128 MiB and
  // above within 1.5 % of it; 2 MiB: 2758.67).
  tpu7x.hbm_sustained_fraction = 6420.961823e9 / tpu7x.hbm_bandwidth;
  t.push_back(tpu7x);

  return t;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const std::vector<ChipSpec>& all_specs() {
  static const std::vector<ChipSpec> table = build_table();
  return table;
}

const ChipSpec& spec_for(std::string_view generation) {
  std::string key = lower(generation);
  // Real v5e VMs report TPU_ACCELERATOR_TYPE=v5litepod-N.
  if (key == "v5litepod") key = "v5e";
  for (const ChipSpec& spec : all_specs()) {
    if (spec.generation == key) return spec;
  }
  throw std::invalid_argument("unknown TPU generation '" + std::string(generation) +
                              "'; valid: v4, v5e, v5p, v6e, tpu7x");
}

}  // namespace vtpu
