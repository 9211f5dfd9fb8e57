#include "aten/host_matmul.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "aten/matmul_precision.h"
#include "vtpu/env.h"

// ATen's oneDNN matmul (aten/src/ATen/native/mkldnn/Matmul.h, exported with TORCH_API; the header
// is not installed): result = beta * result + alpha * (mat1 @ mat2), 2-D or 3-D.
namespace at::native {
TORCH_API void mkldnn_matmul(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& result, float beta,
                             float alpha);
}  // namespace at::native

namespace torch_tpu {

namespace {

// MKL's sgemm runs its AVX2 code on AMD CPUs. Zen 5 (family 0x1A) executes AVX-512 on full-width
// units, so oneDNN's AVX-512 kernels are 1.4-2.6x faster there; Zen 4 (family 0x19) splits each
// AVX-512 instruction into two 256-bit halves, so AVX2 loses nothing, and the K chunks below
// make oneDNN 5-14 % slower than MKL from 2048^2 (bench/README.md, "nineteenth session"). ATen's
// oneDNN float32 matmul needs AVX-512 BW/VL/DQ (mkldnn_bf16_device_check).
bool amd_with_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// The CPU's family as CPUID leaf 1 reports it (base family, plus the extended family when the base
// is 0xF), or 0 where there is no CPUID.
unsigned cpu_family() {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  const unsigned base = (eax >> 8) & 0xF;
  return base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
#else
  return 0;
#endif
}

// TORCH_TPU_ONEDNN_GEMM: unset, empty or "auto": AMD with full-width AVX-512 (Zen 5 and later);
// "0": never; anything else: any AMD CPU with AVX-512.
bool route_from_environment() {
  if (!amd_with_avx512()) return false;
  const char* value = vtpu::env("TORCH_TPU_ONEDNN_GEMM");
  const std::string setting = value ? vtpu::trim(value) : "auto";
  if (setting == "auto") return cpu_family() >= 0x1A;
  return setting != "0";
}

std::atomic<bool>& routed() {
  static std::atomic<bool> on{route_from_environment()};
  return on;
}

}  // namespace

bool onednn_gemm_on_this_host() { return routed().load(std::memory_order_relaxed); }

bool set_onednn_gemm(bool on) {
  TORCH_CHECK(!on || amd_with_avx512(),
              "torch_tpu: float32 products on oneDNN need an AMD CPU with AVX-512 (F, BW, VL, DQ); this host has none");
  return routed().exchange(on);
}

namespace {

bool no_overlap(const at::Tensor& out, const at::Tensor& t) {
  return at::get_overlap_status(out, t) == at::MemOverlapStatus::No;
}

// Whether out = a @ b goes to oneDNN (matmul_on_onednn's conditions, out's values aside).
bool onednn_pays(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  // Measured against MKL on Zen 5 (bench/README.md, "oneDNN"): from 512^3 oneDNN is 1.4-2.6x
  // faster; below 2^26 multiply-adds, or with fewer than 64 rows or columns (a decode step's
  // products), the two trade places and the K-chunk copies below cost more than they save.
  constexpr int64_t kMinMacs = int64_t{1} << 26, kMinSide = 64;
  if (!onednn_gemm_on_this_host()) return false;
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || out.scalar_type() != at::kFloat) return false;
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2) return false;
  if (a.is_conj() || b.is_conj() || a.is_neg() || b.is_neg() || out.is_conj() || out.is_neg()) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k || out.size(0) != m || out.size(1) != n) return false;
  if (m < kMinSide || n < kMinSide || m * n * k < kMinMacs) return false;
  if (!out.is_contiguous() || at::has_internal_overlap(out) != at::MemOverlap::No) return false;
  if (!no_overlap(out, a) || !no_overlap(out, b)) return false;
  // The global settings last: every float32 product on the worker comes through here.
  const at::Context& context = at::globalContext();
  return context.userEnabledMkldnn() && host_float32_products_exact();
}

// Columns [k0, k0 + width) of `t` ([rows, K]) in a layout oneDNN's matmul takes without its own
// (element-wise) copy: row-major or its transpose. A transposed t's slice already is; a row-major
// one is copied row by row.
at::Tensor k_columns(const at::Tensor& t, int64_t k0, int64_t width) {
  at::Tensor slice = t.narrow(1, k0, width);
  return t.stride(0) == 1 ? slice : slice.contiguous();
}

// Rows [k0, k0 + width) of `t` ([K, cols]): a row-major t's slice is row-major; a transposed
// one's (nn.Linear's weight.t()) is copied through its transpose, row by row.
at::Tensor k_rows(const at::Tensor& t, int64_t k0, int64_t width) {
  at::Tensor slice = t.narrow(0, k0, width);
  return t.stride(1) == 1 ? slice : slice.t().contiguous().t();
}

