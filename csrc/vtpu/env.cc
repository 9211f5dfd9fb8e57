#include "vtpu/env.h"

#include <cstdlib>
#include <cstring>

namespace vtpu {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && trim(value) != "" ? value : nullptr;
}

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return std::strcmp(v, "0") != 0;
}

int64_t env_positive_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  return (end && *end == '\0' && x > 0) ? x : fallback;
}

}  // namespace vtpu
