#include "distributed/p2p.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "distributed/collectives.h"

namespace torch_tpu::dist {
namespace {

constexpr uint32_t kMessageMagic = 0x4D505554;  // "TUPM"

struct MessageHeader {
  uint32_t magic;
  int32_t dtype;
  int64_t tag;
  uint64_t bytes;
  char pad[40];
};
static_assert(sizeof(MessageHeader) == 64, "message header is one cache line");

void write_stream(ShmGroup& g, int dst, const char* data, uint64_t len, const std::string& what) {
  const int me = g.rank();
  const uint64_t cap = g.mailbox_bytes();
  char* ring = g.mailbox(me, dst);
  auto& written = g.p2p_written(me, dst);
  auto& consumed = g.p2p_read(dst, me);
  uint64_t w = written.load(std::memory_order_relaxed);
  while (len > 0) {
    uint64_t space = cap - (w - consumed.load(std::memory_order_acquire));
    if (space == 0) {
      g.wait_for(
          dst, [&] { return cap - (w - consumed.load(std::memory_order_acquire)) > 0; }, what);
      space = cap - (w - consumed.load(std::memory_order_acquire));
    }
    const uint64_t pos = w % cap;
    const uint64_t n = std::min({space, len, cap - pos});
    std::memcpy(ring + pos, data, n);
    w += n;
    data += n;
    len -= n;
    written.store(w, std::memory_order_release);
    g.ring_doorbell();
  }
}

// Reads `len` bytes into `data` (nullptr: discard).
void read_stream(ShmGroup& g, int src, char* data, uint64_t len, const std::string& what) {
  const int me = g.rank();
  const uint64_t cap = g.mailbox_bytes();
  const char* ring = g.mailbox(src, me);
  auto& written = g.p2p_written(src, me);
  auto& consumed = g.p2p_read(me, src);
  uint64_t r = consumed.load(std::memory_order_relaxed);
  while (len > 0) {
    uint64_t avail = written.load(std::memory_order_acquire) - r;
    if (avail == 0) {
      g.wait_for(
          src, [&] { return written.load(std::memory_order_acquire) - r > 0; }, what);
      avail = written.load(std::memory_order_acquire) - r;
    }
    const uint64_t pos = r % cap;
    const uint64_t n = std::min({avail, len, cap - pos});
    if (data != nullptr) {
      std::memcpy(data, ring + pos, n);
      data += n;
    }
    r += n;
    len -= n;
    consumed.store(r, std::memory_order_release);
    g.ring_doorbell();
  }
}

}  // namespace

void p2p_send(ShmGroup& g, int dst, int64_t tag, int32_t dtype, const void* data, uint64_t bytes,
              const std::string& what) {
  MessageHeader h{};
  h.magic = kMessageMagic;
  h.dtype = dtype;
  h.tag = tag;
  h.bytes = bytes;
  write_stream(g, dst, reinterpret_cast<const char*>(&h), sizeof(h), what);
  write_stream(g, dst, static_cast<const char*>(data), bytes, what);
}

void p2p_recv(ShmGroup& g, int src, int64_t tag, int32_t dtype, void* data, uint64_t bytes, const std::string& what) {
  MessageHeader h{};
  read_stream(g, src, reinterpret_cast<char*>(&h), sizeof(h), what);
  if (h.magic != kMessageMagic) {
    const std::string msg = "tpu_dist " + what + ": corrupt message header from " + g.describe_rank(src);
    g.mark_failed(src, msg);
    C10_THROW_ERROR(DistBackendError, msg);
  }
  if (h.tag != tag || h.bytes != bytes || h.dtype != dtype) {
    read_stream(g, src, nullptr, h.bytes, what);  // keep the channel in step
    TORCH_CHECK(false, "tpu_dist ", what, ": the next message from ", g.describe_rank(src), " has tag ", h.tag, ", ",
                h.bytes, " bytes of ", dtype_name(h.dtype), ", but this recv expects tag ", tag, ", ", bytes,
                " bytes of ", dtype_name(dtype), " (sends and recvs between two ranks must match in order)");
  }
  read_stream(g, src, static_cast<char*>(data), bytes, what);
}

}  // namespace torch_tpu::dist
