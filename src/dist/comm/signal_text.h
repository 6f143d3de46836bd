// Text a signal handler may read and write (only async-signal-safe calls happen in a handler): a string that
// other threads replace, and a write of a C string to stderr.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

namespace cz::dist {

// Writers fill the idle one of two fixed buffers, then publish its index; a handler reads the published one.
template <size_t N>
class SignalSafeText {
 public:
  void set(const std::string& text) {
    const int next = 1 - index_.load(std::memory_order_relaxed);
    const size_t n = std::min(text.size(), N - 1);
    std::memcpy(buffers_[next], text.data(), n);
    buffers_[next][n] = '\0';
    index_.store(next, std::memory_order_release);
  }
  const char* get() const { return buffers_[index_.load(std::memory_order_acquire)]; }

 private:
  char buffers_[2][N] = {};
  std::atomic<int> index_{0};
};

// write(2) of the whole string to stderr, retrying short writes; gives up on an error.
inline void write_stderr(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

}  // namespace cz::dist
