// TPU tiled layout arithmetic: how many HBM bytes an array occupies.
#pragma once

#include <cstdint>
#include <vector>

namespace vtpu {

// Bytes one tile occupies: a TPU stores the two minor dimensions in tiles of
// (8,128) for 32-bit, (16,128) for 16-bit and (32,128) for 8-bit elements
// (Cloud TPU performance guide, "tiling"; XLA TPU layouts), i.e. 4 KiB each.
constexpr uint64_t kTileBytes = 4096;

// Tile (sublanes, lanes) for an element size in bytes. 64-bit types (emulated
// on TPU) use (8,128) tiles of 8-byte elements.
struct Tile {
  int64_t sublanes;
  int64_t lanes;
};
Tile tile_for(int64_t element_size);

// Physical bytes of an array of `shape` with `element_size`-byte elements:
// the minor two dimensions rounded up to the tile, all others multiplied.
// Rank 0 and 1 arrays fill whole tiles densely (XLA tiles a 1-D f32 array by
// 1024 elements, i.e. one 4 KiB tile): bytes rounded up to kTileBytes.
// An empty array takes 0 bytes.
// f32[3,5] -> 4096; bf16[16,128] -> 4096; f32[9,129] -> 16384; f32[1025] -> 8192.
uint64_t physical_bytes(const std::vector<int64_t>& shape, int64_t element_size);

// Physical bytes of an untyped byte buffer (storage without a shape): a u8[n],
// i.e. n rounded up to whole tiles.
uint64_t physical_bytes_of_buffer(uint64_t nbytes);

}  // namespace vtpu
