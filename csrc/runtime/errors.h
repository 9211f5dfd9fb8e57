// Turns errors of the chip layer (plain C++ exceptions) into PyTorch's own
// exception types, so Python sees torch.OutOfMemoryError, IndexError, ...
#pragma once

#include <c10/util/Exception.h>

#include <stdexcept>
#include <utility>

#include "vtpu/hbm_allocator.h"
#include "vtpu/stream.h"

namespace torch_tpu {

// Call inside a catch block: rethrows the in-flight exception as a c10 error.
[[noreturn]] inline void rethrow_as_torch_error() {
  try {
    throw;
  } catch (const c10::Error&) {
    throw;
  } catch (const vtpu::OutOfMemoryError& e) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
  } catch (const vtpu::AsyncError& e) {
    TORCH_CHECK(false, e.what());
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::out_of_range& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

// Runs `fn`, translating chip-layer exceptions (see rethrow_as_torch_error).
template <typename F>
decltype(auto) translate_errors(F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (...) {
    rethrow_as_torch_error();
  }
}

}  // namespace torch_tpu
