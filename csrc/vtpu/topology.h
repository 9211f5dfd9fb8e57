// Slice topology: chip coordinates, torus neighbours, hop distances, hosts.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "vtpu/spec.h"

namespace vtpu {

using Coord = std::array<int, 3>;  // (x, y, z); z == 0 on 2D tori

class Topology {
 public:
  // Accepts Cloud accelerator types ("v5e-8", "v5litepod-16", "v6e-4",
  // "v5p-16", "v4-8", "tpu7x-8"), bare shapes ("2x4" -> v6e, "2x2x2" -> v5p),
  // and "<generation>:<shape>" ("v5p:4x4x4"). Throws std::invalid_argument
  // whose message lists the valid forms and generations.
  static Topology parse(const std::string& name);

  // From TORCH_TPU_TOPOLOGY, else TPU_ACCELERATOR_TYPE, else "v6e-8"; the number of
  // slices from TORCH_TPU_SLICES (default 1).
  static Topology from_env();

  // Multislice: `slices` identical slices joined over the data-centre network (DCN).
  // Chip ids, coordinates, hops and rings stay those of one slice; hosts are numbered
  // slice by slice (host h is host h % num_hosts() of slice h / num_hosts()). Throws
  // std::invalid_argument unless slices >= 1.
  Topology with_slices(int slices) const;

  const std::string& name() const { return name_; }
  const ChipSpec& spec() const { return *spec_; }
  const Coord& shape() const { return shape_; }
  int num_chips() const { return shape_[0] * shape_[1] * shape_[2]; }
  int num_hosts() const { return num_chips() / chips_per_host(); }
  int chips_per_host() const;
  int num_slices() const { return num_slices_; }
  int total_hosts() const { return num_slices_ * num_hosts(); }  // hosts of all slices
  int total_chips() const { return num_slices_ * num_chips(); }  // chips of all slices
  // The slice of a host of any slice (0 .. total_hosts() - 1); throws std::out_of_range.
  int slice_of_host(int host) const;

  Coord coords(int chip) const;       // throws std::out_of_range
  int chip_at(const Coord& c) const;  // throws std::out_of_range
  // Whether links along axis wrap around (a torus ring, not a line).
  bool wraps(int axis) const { return wraps_[axis]; }
  // Distinct chips one ICI hop away, ascending ids.
  std::vector<int> neighbours(int chip) const;
  // Minimum ICI hops between two chips (shortest path on the torus/mesh).
  int hops(int a, int b) const;
  int host_of(int chip) const;
  std::vector<int> chips_of_host(int host) const;
  // Chips in ring order along `axis` through `chip` (a ring that follows links).
  std::vector<int> ring(int chip, int axis) const;

 private:
  std::string name_;
  const ChipSpec* spec_ = nullptr;
  Coord shape_{1, 1, 1};
  std::array<bool, 3> wraps_{false, false, false};
  Coord host_shape_{1, 1, 1};  // block of chips attached to one host
  int num_slices_ = 1;
};

}  // namespace vtpu
