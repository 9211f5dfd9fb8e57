// Environment settings, read the same way in every layer: text trimmed of
// blanks, switches and positive integers with a fallback. No torch headers.
#pragma once

#include <cstdint>
#include <string>

namespace vtpu {

// `s` without leading and trailing spaces, tabs and line breaks.
std::string trim(const std::string& s);
// The value of environment variable `name`, or nullptr when it is unset or blank.
const char* env(const char* name);
// A switch: `fallback` when unset or empty, false for "0", true for anything else.
bool env_flag(const char* name, bool fallback);
// A positive decimal integer; `fallback` when unset, empty, not a number or not positive.
int64_t env_positive_int(const char* name, int64_t fallback);

}  // namespace vtpu
