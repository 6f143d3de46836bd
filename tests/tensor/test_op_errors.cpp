// Bad inputs to the ConvNeXt ops: each gives the typed error, and its message names the op and what it found.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace cz {
namespace {

// Runs f, expects an exception of exactly type E whose message contains every fragment.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << fragments.front() << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& frag : fragments)
      EXPECT_NE(msg.find(frag), std::string::npos) << "message: " << msg << "\nmissing: " << frag;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type; message: " << e.what();
  }
}

Tensor f32(const Shape& s) {
  return full(s, 0.5, DType::f32);
}
Tensor i64_labels(const std::vector<int64_t>& v) {
  return from_vector(v, {int64_t(v.size())});
}

TEST(OpErrors, Gelu) {
  expect_error<DtypeError>([] { gelu(zeros({3}, DType::i64)); }, {"gelu", "i64"});
  expect_error<DtypeError>([] { gelu(zeros({3}, DType::f16)); }, {"gelu", "f16"});
}

TEST(OpErrors, LayerNorm) {
  const Tensor x = f32({2, 4, 4, 192});
  expect_error<ShapeError>([&] { layer_norm(x, f32({96}), f32({192}), 1e-6); },
                           {"layer_norm: weight has shape (96) but x has C=192"});
  expect_error<ShapeError>(
      [&] {
        layer_norm(x, f32({192}), f32({192, 1}), 1e-6);
      },
      {"layer_norm: bias has shape (192, 1) but x has C=192", "(2, 4, 4, 192)"});
  expect_error<DtypeError>([&] { layer_norm(x, zeros({192}, DType::f64), Tensor(), 1e-6); },
                           {"layer_norm", "weight is f64 but x is f32"});
  expect_error<ShapeError>(
      [&] {
        layer_norm(f32({3, 0}), Tensor(), Tensor(), 1e-6);
      },
      {"layer_norm", "(3, 0)"});
  expect_error<ValueError>([&] { layer_norm(x, Tensor(), Tensor(), -1.0); }, {"layer_norm", "eps", "-1"});
  expect_error<DtypeError>(
      [&] {
        layer_norm(zeros({2, 3}, DType::i32), Tensor(), Tensor(), 1e-6);
      },
      {"layer_norm", "i32"});
}

TEST(OpErrors, DepthwiseConv) {
  const Tensor x = f32({2, 8, 8, 96});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(f32({8, 8, 96}), f32({96, 1, 7, 7}), Tensor());
      },
      {"depthwise_conv2d", "4-d", "(8, 8, 96)"});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(x, f32({192, 1, 7, 7}), Tensor());
      },
      {"depthwise_conv2d: weight has shape (192, 1, 7, 7) but x has C=96", "(2, 8, 8, 96)"});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(x, f32({96, 2, 7, 7}), Tensor());
      },
      {"depthwise_conv2d", "(96, 2, 7, 7)"});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(x, f32({96, 1, 7, 5}), Tensor());
      },
      {"depthwise_conv2d", "(96, 1, 7, 5)"});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(x, f32({96, 1, 4, 4}), Tensor());
      },
      {"depthwise_conv2d", "odd", "(96, 1, 4, 4)"});
  expect_error<ShapeError>(
      [&] {
        depthwise_conv2d(x, f32({96, 1, 7, 7}), f32({95}));
      },
      {"depthwise_conv2d: bias has shape (95)", "96"});
  expect_error<DtypeError>(
      [&] {
        depthwise_conv2d(x, zeros({96, 1, 7, 7}, DType::f64), Tensor());
      },
      {"depthwise_conv2d", "weight is f64 but x is f32"});
}

