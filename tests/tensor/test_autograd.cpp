// Autograd: accumulation over fan-out, grad-ready hook timing and count, no-grad, flat gradient buffers,
// saved-tensor version checks, grad(), and checkpointed vs plain gradients.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "tensor/autograd/checkpoint.h"
#include "tensor/autograd/engine.h"
#include "tensor/ops.h"

namespace cz {
namespace {

using testing::all_close;
using testing::random_tensor;

Tensor leaf(const Shape& s, uint64_t seed) {
  return random_tensor(s, seed).set_requires_grad(true);
}

TEST(Autograd, FanOutGradientsAccumulate) {
  Tensor x = leaf({3, 4}, 1);
  Tensor y = sum(add(mul(x, x), x));  // d/dx = 2x + 1
  y.backward();
  auto xv = x.to_vector<double>();
  for (double& v : xv) v = 2 * v + 1;
  EXPECT_TRUE(all_close(x.grad(), from_vector(xv, {3, 4}), 1e-12, 1e-12));
}

TEST(Autograd, GradReadyHookFiresOnceWithTheFinalGradient) {
  Tensor w = leaf({4}, 2);
  Tensor a = leaf({4}, 3), b = leaf({4}, 4);
  int calls = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](Tensor& p) {
    ++calls;
    seen = p.grad().to_vector<double>();
  });
  // w reaches the loss along two paths; the hook must see the sum of both.
  Tensor loss = sum(add(mul(w, a), mul(w, b)));
  loss.backward();
  EXPECT_EQ(calls, 1);
  auto expected = add(a, b).to_vector<double>();
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(w.grad().to_vector<double>(), expected);

  // A second backward accumulates into .grad and fires again, once.
  sum(mul(w, a)).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(all_close(w.grad(), add(add(a, b), a), 1e-12, 0));
}

TEST(Autograd, HooksFireInReverseOrderOfUse) {
  Tensor p1 = leaf({2, 3}, 5), p2 = leaf({3, 3}, 6), p3 = leaf({3}, 7);
  std::vector<std::string> order;
  p1.set_name("p1").register_grad_ready_hook([&](Tensor& p) { order.push_back(p.name()); });
  p2.set_name("p2").register_grad_ready_hook([&](Tensor& p) { order.push_back(p.name()); });
  p3.set_name("p3").register_grad_ready_hook([&](Tensor& p) { order.push_back(p.name()); });
  Tensor h = matmul(p1, p2);               // uses p1, p2
  Tensor out = sum(channel_scale(h, p3));  // then p3
  out.backward();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], "p3");
  // p1 and p2 become final together (one MatmulBackward); both after p3.
  EXPECT_TRUE((order[1] == "p1" && order[2] == "p2") || (order[1] == "p2" && order[2] == "p1"));
}

TEST(Autograd, RemovedHookDoesNotFire) {
  Tensor w = leaf({3}, 8);
  int calls = 0;
  const int id = w.register_grad_ready_hook([&](Tensor&) { ++calls; });
  w.remove_grad_ready_hook(id);
  sum(w).backward();
  EXPECT_EQ(calls, 0);
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = leaf({3}, 9);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = mul(x, x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(sum(y).backward(), ValueError);
  EXPECT_TRUE(mul(x, x).requires_grad());
}

TEST(Autograd, GradientsAccumulateIntoAFlatBuffer) {
  Tensor p1 = leaf({2, 3}, 10), p2 = leaf({4}, 11);
  Tensor flat = zeros({10}, DType::f64);
  p1.set_grad(view_of_storage(flat, {2, 3}, 0));
  p2.set_grad(view_of_storage(flat, {4}, 6));
  Tensor a = random_tensor({2, 3}, 12), b = random_tensor({4}, 13);
  auto loss = [&] { return add(sum(mul(p1, a)), sum(mul(p2, b))); };
  loss().backward();
  std::vector<double> expected = a.to_vector<double>();
  for (double v : b.to_vector<double>()) expected.push_back(v);
  EXPECT_EQ(flat.to_vector<double>(), expected);
  loss().backward();
  for (double& v : expected) v *= 2;
  EXPECT_TRUE(all_close(flat, from_vector(expected, {10}), 1e-12, 0));
  EXPECT_EQ(p1.grad().storage(), flat.storage());  // still the view, not a replacement
}

// Note [Deferred gradient zero]: after defer_grad_zero() the buffer is not written, yet every reader sees
// zero: the first gradient overwrites, later ones add, a parameter no gradient reached reads zero, and
// set_grad() ends the deferral.
TEST(Autograd, DeferredGradZeroActsAsAZeroFill) {
  Tensor p1 = leaf({2, 3}, 10), p2 = leaf({4}, 11);
  Tensor flat = full({10}, 7.0, DType::f64);  // last step's gradients
  p1.set_grad(view_of_storage(flat, {2, 3}, 0));
  p2.set_grad(view_of_storage(flat, {4}, 6));
  const Tensor a = random_tensor({2, 3}, 12);
  p1.defer_grad_zero();
  p2.defer_grad_zero();
  EXPECT_EQ(flat.to_vector<double>(), std::vector<double>(10, 7.0));  // nothing written yet
  sum(mul(p1, a)).backward();                                         // p2 is not in this graph
  EXPECT_EQ(p1.grad().to_vector<double>(), a.to_vector<double>());    // overwritten, not 7 + a
  EXPECT_EQ(flat.narrow(0, 6, 4).to_vector<double>(), std::vector<double>(4, 7.0));
  EXPECT_EQ(p2.grad().to_vector<double>(), std::vector<double>(4, 0.0));  // zeroed when read
  EXPECT_EQ(flat.narrow(0, 6, 4).to_vector<double>(), std::vector<double>(4, 0.0));
  EXPECT_EQ(p1.grad().storage(), flat.storage());  // still the view
  sum(mul(p1, a)).backward();                      // the second gradient adds
  EXPECT_TRUE(all_close(p1.grad(), scale(a, 2.0), 1e-12, 0));
  // set_grad() binds a new buffer: nothing deferred carries over to it.
  p1.defer_grad_zero();
  Tensor other = full({2, 3}, 1.0, DType::f64);
  p1.set_grad(other);
  sum(mul(p1, a)).backward();
  EXPECT_TRUE(all_close(other, add(a, full({2, 3}, 1.0, DType::f64)), 1e-12, 0));
  // A leaf without a .grad has nothing to defer: its first gradient becomes .grad as before.
  Tensor p3 = leaf({4}, 14);
  p3.defer_grad_zero();
  sum(mul(p3, p3)).backward();
  EXPECT_TRUE(all_close(p3.grad(), scale(p3.detach(), 2.0), 1e-12, 0));
}

TEST(Autograd, InPlaceWriteToASavedTensorIsCaught) {
  Tensor x = leaf({3}, 14);
  Tensor a = scale(x, 2.0);
  Tensor y = sum(mul(a, a));
  EXPECT_THROW(a.fill_(1.0), ValueError);  // refused while grad mode is on
  {
    NoGradGuard no_grad;
    a.fill_(1.0);
  }
  try {
    y.backward();
    FAIL() << "backward used a modified saved tensor";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("modified in place"), std::string::npos) << e.what();
  }
}

