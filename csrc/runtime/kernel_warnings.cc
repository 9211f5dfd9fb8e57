#include "runtime/kernel_warnings.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <utility>

namespace torch_tpu {
namespace {

class Collector : public c10::WarningHandler {
 public:
  explicit Collector(const std::vector<std::string>& known) : known_(known) {}
  void process(const c10::Warning& w) override {
    if (std::find(known_.begin(), known_.end(), w.msg()) != known_.end()) return;
    warnings.push_back(w);
  }
  std::vector<c10::Warning> warnings;

 private:
  const std::vector<std::string>& known_;
};

// Warnings waiting for their issuing thread; bounded, the oldest dropped first.
constexpr size_t kMaxQueued = 1024;
std::mutex queued_mu;
std::deque<std::pair<std::thread::id, c10::Warning>> queued;
std::atomic<size_t> queued_count{0};

}  // namespace

void run_collecting_warnings(const std::function<void()>& work, const std::vector<std::string>& known,
                             std::vector<c10::Warning>& warnings) {
  Collector collector(known);
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  try {
    work();
  } catch (...) {
    warnings = std::move(collector.warnings);
    throw;
  }
  warnings = std::move(collector.warnings);
}

std::vector<c10::Warning> run_collecting_warnings(const std::function<void()>& work,
                                                  const std::vector<std::string>& known) {
  std::vector<c10::Warning> warnings;
  run_collecting_warnings(work, known, warnings);  // a failure's warnings are dropped with it
  return warnings;
}

void queue_warnings(std::thread::id issuer, std::vector<c10::Warning> warnings) {
  if (warnings.empty()) return;
  std::lock_guard<std::mutex> lock(queued_mu);
  for (auto& w : warnings) {
    if (queued.size() >= kMaxQueued) queued.pop_front();
    queued.emplace_back(issuer, std::move(w));
  }
  queued_count.store(queued.size(), std::memory_order_release);
}

void deliver_queued_warnings() {
  if (queued_count.load(std::memory_order_acquire) == 0) return;
  std::vector<c10::Warning> mine;
  {
    const auto me = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(queued_mu);
    for (auto it = queued.begin(); it != queued.end();) {
      if (it->first == me) {
        mine.push_back(std::move(it->second));
        it = queued.erase(it);
      } else {
        ++it;
      }
    }
    queued_count.store(queued.size(), std::memory_order_release);
  }
  rewarn(mine);
}

void rewarn(const std::vector<c10::Warning>& warnings) {
  for (const auto& w : warnings) c10::warn(w);
}

}  // namespace torch_tpu
