#include "distributed/chips.h"

#include <algorithm>

#include "runtime/device.h"
#include "vtpu/runtime.h"

namespace torch_tpu::dist {

const vtpu::Topology& topology() { return runtime().topology(); }

bool is_tpu(const c10::Device& device) { return device.type() == kTPU; }

int tpu_index(const at::Tensor& t) { return t.defined() && t.device().type() == kTPU ? t.device().index() : -1; }

std::vector<int> tpu_indices(const std::vector<at::Tensor>& tensors) {
  std::vector<int> out;
  for (const auto& t : tensors) {
    const int d = tpu_index(t);
    if (d >= 0 && std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

int current_tpu() { return device_count() > 0 ? current_device() : -1; }

int barrier_tpu(const std::optional<c10::Device>& device) {
  if (device.has_value() && device->type() == kTPU) return device->has_index() ? device->index() : current_device();
  return current_tpu();
}

void set_chip(Descriptor& d, int device) {
  if (device < 0) return;
  d.chip = chip(static_cast<c10::DeviceIndex>(device)).global_id();
  d.host = runtime().topology().host_of(d.chip);
}

void record_cost(int device, const vtpu::CollectiveCost& cost, const char* name) {
  if (device < 0) return;
  chip(static_cast<c10::DeviceIndex>(device)).record_collective(cost, name);
}

std::vector<vtpu::Event> stream_points(const std::vector<int>& devices) {
  std::vector<vtpu::Event> ready;
  for (int d : devices) {
    vtpu::Event ev;
    ev.record(current_vtpu_stream(static_cast<c10::DeviceIndex>(d)));
    ready.push_back(std::move(ev));
  }
  return ready;
}

void make_current(int device) {
  if (device >= 0) set_current_device(static_cast<c10::DeviceIndex>(device));
}

}  // namespace torch_tpu::dist