// out = beta * out + alpha * (a @ b) in K chunks of 128: oneDNN accumulates a chunk's products
// in order in registers, so one call over all of K would sum K terms in a row (mean error against
// float64 1.6x MKL's at K = 512, 2.1x at 2048); summed chunk by chunk into out, the error is
// 0.8-0.9x MKL's, and the chunks cost 5-35 % of the gain.
void onednn_matmul_in_k_chunks(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, float beta,
                               float alpha) {
  constexpr int64_t kChunk = 128;
  const int64_t k = a.size(1);
  if (k <= kChunk) {
    at::native::mkldnn_matmul(a, b, out, beta, alpha);
    return;
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t width = std::min(kChunk, k - k0);
    at::native::mkldnn_matmul(k_columns(a, k0, width), k_rows(b, k0, width), out, k0 == 0 ? beta : 1.f, alpha);
  }
}

}  // namespace

bool matmul_on_onednn(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  if (!onednn_pays(a, b, out)) return false;
  onednn_matmul_in_k_chunks(a, b, out, 0.f, 1.f);
  return true;
}

bool mm_few_rows_by_transposed(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  // Measured on 1 and 2 threads (bench/README.md, "lm_head"): outside these bounds the two
  // orders trade places from shape to shape, and for one row MKL's own order wins. On Intel CPUs
  // MKL takes another code path: it does not repack w for 2-6 rows (the reordered product is up
  // to 2.3x slower there), and for 7-8 rows it is faster but sums more accurately (mean error
  // against float64 2.1e-6, the reordered product's 4.9e-6), so there ATen's kernel always runs.
  static const bool kReorderPays = !__builtin_cpu_is("intel");
  constexpr int64_t kMinRows = 2, kMaxRows = 8, kMinColumns = 8192;
  if (!kReorderPays) return false;
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || out.scalar_type() != at::kFloat) return false;
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2 || a.is_conj() || b.is_conj()) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m < kMinRows || m > kMaxRows || n < kMinColumns || k < 1 || b.size(0) != k) return false;
  if (b.stride(0) != 1 || b.stride(1) != k || out.size(0) != m || out.size(1) != n) return false;
  // An out= that overlaps an operand: ATen's kernel, so that the result is CPU's whatever it is.
  if (at::get_overlap_status(out, a) != at::MemOverlapStatus::No ||
      at::get_overlap_status(out, b) != at::MemOverlapStatus::No || at::has_internal_overlap(out) != at::MemOverlap::No)
    return false;
  at::Tensor transposed = at::empty({n, m}, a.options().device(c10::kCPU));
  at::mm_out(transposed, b.t(), a.t());
  out.copy_(transposed.t());
  return true;
}

bool addmm_on_onednn(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
                     const at::Scalar& alpha, const at::Tensor& out) {
  if (self.scalar_type() != at::kFloat || !onednn_pays(a, b, out)) return false;
  // ATen's kernel checks that self broadcasts to out even when beta == 0 ignores it.
  if (!at::is_expandable_to(self.sizes(), out.sizes())) return false;
  const float beta_f = beta.to<float>(), alpha_f = alpha.to<float>();
  // alpha == 0: oneDNN's matmul returns without writing out (ATen's kernel scales self by beta);
  // NaN: MKL's sgemm gives CPU eager's result, which is not NaN everywhere.
  if (alpha_f == 0.f || std::isnan(alpha_f)) return false;
  if (beta_f != 0.f && !self.is_same(out)) {
    // out starts as self (broadcast), which oneDNN's sum post-op scales by beta.
    if (!no_overlap(out, self)) return false;
    out.copy_(self.expand(out.sizes()));
  }
  onednn_matmul_in_k_chunks(a, b, out, beta_f, alpha_f);
  return true;
}

bool call_mm_out_in_faster_order(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.overload_name() != "out") return false;
  const std::string& name = schema.name();
  const size_t arity = name == "aten::addmm" ? 6 : 3;
  if ((name != "aten::mm" && name != "aten::addmm") || stack->size() < arity) return false;
  const size_t first = stack->size() - arity;
  auto arg = [&](size_t i) -> const at::Tensor& { return (*stack)[first + i].toTensor(); };
  at::Tensor out = arg(arity - 1);
  const bool done =
      name == "aten::addmm"
          ? (*stack)[first].isTensor() && addmm_on_onednn(arg(0), arg(1), arg(2), (*stack)[first + 3].toScalar(),
                                                          (*stack)[first + 4].toScalar(), out)
          : mm_few_rows_by_transposed(arg(0), arg(1), out) || matmul_on_onednn(arg(0), arg(1), out);
  if (!done) return false;
  torch::jit::drop(*stack, arity);
  stack->push_back(std::move(out));
  return true;
}

}  // namespace torch_tpu
