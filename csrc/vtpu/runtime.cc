// The process's vTPU: which chips it sees and their HBM and streams.
#include "vtpu/runtime.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "vtpu/env.h"
#include "vtpu/host_heap.h"

namespace vtpu {
namespace {

// A non-negative decimal integer; -1 if `s` is not one.
long long parse_index(const std::string& s) {
  const std::string t = trim(s);
  if (t.empty() || t.size() > 9) return -1;
  for (char c : t) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  return std::stoll(t);
}

// "17179869184", "16GiB", "512 MiB", "1.5GiB", "16GB" -> bytes. Binary
// suffixes (KiB, MiB, GiB, TiB; also K, M, G, T) count 1024s, SI ones (KB,
// MB, GB, TB) 1000s.
}  // namespace

uint64_t Runtime::parse_hbm_bytes(const std::string& raw) {
  const std::string text = trim(raw);
  auto fail = [&]() -> uint64_t {
    throw std::invalid_argument("TORCH_TPU_HBM_BYTES='" + raw +
                                "' is not a byte count: expected a positive integer or a number with a unit "
                                "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 17179869184 or 16GiB");
  };
  size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) {
    ++end;
  }
  const std::string number = text.substr(0, end);
  std::string unit = trim(text.substr(end));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (number.empty() || number.find('.') != number.rfind('.') || number == ".") return fail();

  double multiplier = 0;
  if (unit.empty() || unit == "b")
    multiplier = 1;
  else if (unit == "k" || unit == "kib")
    multiplier = 1024.0;
  else if (unit == "m" || unit == "mib")
    multiplier = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    multiplier = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    multiplier = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    multiplier = 1e3;
  else if (unit == "mb")
    multiplier = 1e6;
  else if (unit == "gb")
    multiplier = 1e9;
  else if (unit == "tb")
    multiplier = 1e12;
  else
    return fail();
  if (multiplier == 1 && number.find('.') != std::string::npos) return fail();

  const double bytes = std::stod(number) * multiplier;
  if (!(bytes >= 1) || bytes > 1e18) return fail();
  if (multiplier == 1) return std::stoull(number);  // exact for plain integers
  return static_cast<uint64_t>(std::llround(bytes));
}

// Like CUDA_VISIBLE_DEVICES, an empty value hides all chips.
std::vector<int> Runtime::parse_visible_chips(const std::string& value, int num_chips) {
  std::vector<int> chips;
  std::set<int> seen;
  const std::string text = trim(value);
  if (text.empty()) return chips;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    const long long id = parse_index(item);
    if (id < 0 || id >= num_chips) {
      throw std::invalid_argument("TPU_VISIBLE_CHIPS='" + value + "': '" + trim(item) +
                                  "' is not a chip id of this slice (valid: 0.." + std::to_string(num_chips - 1) + ")");
    }
    if (!seen.insert(static_cast<int>(id)).second) {
      throw std::invalid_argument("TPU_VISIBLE_CHIPS='" + value + "': chip " + trim(item) + " is listed twice");
    }
    chips.push_back(static_cast<int>(id));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return chips;
}

Chip::Chip(int index, int global_id, const Topology& topology, uint64_t hbm_bytes)
    : index_(index), global_id_(global_id), topology_(topology), hbm_(index, hbm_bytes), counters_(topology.spec()) {}

CounterSnapshot Chip::counters() {
  double host = 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : streams_) host += s->busy_seconds();
  return counters_.snapshot(host);
}

void Chip::reset_counters() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : streams_) s->reset_busy_seconds();
  counters_.reset();
}

Stream& Chip::stream(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_.empty()) streams_.push_back(std::make_unique<Stream>(index_, 0));
  if (id < 0 || id >= static_cast<int64_t>(streams_.size())) {
    throw std::out_of_range("tpu:" + std::to_string(index_) + " has no stream " + std::to_string(id) +
                            " (valid ids 0.." + std::to_string(streams_.size() - 1) + ")");
  }
  return *streams_[static_cast<size_t>(id)];
}

int64_t Chip::new_stream() {
  std::lock_guard<std::mutex> lock(mu_);
  if (streams_.empty()) streams_.push_back(std::make_unique<Stream>(index_, 0));
  const int64_t id = static_cast<int64_t>(streams_.size());
  streams_.push_back(std::make_unique<Stream>(index_, id));
  return id;
}

void Chip::synchronize() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : streams_) streams.push_back(s.get());
  }
  // Drain every stream even if one failed, then raise the first failure.
  std::exception_ptr first_error;
  for (Stream* s : streams) {
    try {
      s->synchronize();
    } catch (const AsyncError&) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

void Chip::wait_idle() {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : streams_) streams.push_back(s.get());
  }
  for (Stream* s : streams) s->wait_idle();
}

Runtime& Runtime::get() {
  // A constructor that throws leaves it unbuilt; the next call tries again.
  // Never destroyed: joining stream workers during static destruction would run
  // queued work after the libraries it calls are torn down. torch_tpu drains
  // every chip at interpreter exit instead.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

Runtime::Runtime() : topology_(Topology::from_env()) {
  tune_host_heap();
  uint64_t hbm_bytes = topology_.spec().hbm_bytes;
  if (const char* value = env("TORCH_TPU_HBM_BYTES")) hbm_bytes = parse_hbm_bytes(value);

  if (const char* value = env("TORCH_TPU_HOST_ID")) {
    const long long parsed = parse_index(value);
    if (parsed < 0 || parsed >= topology_.total_hosts()) {
      const std::string slices =
          topology_.num_slices() > 1 ? " x " + std::to_string(topology_.num_slices()) + " slices" : std::string();
      throw std::invalid_argument("TORCH_TPU_HOST_ID='" + std::string(value) + "' is not a host of topology '" +
                                  topology_.name() + "'" + slices + " (valid: 0.." +
                                  std::to_string(topology_.total_hosts() - 1) + ")");
    }
    host_ = static_cast<int>(parsed);
  }
  slice_ = topology_.slice_of_host(host_);
  std::vector<int> global_ids;
  if (const char* visible = std::getenv("TPU_VISIBLE_CHIPS")) {
    global_ids = parse_visible_chips(visible, topology_.num_chips());
  } else {
    global_ids = topology_.chips_of_host(host_ % topology_.num_hosts());
  }
  for (size_t i = 0; i < global_ids.size(); ++i) {
    chips_.push_back(std::make_unique<Chip>(static_cast<int>(i), global_ids[i], topology_, hbm_bytes));
  }
}

Chip& Runtime::chip(int index) {
  if (index < 0 || index >= device_count()) {
    throw std::out_of_range(
        "tpu:" + std::to_string(index) + " is out of range: this process sees " + std::to_string(device_count()) +
        " chip(s)" +
        (device_count() > 0 ? " (valid tpu:0..tpu:" + std::to_string(device_count() - 1) + ")" : std::string()));
  }
  return *chips_[static_cast<size_t>(index)];
}

}  // namespace vtpu