TEST(OpErrors, PatchifyConv) {
  const Tensor x = f32({2, 16, 16, 3});
  expect_error<ShapeError>(
      [&] {
        patchify_conv2d(x, f32({96, 4, 4, 4}), Tensor());
      },
      {"patchify_conv2d: weight has shape (96, 4, 4, 4) but x has Cin=3", "(2, 16, 16, 3)"});
  expect_error<ShapeError>(
      [&] {
        patchify_conv2d(x, f32({96, 3, 4, 2}), Tensor());
      },
      {"patchify_conv2d", "(96, 3, 4, 2)"});
  expect_error<ShapeError>(
      [&] {
        patchify_conv2d(f32({1, 3, 8, 3}), f32({96, 3, 4, 4}), Tensor());
      },
      {"patchify_conv2d", "larger than the input 3x8", "(1, 3, 8, 3)"});
  expect_error<ShapeError>(
      [&] {
        patchify_conv2d(x, f32({96, 3, 4, 4}), f32({3}));
      },
      {"patchify_conv2d: bias has shape (3)", "96"});
  expect_error<ShapeError>(
      [&] {
        patchify_conv2d(f32({16, 16, 3}), f32({96, 3, 4, 4}), Tensor());
      },
      {"patchify_conv2d", "(16, 16, 3)"});
}

TEST(OpErrors, GlobalAvgPool) {
  expect_error<ShapeError>([] { global_avg_pool(f32({2, 3, 4})); }, {"global_avg_pool", "(2, 3, 4)"});
  expect_error<ShapeError>([] { global_avg_pool(f32({2, 0, 3, 4})); }, {"global_avg_pool", "(2, 0, 3, 4)"});
  expect_error<DtypeError>(
      [] {
        global_avg_pool(zeros({2, 3, 3, 4}, DType::u8));
      },
      {"global_avg_pool", "u8"});
}

TEST(OpErrors, Grn) {
  const Tensor x = f32({2, 4, 4, 192});
  expect_error<ShapeError>([&] { grn(x, f32({96}), f32({192})); },
                           {"grn: gamma has shape (96) but x has C=192"});
  expect_error<ShapeError>(
      [&] {
        grn(x, f32({192}), f32({1, 1, 1, 192}));
      },
      {"grn: beta has shape (1, 1, 1, 192) but x has C=192", "(2, 4, 4, 192)"});
  expect_error<ShapeError>(
      [&] {
        grn(f32({16, 192}), f32({192}), f32({192}));
      },
      {"grn", "4-d NHWC", "(16, 192)"});
  expect_error<ShapeError>(
      [&] {
        grn(f32({2, 0, 4, 8}), f32({8}), f32({8}));
      },
      {"grn", "pixels", "(2, 0, 4, 8)"});
  expect_error<DtypeError>([&] { grn(x, zeros({192}, DType::f64), f32({192})); },
                           {"grn", "gamma is f64 but x is f32"});
  expect_error<ValueError>([&] { grn(x, f32({192}), Tensor()); }, {"grn", "beta", "undefined"});
  expect_error<ValueError>([&] { grn(x, f32({192}), f32({192}), -1.0); }, {"grn", "eps", "-1"});
  expect_error<DtypeError>(
      [] {
        grn(zeros({1, 2, 2, 4}, DType::bf16), zeros({4}, DType::bf16), zeros({4}, DType::bf16));
      },
      {"grn", "bf16", "CUDA"});
}

TEST(OpErrors, CrossEntropy) {
  const Tensor logits = f32({4, 10});
  expect_error<ValueError>(
      [&] {
        cross_entropy(logits, i64_labels({1, 2, 10, 3}));
      },
      {"cross_entropy", "labels[2] = 10", "10 classes"});
  expect_error<ValueError>(
      [&] {
        cross_entropy(logits, i64_labels({-1, 2, 0, 3}));
      },
      {"cross_entropy", "labels[0] = -1"});
  expect_error<ValueError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int32_t>{0, 1, 2, 99}, {4}));
      },
      {"cross_entropy", "labels[3] = 99"});
  expect_error<DtypeError>([&] { cross_entropy(logits, f32({4})); }, {"cross_entropy", "labels", "f32"});
  expect_error<ShapeError>(
      [&] {
        cross_entropy(logits, i64_labels({1, 2, 3}));
      },
      {"cross_entropy", "labels have shape (3) but logits have shape (4, 10)"});
  expect_error<ShapeError>([&] { cross_entropy(f32({10}), i64_labels({1})); },
                           {"cross_entropy", "logits", "(10)"});
  expect_error<ValueError>(
      [&] {
        cross_entropy(logits, i64_labels({1, 2, 3, 4}), 1.5);
      },
      {"cross_entropy", "label_smoothing", "1.5"});
  expect_error<DtypeError>(
      [&] {
        cross_entropy(zeros({4, 10}, DType::i64), i64_labels({1, 2, 3, 4}));
      },
      {"cross_entropy", "logits", "i64"});
}

