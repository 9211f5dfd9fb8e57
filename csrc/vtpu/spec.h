// Cloud TPU generation table: the hardware numbers the vTPU models.
// No torch headers here (docs/design.md: csrc/vtpu builds without PyTorch).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vtpu {

// One TPU generation. Units: FLOP/s, bytes, bytes/s. Every value in spec.cc
// carries the public page it was read from.
struct ChipSpec {
  std::string generation;   // "v4", "v5e", "v5p", "v6e", "tpu7x"
  std::string device_name;  // what torch.tpu.get_device_name() returns: "TPU v6e"
  double peak_bf16_flops;   // dense bf16 FLOP/s per chip
  uint64_t hbm_bytes;       // HBM capacity per chip
  double hbm_bandwidth;     // HBM bytes/s per chip
  uint64_t vmem_bytes;      // vector memory per TensorCore
  int mxu_size;             // MXU is mxu_size x mxu_size (128 or 256)
  int mxus_per_tensorcore;
  int tensorcores_per_chip;
  int ici_links;                 // ICI ports per chip
  double ici_link_bandwidth;     // bytes/s per link, one direction
  int torus_dims;                // 2 (v5e, v6e) or 3 (v4, v5p, tpu7x)
  int chips_per_host;            // chips attached to one host VM in a multi-host slice
  bool names_count_tensorcores;  // "v5p-8" = 8 TensorCores = 4 chips
  int pod_chips;                 // chips in a full pod: the largest slice
  // Fraction of the peak a large bf16 matrix product sustains, measured: a matrix
  // product runs at peak x mxu_efficiency() x this. 1 where no public measurement
  // exists (the peak is then the assumption).
  double mxu_sustained_fraction = 1.0;
  // Fraction of hbm_bandwidth a large copy sustains, measured (read + write bytes);
  // 1 where no public measurement exists.
  double hbm_sustained_fraction = 1.0;
};

// Throws std::invalid_argument listing the valid generations.
const ChipSpec& spec_for(std::string_view generation);
const std::vector<ChipSpec>& all_specs();

}  // namespace vtpu
