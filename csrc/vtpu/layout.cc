// Tiled layout arithmetic (see layout.h for the tile shapes and their source).
#include "vtpu/layout.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace vtpu {
namespace {

uint64_t round_up(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

uint64_t checked_mul(uint64_t a, uint64_t b) {
  uint64_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw std::overflow_error("array size overflows 64 bits");
  }
  return out;
}

}  // namespace

Tile tile_for(int64_t element_size) {
  switch (element_size) {
    case 1:
      return {32, 128};
    case 2:
      return {16, 128};
    case 4:
      return {8, 128};
    // 64-bit (and complex) types are emulated on TPU; they keep 8 sublanes.
    case 8:
    case 16:
      return {8, 128};
    default:
      throw std::invalid_argument("no TPU tile for " + std::to_string(element_size) +
                                  "-byte elements (expected 1, 2, 4, 8 or 16)");
  }
}

uint64_t physical_bytes(const std::vector<int64_t>& shape, int64_t element_size) {
  const Tile tile = tile_for(element_size);
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension " + std::to_string(d));
    if (d == 0) return 0;
  }
  const size_t rank = shape.size();
  if (rank <= 1) {
    const uint64_t n = rank == 1 ? static_cast<uint64_t>(shape[0]) : 1;
    return round_up(checked_mul(n, static_cast<uint64_t>(element_size)), kTileBytes);
  }
  const uint64_t rows = static_cast<uint64_t>(shape[rank - 2]);
  const uint64_t cols = static_cast<uint64_t>(shape[rank - 1]);
  uint64_t bytes = checked_mul(round_up(rows, tile.sublanes), round_up(cols, tile.lanes));
  bytes = checked_mul(bytes, static_cast<uint64_t>(element_size));
  for (size_t i = 0; i + 2 < rank; ++i) bytes = checked_mul(bytes, static_cast<uint64_t>(shape[i]));
  return bytes;
}

uint64_t physical_bytes_of_buffer(uint64_t nbytes) {
  if (nbytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw std::overflow_error("buffer of " + std::to_string(nbytes) + " bytes is too large");
  }
  return physical_bytes({static_cast<int64_t>(nbytes)}, 1);
}

}  // namespace vtpu
