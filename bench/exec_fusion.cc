// Fused vs unfused evaluation of the tanh-GELU chain in the executor.
//
//   y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
//
// fused:   one kernel; x is read and y written once, the nine intermediates
//          live in tile scratch.
// unfused: one kernel per op (FusionOptions::fuse = false); every
//          intermediate is a full-size array in memory.
// Usage: exec_bench [--repeats N] [--sizes 1048576,4194304,...] [--dtype f32|bf16] [--tile N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "exec/executor.h"
#include "ir/builder.h"

using namespace torch_tpu;

namespace {

ir::Graph gelu_graph(int64_t n, ir::ElementType t) {
  ir::Builder b;
  auto x = b.parameter(t, {n});
  auto c = [&](double v) { return b.constant(v, t); };
  auto bc = [&](ir::ValueId s) { return b.broadcast_in_dim(s, {n}, {}); };
  auto x3 = b.multiply(b.multiply(x, x), x);
  auto inner = b.add(x, b.multiply(bc(c(0.044715)), x3));
  auto t1 = b.tanh(b.multiply(bc(c(std::sqrt(2.0 / M_PI))), inner));
  auto y = b.multiply(b.multiply(bc(c(0.5)), x), b.add(bc(c(1.0)), t1));
  b.output(y);
  return b.build();
}

struct Timing {
  double wall, cpu;  // seconds per run, medians
};

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Medians over `repeats` runs after a warm-up (which pages in the outputs and
// the temp arena). Thread CPU time is reported beside wall time because the
// development machine is shared: it does not count time spent preempted.
Timing time_runs(const exec::CompiledRegion& r, const std::vector<exec::Buffer>& in,
                 const std::vector<exec::Buffer>& out, int repeats) {
  exec::run(r, in, out);
  std::vector<double> wall, cpu;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu_seconds();
    exec::run(r, in, out);
    cpu.push_back(thread_cpu_seconds() - c0);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  std::vector<int64_t> sizes = {1 << 20, 1 << 22, 1 << 24};
  ir::ElementType dtype = ir::ElementType::f32;
  int64_t tile = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        sizes.push_back(std::atoll(s.substr(p, q - p).c_str()));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else if (a == "--tile" && i + 1 < argc) {
      tile = std::atoll(argv[++i]);
    } else if (a == "--dtype" && i + 1 < argc) {
      std::string d = argv[++i];
      dtype = d == "bf16" ? ir::ElementType::bf16 : ir::ElementType::f32;
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--sizes a,b,...] [--dtype f32|bf16] [--tile N]\n", argv[0]);
      return 2;
    }
  }
  std::printf("tanh-GELU chain (%s), medians of %d runs, one thread; ms of thread CPU time (wall in parentheses)\n",
              ir::element_type_name(dtype), repeats);
  std::printf("%10s %7s %22s %22s %7s %9s %11s\n", "elements", "kernels", "fused ms", "unfused ms", "ratio",
              "fused GB/s", "unfused tmp");
  for (int64_t n : sizes) {
    ir::Graph g = gelu_graph(n, dtype);
    exec::CompileOptions fusion;
    fusion.tile_elements = tile;
    exec::CompiledRegion fused = exec::compile(g, fusion);
    exec::CompileOptions no_fusion;
    no_fusion.tile_elements = tile;
    no_fusion.fusion.fuse = false;
    exec::CompiledRegion unfused = exec::compile(g, no_fusion);
    const int64_t es = ir::element_size(dtype);
    std::vector<char> x(static_cast<size_t>(n * es)), y1(x.size()), y2(x.size());
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(rng);
      if (dtype == ir::ElementType::f32)
        std::memcpy(&x[i * 4], &v, 4);
      else
        reinterpret_cast<uint16_t*>(x.data())[i] = ir::f32_to_bf16(v);
    }
    std::vector<exec::Buffer> in{exec::Buffer::contiguous(x.data(), dtype, {n})};
    Timing tf = time_runs(fused, in, {exec::Buffer::contiguous(y1.data(), dtype, {n})}, repeats);
    Timing tu = time_runs(unfused, in, {exec::Buffer::contiguous(y2.data(), dtype, {n})}, repeats);
    double max_diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      float a, b;
      if (dtype == ir::ElementType::f32) {
        std::memcpy(&a, &y1[i * 4], 4);
        std::memcpy(&b, &y2[i * 4], 4);
      } else {
        a = ir::bf16_to_f32(reinterpret_cast<uint16_t*>(y1.data())[i]);
        b = ir::bf16_to_f32(reinterpret_cast<uint16_t*>(y2.data())[i]);
      }
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a - b)));
    }
    std::printf("%10lld %3lld/%-3lld %9.3f (%9.3f) %9.3f (%9.3f) %6.2fx %9.2f %8.1f MB  max|fused-unfused| %.2g\n",
                static_cast<long long>(n), static_cast<long long>(fused.num_kernels()),
                static_cast<long long>(unfused.num_kernels()), tf.cpu * 1e3, tf.wall * 1e3, tu.cpu * 1e3, tu.wall * 1e3,
                tu.cpu / tf.cpu, 2.0 * n * es / tf.cpu / 1e9, unfused.temp_bytes() / 1e6, max_diff);
  }
  exec::release_thread_scratch();
  return 0;
}
