#include "runtime/host_result_offer.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace torch_tpu {
namespace {

thread_local HostResultOffer* current_offer = nullptr;
std::atomic<bool> offers_enabled{true};

// Offered blocks handed out and not yet released, from any thread: a release may come through
// the allocator's raw deleter, which sees only the pointer.
std::mutex lent_mu;
std::vector<void*> lent;  // guarded by lent_mu
std::atomic<size_t> lent_count{0};

// Where `p` is in `lent` (lent_mu held), or its end.
std::vector<void*>::iterator find_lent(void* p) { return std::find(lent.begin(), lent.end(), p); }

bool is_lent(void* p) {
  if (lent_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> guard(lent_mu);
  return find_lent(p) != lent.end();
}

bool release_if_lent(void* p) {
  if (lent_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> guard(lent_mu);
  auto it = find_lent(p);
  if (it == lent.end()) return false;
  lent.erase(it);
  lent_count.fetch_sub(1, std::memory_order_release);
  return true;
}

void release_block(void* p) { release_if_lent(p); }  // the memory stays the HBM result's

c10::DeleterFnPtr base_raw_deleter = nullptr;
void raw_delete(void* p) {
  if (!release_if_lent(p)) base_raw_deleter(p);
}

// The CPU allocator, with offers served first.
class OfferingAllocator final : public c10::Allocator {
 public:
  explicit OfferingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t nbytes) override {
    if (HostResultOffer* offer = current_offer) {
      if (HostResultOffer::Slot* slot = offer->take(nbytes)) {
        {
          std::lock_guard<std::mutex> guard(lent_mu);
          lent.push_back(slot->data);
        }
        lent_count.fetch_add(1, std::memory_order_release);
        return c10::DataPtr(slot->data, slot->data, &release_block, c10::Device(c10::kCPU));
      }
    }
    return base_->allocate(nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_raw_deleter ? &raw_delete : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { base_->copy_data(dest, src, count); }

 private:
  c10::Allocator* base_;
};

// False when the CPU allocator cannot be wrapped (raw allocations need its raw deleter).
bool install_offering_allocator() {
  static const bool installed = [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    if (base == nullptr || base->raw_deleter() == nullptr) return false;
    base_raw_deleter = base->raw_deleter();
    static OfferingAllocator allocator(base);
    c10::SetCPUAllocator(&allocator, /*priority=*/0);
    return c10::GetCPUAllocator() == &allocator;
  }();
  return installed;
}

}  // namespace

HostResultOffer::HostResultOffer(c10::ArrayRef<at::Tensor> results) : previous_(current_offer) {
  if (!offers_enabled.load(std::memory_order_relaxed) || !install_offering_allocator()) return;
  for (size_t i = 0; i < results.size(); ++i) {
    const at::Tensor& r = results[i];
    if (!r.defined() || r.storage_offset() != 0 || r.nbytes() == 0 || r.nbytes() != r.storage().nbytes()) continue;
    bool unique = true;
    for (size_t j = 0; j < results.size() && unique; ++j) {
      unique = j == i || !results[j].defined() || results[j].nbytes() != r.nbytes();
    }
    if (unique) slots_.push_back(Slot{r.data_ptr(), r.nbytes()});
  }
  current_offer = this;
  open_ = true;
}

HostResultOffer::~HostResultOffer() { close(); }

void HostResultOffer::close() {
  if (!open_) return;
  current_offer = previous_;
  open_ = false;
}

HostResultOffer::Slot* HostResultOffer::take(size_t nbytes) {
  for (Slot& slot : slots_) {
    if (!slot.taken && slot.nbytes == nbytes) {
      slot.taken = true;
      return &slot;
    }
  }
  return nullptr;
}

void HostResultOffer::check_released(const std::string& op) {
  for (const Slot& slot : slots_) {
    // Still lent: whatever holds it keeps it (release_block never frees), and this process
    // serves no more offers.
    if (slot.taken && is_lent(slot.data)) {
      offers_enabled.store(false, std::memory_order_relaxed);
      throw std::runtime_error(op +
                               ": its CPU kernel kept a buffer it allocated past the call (internal error: "
                               "please report it); results written into HBM are no longer offered to host kernels");
    }
  }
}

bool is_written_in_place(const at::Tensor& result, const at::Tensor& target) {
  return result.data_ptr() == target.data_ptr() && result.dtype() == target.dtype() &&
         result.sizes() == target.sizes() && result.strides() == target.strides();
}

bool storages_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.has_storage() || !b.has_storage()) return false;
  const auto* a_begin = static_cast<const char*>(a.storage().data());
  const auto* b_begin = static_cast<const char*>(b.storage().data());
  if (a_begin == nullptr || b_begin == nullptr) return false;
  return a_begin < b_begin + b.storage().nbytes() && b_begin < a_begin + a.storage().nbytes();
}

}  // namespace torch_tpu
