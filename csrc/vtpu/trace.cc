#include "vtpu/trace.h"

namespace vtpu::trace {
namespace detail {
std::atomic<const Hooks*> g_hooks{nullptr};
}
void install(const Hooks* hooks) { detail::g_hooks.store(hooks, std::memory_order_release); }
}  // namespace vtpu::trace
