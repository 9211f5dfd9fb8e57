// Slice topology. Shapes, wraparound and host blocks follow the Cloud TPU
// configuration pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e, tpu7x) and
// MaxText's accelerator_to_spec_map.py, which lists for every accelerator type
// its shape, the chips of one host (2x2x1) and which axes wrap.
#include "vtpu/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>

#include "vtpu/env.h"

namespace vtpu {
namespace {

const char* const kValidForms =
    "valid forms: a Cloud accelerator type '<generation>-<N>' "
    "(v5e-N, v5litepod-N, v6e-N: N chips, one of 1, 4, 8, 16, 32, 64, 128, 256; "
    "v4-N, v5p-N, tpu7x-N: N TensorCores, 2 per chip, e.g. v5p-8 = 4 chips), "
    "a shape ('2x4' -> v6e, '2x2x2' -> v5p), or '<generation>:<shape>' "
    "('v5p:4x4x4', 'v5e:4x8'); valid generations: v4, v5e, v5p, v6e, tpu7x";

[[noreturn]] void invalid(const std::string& name, const std::string& reason) {
  throw std::invalid_argument("invalid TPU topology '" + name + "': " + reason + "; " + kValidForms);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A positive decimal integer without sign or spaces; -1 if `s` is not one.
long parse_positive(const std::string& s) {
  if (s.empty() || s.size() > 9) return -1;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  long v = std::strtol(s.c_str(), nullptr, 10);
  return v > 0 ? v : -1;
}

// "2x4" -> {2, 4}; empty when malformed.
std::vector<int> parse_shape(const std::string& s) {
  std::vector<int> dims;
  size_t start = 0;
  while (true) {
    size_t x = s.find('x', start);
    long v = parse_positive(s.substr(start, x == std::string::npos ? x : x - start));
    if (v < 0) return {};
    dims.push_back(static_cast<int>(v));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return dims;
}

std::string shape_string(const Coord& s, int dims) {
  std::string out = std::to_string(s[0]) + "x" + std::to_string(s[1]);
  if (dims == 3) out += "x" + std::to_string(s[2]);
  return out;
}

// v5e / v6e slices: [v5e] and [v6e] "supported configurations" tables.
bool standard_2d_shape(int chips, Coord* shape) {
  static const std::map<int, Coord> kShapes = {{1, {1, 1, 1}},  {4, {2, 2, 1}},  {8, {2, 4, 1}},    {16, {4, 4, 1}},
                                               {32, {4, 8, 1}}, {64, {8, 8, 1}}, {128, {8, 16, 1}}, {256, {16, 16, 1}}};
  auto it = kShapes.find(chips);
  if (it == kShapes.end()) return false;
  *shape = it->second;
  return true;
}

// v4 / v5p / tpu7x slices. Below one cube: the Cloud shapes 2x2x1, 2x2x2,
// 2x2x4, 2x4x4. From 64 chips on, slices are built from 4x4x4 cubes and the
// default shape is "the one closest to a cube" ([v4] types-topologies): of all
// A<=B<=C (multiples of 4) with A*B*C = chips, the smallest C, then the
// smallest A+B+C. This reproduces every v5p entry of MaxText's table (e.g.
// v5p-1536 = 8x8x12, v5p-9216 = 12x16x24, v5p-17920 = 16x20x28).
bool standard_3d_shape(int chips, Coord* shape) {
  static const std::map<int, Coord> kSmall = {{4, {2, 2, 1}}, {8, {2, 2, 2}}, {16, {2, 2, 4}}, {32, {2, 4, 4}}};
  auto it = kSmall.find(chips);
  if (it != kSmall.end()) {
    *shape = it->second;
    return true;
  }
  if (chips % 64 != 0) return false;
  const int cubes = chips / 64;
  Coord best{0, 0, 0};
  for (int a = 1; a * a * a <= cubes; ++a) {
    if (cubes % a != 0) continue;
    for (int b = a; a * b * b <= cubes; ++b) {
      if ((cubes / a) % b != 0) continue;
      const int c = cubes / a / b;
      const bool better = best[0] == 0 || c < best[2] || (c == best[2] && a + b + c < best[0] + best[1] + best[2]);
      if (better) best = {a, b, c};
    }
  }
  *shape = {4 * best[0], 4 * best[1], 4 * best[2]};
  return true;
}

}  // namespace

Topology Topology::parse(const std::string& raw_name) {
  const std::string name = trim(raw_name);
  const std::string key = lower(name);
  if (key.empty()) invalid(raw_name, "empty name");

  Topology t;
  t.name_ = name;
  std::vector<int> dims;
  const size_t colon = key.find(':');
  if (colon != std::string::npos) {
    // "<generation>:<shape>"
    try {
      t.spec_ = &spec_for(key.substr(0, colon));
    } catch (const std::invalid_argument& e) {
      invalid(name, e.what());
    }
    dims = parse_shape(key.substr(colon + 1));
    if (dims.empty()) invalid(name, "malformed shape '" + key.substr(colon + 1) + "'");
  } else if (std::isdigit(static_cast<unsigned char>(key[0]))) {
    // Bare shape: its rank picks the generation.
    dims = parse_shape(key);
    if (dims.size() == 2) {
      t.spec_ = &spec_for("v6e");
    } else if (dims.size() == 3) {
      t.spec_ = &spec_for("v5p");
    } else {
      invalid(name, "a bare shape has 2 (v6e) or 3 (v5p) dimensions");
    }
  } else {
    // Cloud accelerator type "<generation>-<N>".
    const size_t dash = key.rfind('-');
    if (dash == std::string::npos) invalid(name, "expected '<generation>-<N>'");
    try {
      t.spec_ = &spec_for(key.substr(0, dash));
    } catch (const std::invalid_argument& e) {
      invalid(name, e.what());
    }
    const long count = parse_positive(key.substr(dash + 1));
    if (count < 0) invalid(name, "'" + key.substr(dash + 1) + "' is not a positive count");
    const ChipSpec& spec = *t.spec_;
    long chips = count;
    if (spec.names_count_tensorcores) {
      if (count % spec.tensorcores_per_chip != 0) {
        invalid(name, spec.generation + " names count TensorCores (" + std::to_string(spec.tensorcores_per_chip) +
                          " per chip), so N must be a multiple of " + std::to_string(spec.tensorcores_per_chip));
      }
      chips = count / spec.tensorcores_per_chip;
    }
    if (chips > spec.pod_chips) {
      invalid(name, std::to_string(chips) + " chips exceed a " + spec.generation + " pod (" +
                        std::to_string(spec.pod_chips) + " chips)");
    }
    Coord shape;
    const bool ok = spec.torus_dims == 2 ? standard_2d_shape(static_cast<int>(chips), &shape)
                                         : standard_3d_shape(static_cast<int>(chips), &shape);
    if (!ok) {
      invalid(name, std::to_string(chips) + " chips is not a standard " + spec.generation + " slice (" +
                        (spec.torus_dims == 2 ? std::string("1, 4, 8, 16, 32, 64, 128 or 256 chips")
                                              : std::string("4, 8, 16, 32 chips or a multiple of 64")) +
                        ")");
    }
    dims = {shape[0], shape[1], shape[2]};
  }

  const ChipSpec& spec = *t.spec_;
  if (spec.torus_dims == 2) {
    if (dims.size() == 3 && dims[2] == 1) dims.pop_back();
    if (dims.size() != 2) invalid(name, spec.generation + " is a 2D torus: shape is AxB");
    if (dims[0] > 16 || dims[1] > 16) {
      invalid(name, spec.generation + " pods are 16x16: no axis exceeds 16");
    }
    dims.push_back(1);
  } else if (dims.size() != 3) {
    invalid(name, spec.generation + " is a 3D torus: shape is AxBxC");
  }
  t.shape_ = {dims[0], dims[1], dims[2]};
  const long chips = static_cast<long>(dims[0]) * dims[1] * dims[2];
  if (chips > spec.pod_chips) {
    invalid(name, shape_string(t.shape_, spec.torus_dims) + " exceeds a " + spec.generation + " pod (" +
                      std::to_string(spec.pod_chips) + " chips)");
  }

  // Wraparound. 3D: slices made of whole 4x4x4 cubes are tori, the OCS closes
  // each axis whose length is a multiple of 4 ([v4] "3D torus on slices where
  // ... each dimension is a multiple of 4"; MaxText: 4x4x4 and up wrap on all
  // axes, 2x4x4 and below on none). 2D: only an axis spanning the full 16-chip
  // pod edge is a ring (MaxText: v6e-128 8x16 wraps y only; 16x16 both).
  if (spec.torus_dims == 3) {
    const bool whole_cubes = dims[0] >= 4 && dims[1] >= 4 && dims[2] >= 4;
    for (int a = 0; a < 3; ++a) t.wraps_[a] = whole_cubes && dims[a] % 4 == 0;
  } else {
    for (int a = 0; a < 2; ++a) t.wraps_[a] = dims[a] == 16;
  }

  // Hosts. A 2D slice of up to 8 chips hangs off one host ([v6e] "Chips per
  // host 8"; v5e-8, v6e-8 are single-VM); a 3D slice of up to 4 chips too
  // ([v5p] 2x2x1: 1 host). Larger slices have one host per 2x2x1 block of
  // chips (MaxText chips_per_host_bounds (2,2,1); [v5p] 2x2x2 -> 2 hosts;
  // [7x] "4-chip VM").
  const bool single_host = spec.torus_dims == 2 ? chips <= 8 : chips <= 4;
  if (single_host) {
    t.host_shape_ = t.shape_;
  } else {
    if (dims[0] % 2 != 0 || dims[1] % 2 != 0) {
      invalid(name,
              "a multi-host slice splits into 2x2x1 chip blocks per host, so its "
              "first two axes must be even");
    }
    t.host_shape_ = {2, 2, 1};
  }
  return t;
}

Topology Topology::from_env() {
  int slices = 1;
  if (const char* value = env("TORCH_TPU_SLICES")) {
    const long parsed = parse_positive(trim(value));
    if (parsed < 1) {
      throw std::invalid_argument("TORCH_TPU_SLICES='" + std::string(value) +
                                  "': expected the number of slices joined over DCN, a positive integer");
    }
    slices = static_cast<int>(parsed);
  }
  for (const char* var : {"TORCH_TPU_TOPOLOGY", "TPU_ACCELERATOR_TYPE"}) {
    if (const char* value = env(var)) {
      try {
        return parse(value).with_slices(slices);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(std::string(var) + ": " + e.what());
      }
    }
  }
  return parse("v6e-8").with_slices(slices);
}

Topology Topology::with_slices(int slices) const {
  if (slices < 1) {
    throw std::invalid_argument("a multislice topology has at least 1 slice, got " + std::to_string(slices));
  }
  Topology t = *this;
  t.num_slices_ = slices;
  return t;
}

int Topology::slice_of_host(int host) const {
  if (host < 0 || host >= total_hosts()) {
    throw std::out_of_range("host " + std::to_string(host) + " is out of range for " + std::to_string(num_slices_) +
                            " slice(s) of topology '" + name_ + "' (" + std::to_string(total_hosts()) +
                            " hosts: valid ids 0.." + std::to_string(total_hosts() - 1) + ")");
  }
  return host / num_hosts();
}

int Topology::chips_per_host() const { return host_shape_[0] * host_shape_[1] * host_shape_[2]; }

Coord Topology::coords(int chip) const {
  if (chip < 0 || chip >= num_chips()) {
    throw std::out_of_range("chip " + std::to_string(chip) + " is out of range for topology '" + name_ + "' (" +
                            std::to_string(num_chips()) + " chips: valid ids 0.." + std::to_string(num_chips() - 1) +
                            ")");
  }
  const int x = chip % shape_[0];
  const int y = (chip / shape_[0]) % shape_[1];
  const int z = chip / (shape_[0] * shape_[1]);
  return {x, y, z};
}

int Topology::chip_at(const Coord& c) const {
  for (int a = 0; a < 3; ++a) {
    if (c[a] < 0 || c[a] >= shape_[a]) {
      throw std::out_of_range("coordinate (" + std::to_string(c[0]) + "," + std::to_string(c[1]) + "," +
                              std::to_string(c[2]) + ") is outside topology '" + name_ + "' of shape " +
                              shape_string(shape_, 3));
    }
  }
  return c[0] + shape_[0] * (c[1] + shape_[1] * c[2]);
}

std::vector<int> Topology::neighbours(int chip) const {
  const Coord c = coords(chip);
  std::set<int> found;
  for (int a = 0; a < 3; ++a) {
    for (int step : {-1, 1}) {
      Coord n = c;
      n[a] += step;
      if (n[a] < 0 || n[a] >= shape_[a]) {
        if (!wraps_[a]) continue;
        n[a] = (n[a] + shape_[a]) % shape_[a];
      }
      const int id = chip_at(n);
      if (id != chip) found.insert(id);
    }
  }
  return {found.begin(), found.end()};
}

int Topology::hops(int a, int b) const {
  const Coord ca = coords(a);
  const Coord cb = coords(b);
  int total = 0;
  for (int axis = 0; axis < 3; ++axis) {
    const int d = std::abs(ca[axis] - cb[axis]);
    total += wraps_[axis] ? std::min(d, shape_[axis] - d) : d;
  }
  return total;
}

int Topology::host_of(int chip) const {
  const Coord c = coords(chip);
  const int hosts_x = shape_[0] / host_shape_[0];
  const int hosts_y = shape_[1] / host_shape_[1];
  return c[0] / host_shape_[0] + hosts_x * (c[1] / host_shape_[1] + hosts_y * (c[2] / host_shape_[2]));
}

std::vector<int> Topology::chips_of_host(int host) const {
  if (host < 0 || host >= num_hosts()) {
    throw std::out_of_range("host " + std::to_string(host) + " is out of range for topology '" + name_ + "' (" +
                            std::to_string(num_hosts()) + " hosts: valid ids 0.." + std::to_string(num_hosts() - 1) +
                            ")");
  }
  const int hosts_x = shape_[0] / host_shape_[0];
  const int hosts_y = shape_[1] / host_shape_[1];
  const Coord origin{(host % hosts_x) * host_shape_[0], ((host / hosts_x) % hosts_y) * host_shape_[1],
                     (host / (hosts_x * hosts_y)) * host_shape_[2]};
  std::vector<int> chips;
  for (int z = 0; z < host_shape_[2]; ++z) {
    for (int y = 0; y < host_shape_[1]; ++y) {
      for (int x = 0; x < host_shape_[0]; ++x) {
        chips.push_back(chip_at({origin[0] + x, origin[1] + y, origin[2] + z}));
      }
    }
  }
  return chips;  // ascending: z, y, x nest as the id does
}

// On a wrapped axis consecutive members are one link apart and the last links
// back to the first. On an open line the order is the same; its closing step
// travels back over the reverse direction of the line's links, which a ring
// collective uses once each, so the order still follows links.
std::vector<int> Topology::ring(int chip, int axis) const {
  if (axis < 0 || axis > 2) {
    throw std::out_of_range("axis " + std::to_string(axis) + " is out of range (0, 1 or 2)");
  }
  Coord c = coords(chip);
  const int start = c[axis];
  std::vector<int> order;
  for (int k = 0; k < shape_[axis]; ++k) {
    c[axis] = (start + k) % shape_[axis];
    order.push_back(chip_at(c));
  }
  return order;
}

}  // namespace vtpu
