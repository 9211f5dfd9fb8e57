// Point-to-point messages of tpu_dist: a byte ring per (sender, receiver) in
// the sender's segment. A message is a 64-byte header (tag, dtype, bytes)
// followed by its payload; a receiver checks the header against its recv and
// raises on a mismatch (after skipping the payload, so the channel stays in step).
#pragma once

#include <cstdint>
#include <string>

#include "distributed/shm_group.h"

namespace torch_tpu::dist {

void p2p_send(ShmGroup& g, int dst, int64_t tag, int32_t dtype, const void* data, uint64_t bytes,
              const std::string& what);
void p2p_recv(ShmGroup& g, int src, int64_t tag, int32_t dtype, void* data, uint64_t bytes, const std::string& what);

}  // namespace torch_tpu::dist
