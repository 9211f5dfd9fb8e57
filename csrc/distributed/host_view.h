// A contiguous host view of a tensor's memory, for the collective bodies;
// outputs that are not contiguous are computed in a temporary and copied back
// by commit().
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "runtime/host_alias.h"

namespace torch_tpu::dist {

class HostView {
 public:
  HostView(AliasBuilder& builder, const TensorRecipe& recipe, bool read) : view_(builder.alias(recipe)) {
    if (view_.is_contiguous()) {
      flat_ = view_;
    } else {
      flat_ = read ? view_.contiguous() : at::empty(view_.sizes(), view_.options());
    }
  }
  void* data() { return flat_.data_ptr(); }
  at::Tensor& flat() { return flat_; }
  int64_t nbytes() const { return static_cast<int64_t>(flat_.numel() * flat_.element_size()); }
  void commit() {
    if (!flat_.is_same(view_)) view_.copy_(flat_);
  }

 private:
  at::Tensor view_;
  at::Tensor flat_;
};

inline std::vector<TensorRecipe> recipes(const std::vector<at::Tensor>& ts) {
  std::vector<TensorRecipe> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(TensorRecipe::of(t));
  return out;
}

}  // namespace torch_tpu::dist
