// Spillway's log: one line per message on stderr, prefixed "spillway: ". Messages below
// the configured level cost one relaxed atomic load and no formatting.
#pragma once

#include <atomic>
#include <string_view>

#include <fmt/format.h>

namespace spillway {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

namespace detail {
inline std::atomic<int> g_log_level{static_cast<int>(LogLevel::warn)};
void write_log_line(LogLevel level, std::string_view text) noexcept;
}  // namespace detail

inline void set_log_level(LogLevel level) { detail::g_log_level.store(static_cast<int>(level), std::memory_order_relaxed); }
inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= detail::g_log_level.load(std::memory_order_relaxed);
}

// Writes "spillway: <message>\n" with one write(2) if `level` is enabled. Never throws:
// a formatting failure drops the message.
template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  try {
    detail::write_log_line(level, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
  }
}

}  // namespace spillway

// Logs at most once per call site for the life of the process.
#define SPILLWAY_LOG_ONCE(level, ...)                                 \
  do {                                                                \
    static std::atomic<bool> spillway_logged_once_{false};            \
    if (!spillway_logged_once_.exchange(true, std::memory_order_relaxed)) \
      ::spillway::log(level, __VA_ARGS__);                            \
  } while (0)