TEST(OpErrors, SoftTargetCrossEntropy) {
  const Tensor logits = f32({4, 10});
  expect_error<ShapeError>(
      [&] {
        soft_target_cross_entropy(logits, f32({4, 9}));
      },
      {"soft_target_cross_entropy", "logits has shape (4, 10) but targets has shape (4, 9)"});
  expect_error<DtypeError>(
      [&] {
        soft_target_cross_entropy(logits, zeros({4, 10}, DType::f64));
      },
      {"soft_target_cross_entropy", "targets is f64 but logits is f32"});
  expect_error<ShapeError>([&] { soft_target_cross_entropy(f32({10}), f32({10})); },
                           {"soft_target_cross_entropy", "logits", "(10)"});
  expect_error<ShapeError>(
      [&] {
        soft_target_cross_entropy(f32({0, 10}), f32({0, 10}));
      },
      {"soft_target_cross_entropy", "non-empty", "(0, 10)"});
  expect_error<DtypeError>(
      [&] {
        soft_target_cross_entropy(zeros({4, 10}, DType::i64), f32({4, 10}));
      },
      {"soft_target_cross_entropy", "logits", "i64"});
  expect_error<ValueError>([&] { soft_target_cross_entropy(logits, Tensor()); },
                           {"soft_target_cross_entropy", "targets is an undefined tensor"});
}

TEST(OpErrors, ArgmaxAndCountCorrect) {
  expect_error<DtypeError>([] { argmax(zeros({3, 4}, DType::i32)); }, {"argmax", "i32"});
  expect_error<ShapeError>([] { argmax(f32({3, 0})); }, {"argmax", "(3, 0)"});
  expect_error<ShapeError>(
      [] {
        count_correct(f32({4, 10}), i64_labels({1, 2}));
      },
      {"count_correct", "labels have shape (2) but logits have shape (4, 10)"});
}

TEST(OpErrors, DropPath) {
  Generator gen(1);
  const Tensor x = f32({4, 3});
  expect_error<ValueError>([&] { drop_path(x, 1.0, gen); }, {"drop_path", "[0, 1)", "got 1"});
  expect_error<ValueError>([&] { drop_path(x, -0.1, gen); }, {"drop_path", "[0, 1)", "-0.1"});
  expect_error<ValueError>([&] { drop_path(x, std::nan(""), gen); }, {"drop_path", "[0, 1)"});
  expect_error<ShapeError>([&] { drop_path(full({}, 1.0), 0.5, gen); }, {"drop_path", "()"});
  expect_error<DtypeError>([&] { drop_path(zeros({4}, DType::i64), 0.5, gen); }, {"drop_path", "i64"});
}

TEST(OpErrors, MixedDevices) {
  if (cuda_runtime::device_count() == 0) GTEST_SKIP() << "needs a GPU";
  const Tensor x = f32({2, 8, 8, 16});
  const Tensor w = f32({16, 1, 7, 7}).to(Device::cuda(0));
  expect_error<DeviceError>([&] { depthwise_conv2d(x, w, Tensor()); },
                            {"depthwise_conv2d", "weight", "cuda"});
  expect_error<DeviceError>([&] { layer_norm(x, f32({16}).to(Device::cuda(0)), Tensor(), 1e-6); },
                            {"layer_norm", "weight", "cuda"});
  expect_error<DeviceError>(
      [&] {
        cross_entropy(f32({2, 3}), i64_labels({0, 1}).to(Device::cuda(0)));
      },
      {"cross_entropy", "labels"});
}

}  // namespace
}  // namespace cz
