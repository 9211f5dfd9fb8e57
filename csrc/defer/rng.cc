// Bernoulli masks for RNG ops fused into defer_and_fuse regions, bit-identical
// to strict mode.
//
// Strict mode runs ATen's CPU kernel with the chip generator's host engine
// (an at::mt19937). For bernoulli_(p) with a float p, ATen (2.13,
// aten/src/ATen/native/cpu/DistributionKernels.cpp + DistributionTemplates.h)
// has two paths:
//  - default (no MKL, or MKL on a non-Intel CPU): a serial loop; per element
//    r = random64() = (engine() << 32) | engine(), u = (r & (2^53 - 1)) * 2^-53,
//    value = u < p. Two 32-bit words per element, in order, independent of the
//    intra-op thread count.
//  - MKL on an Intel CPU: one 32-bit engine() draw seeds an MCG31 stream that
//    MKL's viRngBernoulli skips ahead per thread chunk (also thread-count
//    independent, but not reproducible without MKL's generator).
// The default path is replicated here with a vectorizable mt19937 (state
// regeneration and tempering over whole 624-word blocks) and an integer
// compare: u < p  <=>  (r & (2^53 - 1)) < ceil(p * 2^53). The first use
// checks it against ATen's kernel on this machine; where they differ (the
// MKL path) ATen's kernel itself fills the mask, which is as exact and as
// slow as strict mode.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "defer/lower.h"
#include "runtime/generator.h"

namespace torch_tpu::defer {
namespace {

// The aten sources build at -O2, whose vectorizer declines these loops;
// with O3 and AVX2 a mask costs about 1 ns per element instead of 7.
#pragma GCC optimize("O3")
// Runtime dispatch to AVX2 where the CPU has it, as csrc/exec's kernels do.
#define RNG_CLONES __attribute__((target_clones("avx2", "default")))
#define RNG_INLINE inline __attribute__((always_inline))

constexpr int kN = at::MERSENNE_STATE_N;  // 624
constexpr int kM = at::MERSENNE_STATE_M;  // 397

RNG_INLINE uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ ((v & 1u) ? at::MATRIX_A : 0u);
}

// at::mt19937_engine::next_state, as three loops the compiler vectorizes.
RNG_INLINE void regenerate(uint32_t* s) {
  for (int i = 0; i < kN - kM; ++i) s[i] = s[i + kM] ^ twist(s[i], s[i + 1]);
#pragma GCC ivdep
  for (int i = kN - kM; i < kN - 1; ++i) s[i] = s[i + kM - kN] ^ twist(s[i], s[i + 1]);
  s[kN - 1] = s[kM - 1] ^ twist(s[kN - 1], s[0]);
}

RNG_INLINE void temper(const uint32_t* in, uint32_t* out, int64_t k) {
  for (int64_t i = 0; i < k; ++i) {
    uint32_t y = in[i];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    out[i] = y;
  }
}

// m successive engine() outputs; the state ends as m calls of engine() leave it.
RNG_INLINE void draw_words(at::mt19937_data_pod& d, uint32_t* w, int64_t m) {
  while (m > 0) {
    if (d.left_ == 1) {  // engine(): --left_ == 0 regenerates, then reads state_[0]
      regenerate(d.state_.data());
      d.left_ = kN + 1;
      d.next_ = 0;
    }
    const int64_t k = std::min<int64_t>(m, d.left_ - 1);
    temper(d.state_.data() + d.next_, w, k);
    d.next_ += static_cast<uint32_t>(k);
    d.left_ -= static_cast<int>(k);
    w += k;
    m -= k;
  }
}

RNG_CLONES void fast_mask(at::mt19937_data_pod& d, double p, uint8_t* out, int64_t n) {
  constexpr double kTwo53 = 9007199254740992.0;
  const uint64_t threshold = p >= 1.0   ? (uint64_t{1} << 53)
                             : p <= 0.0 ? 0
                                        : static_cast<uint64_t>(std::ceil(p * kTwo53));
  constexpr int64_t kChunk = 512;  // elements per batch of words
  uint32_t w[2 * kChunk];
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t c = std::min(kChunk, n - start);
    draw_words(d, w, 2 * c);
    for (int64_t i = 0; i < c; ++i) {
      const uint64_t k = (static_cast<uint64_t>(w[2 * i] & 0x1fffffu) << 32) | w[2 * i + 1];
      out[start + i] = k < threshold ? 1 : 0;
    }
  }
}

void fast_mask(at::CPUGeneratorImpl* g, double p, uint8_t* out, int64_t n) {
  std::lock_guard<std::mutex> lock(g->mutex_);
  at::mt19937 engine = g->engine();
  at::mt19937_data_pod d = engine.data();
  fast_mask(d, p, out, n);
  engine.set_data(d);
  g->set_engine(engine);
}

void aten_mask(const at::Generator& host, double p, uint8_t* out, int64_t n) {
  at::from_blob(out, {n}, at::TensorOptions().dtype(at::kBool)).bernoulli_(p, host);
}

// Whether fast_mask reproduces ATen's kernel here: masks of several sizes
// and probabilities from mid-block states, and the state they leave behind.
bool fast_matches_aten() {
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0 / 3.0, 1.0}) {
    for (int64_t n : {int64_t{1}, int64_t{311}, int64_t{5000}}) {
      at::Generator a = at::make_generator<at::CPUGeneratorImpl>(1234 + n);
      at::Generator b = at::make_generator<at::CPUGeneratorImpl>(1234 + n);
      for (int i = 0; i < 7; ++i) {
        a.get<at::CPUGeneratorImpl>()->random();
        b.get<at::CPUGeneratorImpl>()->random();
      }
      std::vector<uint8_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
      aten_mask(a, p, want.data(), n);
      fast_mask(b.get<at::CPUGeneratorImpl>(), p, got.data(), n);
      if (want != got || a.get<at::CPUGeneratorImpl>()->random() != b.get<at::CPUGeneratorImpl>()->random())
        return false;
    }
  }
  return true;
}

}  // namespace

bool bernoulli_mask_is_vectorized() {
  static const bool ok = fast_matches_aten();
  return ok;
}

void draw_bernoulli_mask(const at::Generator& gen, double p, uint8_t* out, int64_t n) {
  const at::Generator& host = at::check_generator<TPUGeneratorImpl>(gen)->host_engine();
  if (n <= 0) return;
  if (bernoulli_mask_is_vectorized()) {
    fast_mask(at::check_generator<at::CPUGeneratorImpl>(host), p, out, n);
  } else {
    aten_mask(host, p, out, n);
  }
}

}  // namespace torch_tpu::defer
