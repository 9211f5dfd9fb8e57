// Per-process report of what would not port to a real TPU: operators run
// with dtypes the chip has no units for (float64, complex), counted per op.
#pragma once

#include <c10/core/ScalarType.h>

#include <map>
#include <string>
#include <utility>

namespace torch_tpu {

inline bool unsupported_on_tpu(c10::ScalarType t) {
  return t == c10::kDouble || t == c10::kComplexFloat || t == c10::kComplexDouble || t == c10::kComplexHalf;
}

void note_unsupported(const std::string& op, c10::ScalarType dtype);
// {(op, dtype name): count}
std::map<std::pair<std::string, std::string>, int64_t> unsupported_report();
void reset_unsupported_report();

}  // namespace torch_tpu
