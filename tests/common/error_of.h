// Checking error messages in tests: the message of the E that `f` throws ("(no error)" when it throws none;
// any other exception escapes and fails the test; E is any std::exception unless named), and EXPECT_HAS for a
// substring of it.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace cz {

template <class E = std::exception>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace cz

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)
