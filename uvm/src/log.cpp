#include "spillway/log.h"

#include <unistd.h>

#include <string>

#include "spillway/cancel.h"

namespace spillway::detail {

void write_log_line(LogLevel, std::string_view text) noexcept {
  NoCancelScope no_cancel;  // write(2) is a cancellation point, and this function is noexcept
  try {
    std::string line;
    line.reserve(text.size() + 11);
    line.append("spillway: ").append(text).push_back('\n');
    const char* p = line.data();
    std::size_t left = line.size();
    while (left > 0) {
      ssize_t n = ::write(STDERR_FILENO, p, left);
      if (n <= 0) return;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  } catch (...) {
  }
}

}  // namespace spillway::detail
