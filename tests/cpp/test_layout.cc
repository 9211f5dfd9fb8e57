// Tiled layout: physical bytes of arrays in HBM.
#include <gtest/gtest.h>

#include <cctype>
#include <stdexcept>
#include <string>

#include "vtpu/layout.h"

namespace {

struct LayoutCase {
  const char* what;
  std::vector<int64_t> shape;
  int64_t element_size;
  uint64_t expected_bytes;
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.what; }

class PhysicalBytes : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(PhysicalBytes, MatchesTiledLayout) {
  const LayoutCase& c = GetParam();
  EXPECT_EQ(vtpu::physical_bytes(c.shape, c.element_size), c.expected_bytes) << c.what;
}

INSTANTIATE_TEST_SUITE_P(Shapes, PhysicalBytes,
                         ::testing::Values(LayoutCase{"f32[3,5]: one (8,128) tile", {3, 5}, 4, 4096},
                                           LayoutCase{"f32[8,128]: exactly one tile", {8, 128}, 4, 4096},
                                           LayoutCase{"f32[9,129]: 2x2 tiles", {9, 129}, 4, 16384},
                                           LayoutCase{"bf16[16,128]: one (16,128) tile", {16, 128}, 2, 4096},
                                           LayoutCase{"bf16[17,128]: two tiles", {17, 128}, 2, 8192},
                                           LayoutCase{"int8[33,1]: two (32,128) tiles", {33, 1}, 1, 8192},
                                           LayoutCase{"int8[32,128]: one tile", {32, 128}, 1, 4096},
                                           LayoutCase{"f32[2,3,5]: leading dim multiplies", {2, 3, 5}, 4, 8192},
                                           LayoutCase{"f32[2,2,3,5]", {2, 2, 3, 5}, 4, 16384},
                                           LayoutCase{"f32[] scalar: one tile", {}, 4, 4096},
                                           LayoutCase{"f32[5]: one tile", {5}, 4, 4096},
                                           LayoutCase{"f32[1024]: one dense tile", {1024}, 4, 4096},
                                           LayoutCase{"f32[1025]: two tiles", {1025}, 4, 8192},
                                           LayoutCase{"bf16[2049]: two tiles", {2049}, 2, 8192},
                                           LayoutCase{"f64[3,5]: (8,128) tile of 8-byte elements", {3, 5}, 8, 8192},
                                           LayoutCase{"empty f32[0,5]", {0, 5}, 4, 0},
                                           LayoutCase{"empty f32[4,0,3]", {4, 0, 3}, 4, 0},
                                           LayoutCase{"empty f32[0]", {0}, 4, 0}),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) {
                           std::string out = info.param.what;
                           out = out.substr(0, out.find(':'));
                           for (char& c : out) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return out;
                         });

TEST(Tile, PerElementSize) {
  EXPECT_EQ(vtpu::tile_for(4).sublanes, 8);
  EXPECT_EQ(vtpu::tile_for(2).sublanes, 16);
  EXPECT_EQ(vtpu::tile_for(1).sublanes, 32);
  EXPECT_EQ(vtpu::tile_for(8).sublanes, 8);
  for (int64_t size : {1, 2, 4, 8}) EXPECT_EQ(vtpu::tile_for(size).lanes, 128);
  // 1-, 2- and 4-byte tiles all hold 4 KiB.
  for (int64_t size : {1, 2, 4}) {
    const vtpu::Tile t = vtpu::tile_for(size);
    EXPECT_EQ(static_cast<uint64_t>(t.sublanes * t.lanes * size), vtpu::kTileBytes);
  }
}

TEST(Tile, RejectsOddElementSizes) {
  EXPECT_THROW(vtpu::tile_for(3), std::invalid_argument);
  EXPECT_THROW(vtpu::tile_for(0), std::invalid_argument);
}

TEST(PhysicalBytesErrors, NegativeDimensionThrows) {
  EXPECT_THROW(vtpu::physical_bytes({-1, 4}, 4), std::invalid_argument);
}

TEST(PhysicalBytesErrors, OverflowThrows) {
  EXPECT_THROW(vtpu::physical_bytes({int64_t{1} << 40, int64_t{1} << 40}, 4), std::overflow_error);
}

TEST(BufferBytes, IsAU8Row) {
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(0), 0u);
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(1), 4096u);
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(128), 4096u);
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(4096), 4096u);
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(4097), 8192u);
  EXPECT_EQ(vtpu::physical_bytes_of_buffer(1000), vtpu::physical_bytes({1000}, 1));
}

}  // namespace
