#include "aten/portability.h"

#include <mutex>

namespace torch_tpu {
namespace {
std::mutex mu;
std::map<std::pair<std::string, std::string>, int64_t> counts;
}  // namespace

void note_unsupported(const std::string& op, c10::ScalarType dtype) {
  std::lock_guard<std::mutex> lock(mu);
  ++counts[{op, c10::toString(dtype)}];
}

std::map<std::pair<std::string, std::string>, int64_t> unsupported_report() {
  std::lock_guard<std::mutex> lock(mu);
  return counts;
}

void reset_unsupported_report() {
  std::lock_guard<std::mutex> lock(mu);
  counts.clear();
}

}  // namespace torch_tpu
