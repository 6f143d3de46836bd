// Helpers for the optimizer tests: small flat layouts, and asserting that a call throws a given error type
// whose message mentions given words.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "common/gradcheck.h"
#include "tensor/flat.h"

namespace cz::testing {

// Flattens random parameters of the given names and shapes (values in [-1, 1), never 0) into an f32 or f64
// flat buffer; the gradient buffer gets random values too (padding left zero).
inline FlatParams random_flat(const std::vector<std::pair<std::string, Shape>>& specs, uint64_t seed,
                              DType dtype = DType::f32, int64_t align = 16) {
  std::vector<std::pair<std::string, Tensor>> params;
  for (size_t i = 0; i < specs.size(); ++i)
    params.emplace_back(specs[i].first,
                        random_tensor(specs[i].second, seed + i, dtype).set_requires_grad(true));
  FlatParams flat = flatten_parameters(params, align);
  for (size_t i = 0; i < specs.size(); ++i) {
    const FlatSegment& s = flat.layout.segments[i];
    flat.grads.narrow(0, s.offset, s.numel)
        .copy_(random_tensor({s.numel}, seed + 1000 + i, dtype, -0.1, 0.1));
  }
  return flat;
}

template <class E>
::testing::AssertionResult throws_with(const std::function<void()>& fn,
                                       const std::vector<std::string>& words) {
  try {
    fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& w : words)
      if (msg.find(w) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks '" << w << "': " << msg;
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw another type: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace cz::testing
