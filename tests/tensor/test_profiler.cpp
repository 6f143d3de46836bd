// The op profiler (Note [Op profiling]): what it attributes to which name, that nesting is charged once, and
// that it records nothing while off.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "tensor/autograd/engine.h"
#include "tensor/ops.h"
#include "tensor/profiler.h"
#include "tensor/random.h"

namespace cz {
namespace {

std::map<std::string, profiler::OpTime> by_name(const std::vector<profiler::OpTime>& v) {
  std::map<std::string, profiler::OpTime> m;
  for (const auto& t : v) m[t.name] = t;
  return m;
}

class Profiler : public ::testing::Test {
 protected:
  void SetUp() override { (void)profiler::take(); }
  void TearDown() override {
    profiler::set_enabled(false);
    (void)profiler::take();
  }
};

TEST_F(Profiler, RecordsNothingWhileOff) {
  Generator gen(1);
  Tensor x = randn({4, 8}, gen);
  (void)gelu(add(x, x));
  EXPECT_TRUE(profiler::take().empty());
}

TEST_F(Profiler, CountsForwardOpsAndBackwardNodesByName) {
  Generator gen(2);
  Tensor x = randn({6, 16}, gen).set_requires_grad(true);
  Tensor w = randn({8, 16}, gen).set_requires_grad(true);
  Tensor b = randn({8}, gen).set_requires_grad(true);
  Tensor ln_w = randn({16}, gen).set_requires_grad(true);
  Tensor labels = randint(8, {6}, gen, DType::i64);

  profiler::set_enabled(true);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    Tensor h = layer_norm(x, ln_w, Tensor(), 1e-6);
    Tensor loss = cross_entropy(gelu(linear(h, w, b)), labels, 0.0);
    loss.backward();
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  profiler::set_enabled(false);
  const auto times = profiler::take();
  const auto m = by_name(times);

  for (const char* name : {"layer_norm", "linear", "gelu", "cross_entropy", "LayerNormBackward"}) {
    ASSERT_TRUE(m.count(name)) << name << " was not recorded";
    EXPECT_EQ(m.at(name).calls, 3) << name;
  }
  // One backward node per forward op that needs a gradient.
  int64_t backward_nodes = 0;
  for (const auto& [name, t] : m)
    if (name.find("Backward") != std::string::npos) backward_nodes += t.calls;
  EXPECT_EQ(backward_nodes, 3 * 4);
  // Outermost scopes only: the times cannot add up to more than the wall time they were taken in.
  double sum = 0;
  for (const auto& t : times) {
    EXPECT_GE(t.ms, 0) << t.name;
    sum += t.ms;
  }
  EXPECT_LE(sum, wall_ms);
  // Largest first.
  for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i - 1].ms, times[i].ms);
  EXPECT_TRUE(profiler::take().empty()) << "take() clears the records";
}

TEST_F(Profiler, NestedScopesAreChargedToTheOutermost) {
  Generator gen(3);
  Tensor x = randn({32, 32}, gen);
  profiler::set_enabled(true);
  {
    profiler::Scope outer("outer", Device::cpu());
    (void)add(x, x);
    (void)matmul(x, x);
  }
  (void)add(x, x);
  profiler::set_enabled(false);
  const auto m = by_name(profiler::take());
  ASSERT_TRUE(m.count("outer"));
  EXPECT_EQ(m.at("outer").calls, 1);
  EXPECT_FALSE(m.count("matmul")) << "an op inside another scope is not timed separately";
  ASSERT_TRUE(m.count("add"));
  EXPECT_EQ(m.at("add").calls, 1) << "only the add outside the scope";
}

TEST_F(Profiler, ATakeWhileAnotherThreadIsInsideAScopeDropsThatScope) {
  profiler::set_enabled(true);
  std::promise<void> opened, taken;
  std::thread worker([&] {
    profiler::Scope scope("worker", Device::cpu());
    opened.set_value();
    taken.get_future().wait();
  });
  opened.get_future().wait();
  const auto first = by_name(profiler::take());
  taken.set_value();
  worker.join();
  { profiler::Scope after("after", Device::cpu()); }
  profiler::set_enabled(false);
  const auto second = by_name(profiler::take());
  EXPECT_FALSE(first.count("worker")) << "an open scope has no time yet";
  EXPECT_FALSE(second.count("worker")) << "its record was taken before it closed";
  ASSERT_TRUE(second.count("after"));
  EXPECT_EQ(second.at("after").calls, 1);
}

}  // namespace
}  // namespace cz