TEST(Autograd, SecondBackwardThroughAFreedGraphIsAnError) {
  Tensor x = leaf({3}, 15);
  Tensor y = sum(mul(x, x));
  y.backward();
  EXPECT_THROW(y.backward(), ValueError);
}

TEST(Autograd, NonScalarRootNeedsAGradient) {
  Tensor x = leaf({3}, 16);
  EXPECT_THROW(mul(x, x).backward(), ShapeError);
}

TEST(Autograd, GradReturnsGradientsWithoutTouchingDotGrad) {
  Tensor x = leaf({3}, 17), w = leaf({3}, 18);
  int calls = 0;
  w.register_grad_ready_hook([&](Tensor&) { ++calls; });
  Tensor y = sum(mul(mul(x, w), w));
  auto g = grad({y}, {Tensor()}, {w});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(calls, 0);
  auto expected = scale(mul(x, w), 2.0);
  EXPECT_TRUE(all_close(g[0], expected, 1e-12, 0));
}

TEST(Autograd, CheckpointGivesIdenticalGradientsAndHookTiming) {
  Tensor x = random_tensor({4, 6}, 19).set_requires_grad(true);
  Tensor w1 = leaf({8, 6}, 20), b1 = leaf({8}, 21), w2 = leaf({5, 8}, 22), gamma = leaf({5}, 23);
  auto segment = [&](const std::vector<Tensor>& in) {
    Tensor h = linear(in[0], w1, b1);
    h = mul(h, h);
    return std::vector<Tensor>{channel_scale(linear(h, w2), gamma)};
  };
  auto run = [&](bool ckpt) {
    for (Tensor* p : {&x, &w1, &b1, &w2, &gamma}) p->set_grad(Tensor());
    std::vector<Tensor> out = ckpt ? checkpoint(segment, {x}, {w1, b1, w2, gamma}) : segment({x});
    sum(mul(out[0], out[0])).backward();
    std::vector<Tensor> grads;
    for (Tensor* p : {&x, &w1, &b1, &w2, &gamma}) grads.push_back(p->grad().clone());
    return grads;
  };
  int calls = 0;
  w1.register_grad_ready_hook([&](Tensor&) { ++calls; });
  const auto plain = run(false);
  EXPECT_EQ(calls, 1);
  const auto ckpt = run(true);
  EXPECT_EQ(calls, 2);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(all_close(ckpt[i], plain[i], 0, 0)) << i;
}

TEST(Autograd, CheckpointedSegmentKeepsNoActivations) {
  Tensor x = random_tensor({64, 64}, 24).set_requires_grad(true);
  Tensor w = leaf({64, 64}, 25);
  auto segment = [&](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    for (int i = 0; i < 4; ++i) h = linear(h, w);
    return std::vector<Tensor>{h};
  };
  Allocator& a = allocator_for(Device::cpu());
  const int64_t before = a.stats().allocated_bytes;
  std::vector<Tensor> plain = segment({x});
  const int64_t plain_bytes = a.stats().allocated_bytes - before;
  std::vector<Tensor> ck = checkpoint(segment, {x}, {w});
  const int64_t ckpt_bytes = a.stats().allocated_bytes - before - plain_bytes;
  EXPECT_LT(ckpt_bytes, plain_bytes / 2);  // one output kept instead of four activations
}

}  // namespace
}  // namespace cz
