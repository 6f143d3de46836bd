// CUDA kernels against the CPU backend: every op of the op table (forward and every input gradient, f32,
// bf16 and f16), the memory ops across dtypes and strides, and the GEMM epilogues (fused and unfused). Skips
// without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "op_table.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace cz::testing {
namespace {

// Leaves on `device` in `dtype` made from the table's inputs, after rounding them through `round` (integer
// inputs only move).
std::vector<Tensor> leaves(const std::vector<Tensor>& base, DType round, DType dtype, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& t : base) {
    if (!is_floating(t.dtype())) {
      out.push_back(t.detach().to(device));
      continue;
    }
    Tensor leaf = t.detach().to(round).to(dtype).to(device).detach();
    if (t.requires_grad()) leaf.set_requires_grad(true);
    out.push_back(leaf);
  }
  return out;
}

struct Result {
  Tensor out;
  std::vector<Tensor> grads;  // one per input; undefined where the input does not require grad
};

// Forward, then backward of sum(out * w) for a random w (rounded through `round`), so that every output
// element's gradient is exercised and both backends receive the same upstream gradient.
Result run(const OpCase& op, const std::vector<Tensor>& in, DType round, uint64_t seed) {
  Result r;
  r.out = op.fn(in);
  const Tensor w = random_tensor(r.out.sizes(), seed).to(round).to(r.out.dtype()).to(r.out.device());
  sum(mul(r.out, w)).backward();
  for (const Tensor& t : in) r.grads.push_back(t.requires_grad() ? t.grad() : Tensor());
  return r;
}

void expect_close(const std::string& name, const Result& gpu_r, const Result& cpu_r, double rtol,
                  double atol) {
  EXPECT_TRUE(gpu_r.out.is_cuda()) << name;
  EXPECT_TRUE(all_close(gpu_r.out, cpu_r.out, rtol, atol)) << name << ": forward";
  ASSERT_EQ(gpu_r.grads.size(), cpu_r.grads.size());
  for (size_t i = 0; i < gpu_r.grads.size(); ++i) {
    ASSERT_EQ(gpu_r.grads[i].defined(), cpu_r.grads[i].defined()) << name << ": input " << i;
    if (!gpu_r.grads[i].defined()) continue;
    EXPECT_TRUE(gpu_r.grads[i].is_cuda()) << name << ": gradient of input " << i;
    EXPECT_TRUE(all_close(gpu_r.grads[i], cpu_r.grads[i], rtol, atol)) << name << ": gradient of input " << i;
  }
}

class OpTableCuda : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override { CZ_REQUIRE_GPU(); }
  const OpCase& op() const { return op_cases()[GetParam()]; }
};

TEST_P(OpTableCuda, F32MatchesCpu) {
  const auto base = op().inputs(DType::f64, 21);
  const Result cpu_r = run(op(), leaves(base, DType::f32, DType::f32, Device::cpu()), DType::f32, 5);
  const Result gpu_r = run(op(), leaves(base, DType::f32, DType::f32, gpu()), DType::f32, 5);
  EXPECT_EQ(gpu_r.out.dtype(), DType::f32);
  expect_close(op().name, gpu_r, cpu_r, 1e-5, 1e-5);
}

// bf16 on the GPU against f32 on the CPU from the same bf16-rounded inputs: the difference is the kernels'
// bf16 arithmetic and output rounding, not the rounding of the inputs.
TEST_P(OpTableCuda, Bf16MatchesCpuF32) {
  const auto base = op().inputs(DType::f64, 22);
  const Result cpu_r = run(op(), leaves(base, DType::bf16, DType::f32, Device::cpu()), DType::bf16, 6);
  const Result gpu_r = run(op(), leaves(base, DType::bf16, DType::bf16, gpu()), DType::bf16, 6);
  EXPECT_EQ(gpu_r.out.dtype(), DType::bf16);
  expect_close(op().name, gpu_r, cpu_r, op().bf16_rtol, op().bf16_atol);
}

// The same in f16: 3 more mantissa bits than bf16 (unit roundoff 2^-11 against 2^-8), so half the table's
// bf16 tolerances still leaves a 4x margin for rounding; the inputs are O(1), far from f16's range limits.
TEST_P(OpTableCuda, F16MatchesCpuF32) {
  const auto base = op().inputs(DType::f64, 23);
  const Result cpu_r = run(op(), leaves(base, DType::f16, DType::f32, Device::cpu()), DType::f16, 7);
  const Result gpu_r = run(op(), leaves(base, DType::f16, DType::f16, gpu()), DType::f16, 7);
  EXPECT_EQ(gpu_r.out.dtype(), DType::f16);
  expect_close(op().name, gpu_r, cpu_r, op().bf16_rtol / 2, op().bf16_atol / 2);
}

std::string case_name(const ::testing::TestParamInfo<size_t>& info) {
  return op_cases()[info.param].name;
}

INSTANTIATE_TEST_SUITE_P(All, OpTableCuda, ::testing::Range<size_t>(0, op_cases().size()), case_name);

// ---- memory ops ----

const std::vector<DType> kAllDtypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8,  DType::b8};

// Values every dtype holds (non-negative, for u8), with fractions that integer conversion must truncate.
Tensor sample(const Shape& shape, uint64_t seed) {
  auto v = random_tensor(shape, seed, DType::f64, 0.0, 100.0).to_vector<double>();
  for (double& x : v) x = std::floor(x) + 0.25;
  return from_vector(v, shape);
}

TEST(CudaMemory, FillMatchesCpuForEveryDtypeAndStride) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  for (DType t : kAllDtypes) {
    for (double value : {2.75, -1.5, 200.0}) {
      if (t == DType::u8 && value < 0) continue;
      Tensor c = zeros({4, 6, 5}, t), g = zeros({4, 6, 5}, t, gpu());
      c.fill_(value);
      g.fill_(value);
      EXPECT_TRUE(all_close(g, c, 0, 0)) << dtype_name(t) << " contiguous " << value;
      // A strided window and a transposed view.
      c.narrow(1, 1, 3).narrow(2, 1, 3).fill_(value / 2);
      g.narrow(1, 1, 3).narrow(2, 1, 3).fill_(value / 2);
      c.transpose(0, 2).select(0, 4).fill_(3.0);
      g.transpose(0, 2).select(0, 4).fill_(3.0);
      EXPECT_TRUE(all_close(g, c, 0, 0)) << dtype_name(t) << " strided " << value;
    }
  }
}

TEST(CudaMemory, CopyConvertsEveryDtypePairAcrossStrides) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Tensor values = sample({3, 4, 5}, 3);
  for (DType s : kAllDtypes) {
    const Tensor src_c = values.to(s);
    const Tensor src_g = src_c.to(gpu());
    for (DType d : kAllDtypes) {
      // Contiguous to contiguous.
      Tensor dst_c = empty({3, 4, 5}, d), dst_g = empty({3, 4, 5}, d, gpu());
      dst_c.copy_(src_c);
      dst_g.copy_(src_g);
      EXPECT_TRUE(all_close(dst_g, dst_c, 0, 0)) << dtype_name(s) << " -> " << dtype_name(d) << " contiguous";
      // A permuted source into a destination with other strides.
      const Tensor psrc_c = sample({5, 3, 4}, 4).to(s).permute({1, 2, 0});  // (3, 4, 5), strides (4, 1, 12)
      const Tensor psrc_g = psrc_c.to(gpu()).permute({2, 0, 1}).contiguous().permute({1, 2, 0});
      Tensor pdst_c = empty({4, 3, 5}, d).permute({1, 0, 2}),
             pdst_g = empty({4, 3, 5}, d, gpu()).permute({1, 0, 2});
      pdst_c.copy_(psrc_c);
      pdst_g.copy_(psrc_g);
      EXPECT_TRUE(all_close(pdst_g, pdst_c, 0, 0)) << dtype_name(s) << " -> " << dtype_name(d) << " strided";
      // A narrowed, non-mergeable window.
      Tensor w_c = zeros({3, 2, 5}, d), w_g = zeros({3, 2, 5}, d, gpu());
      w_c.copy_(src_c.narrow(1, 1, 2));
      w_g.copy_(src_g.narrow(1, 1, 2));
      EXPECT_TRUE(all_close(w_g, w_c, 0, 0)) << dtype_name(s) << " -> " << dtype_name(d) << " window";
    }
  }
}

TEST(CudaMemory, CrossDeviceCopiesConvertAndFollowStrides) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Tensor values = sample({6, 7}, 4);
  // Host (f64, transposed) into a strided bf16 device window.
  Tensor dev = zeros({7, 10}, DType::bf16, gpu());
  dev.narrow(1, 2, 6).copy_(values.transpose(0, 1));
  Tensor expect = zeros({7, 10}, DType::bf16);
  expect.narrow(1, 2, 6).copy_(values.transpose(0, 1));
  EXPECT_TRUE(all_close(dev, expect, 0, 0));
  // Device (strided) into a strided f32 host tensor.
  Tensor host = zeros({6, 7}, DType::f32);
  host.transpose(0, 1).copy_(dev.narrow(1, 2, 6));
  EXPECT_TRUE(all_close(host, values.to(DType::bf16).to(DType::f32), 0, 0));
  // Round trips and host reads.
  EXPECT_EQ(values.to(gpu()).select(0, 2).select(0, 3).item(), values.select(0, 2).select(0, 3).item());
  EXPECT_EQ(values.to(gpu()).to_vector<double>(), values.to_vector<double>());
  if (cuda_device_count() > 1) {
    Tensor other = values.to(Device::cuda(1));
    EXPECT_EQ(other.to(gpu()).to_vector<double>(), values.to_vector<double>());
  }
}

// Host-to-device copies return before the GPU has read their pinned staging block (the stream is held busy
// here), and many in a row reuse staging blocks: each must arrive intact, and the source may be overwritten
// at once.
TEST(CudaMemory, HostToDeviceCopiesDoNotWaitAndKeepTheirStagingUntilRead) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Stream stream = current_stream(gpu());
  cuda::busy_wait(stream, 200'000);  // 0.2 s: every copy below is still queued when the loop ends
  Tensor src = empty({1000}, DType::f32);
  std::vector<Tensor> dev;
  for (int i = 0; i < 64; ++i) {
    src.fill_(double(i));
    dev.push_back(src.to(gpu()));
    src.fill_(-1.0);  // the caller's buffer is free as soon as copy_ returns
  }
  Event after(gpu());
  after.record(stream);
  EXPECT_FALSE(after.query()) << "a host-to-device copy waited for the GPU (the 0.2 s busy kernel is done)";
  for (int i = 0; i < 64; ++i)
    EXPECT_TRUE(all_close(dev[size_t(i)].cpu(), full({1000}, double(i)), 0, 0)) << "copy " << i;
}

TEST(CudaMemory, AxpyAndScaleOnStridedViewsMatchCpu) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const double tol = t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-6 : 1e-2;
    const Tensor x = random_tensor({5, 8}, 7).to(t), y = random_tensor({8, 5}, 8).to(t);
    Tensor yc = y.clone(), yg = y.to(gpu());
    yc.transpose(0, 1).add_(x, -0.75);
    yg.transpose(0, 1).add_(x.to(gpu()), -0.75);
    EXPECT_TRUE(all_close(yg, yc, tol, tol)) << dtype_name(t) << " axpy";
    yc.narrow(0, 1, 5).mul_(1.5);
    yg.narrow(0, 1, 5).mul_(1.5);
    EXPECT_TRUE(all_close(yg, yc, tol, tol)) << dtype_name(t) << " scale";
    // Contiguous and large enough for the vectorised path and its tail.
    const Tensor a = random_tensor({1000003}, 9).to(t), b = random_tensor({1000003}, 10).to(t);
    Tensor ac = a.clone(), ag = a.to(gpu());
    ac.add_(b, 2.0).mul_(0.5);
    ag.add_(b.to(gpu()), 2.0).mul_(0.5);
    EXPECT_TRUE(all_close(ag, ac, tol, tol)) << dtype_name(t) << " contiguous";
    // x and y the same tensor: the kernel must not assume they do not alias.
    ac.add_(ac, -0.25);
    ag.add_(ag, -0.25);
    EXPECT_TRUE(all_close(ag, ac, tol, tol)) << dtype_name(t) << " aliased";
  }
}

TEST(CudaMemory, IndexesPastTwoToTheThirtyOne) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const int64_t n = (int64_t(1) << 31) + 96;
  Tensor t = empty({n}, DType::u8, gpu());
  t.fill_(3);
  t.narrow(0, n - 40, 40).fill_(7);
  Tensor b = empty({n}, DType::b8, gpu());
  b.copy_(t);  // a converting copy: the kernel path with 64-bit indices
  Tensor u = empty({n / 2}, DType::u8, gpu());
  u.copy_(t.view({n / 2, 2}).select(1, 1));  // strided source
  EXPECT_EQ(t.narrow(0, n - 41, 2).to_vector<int64_t>(), (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(b.narrow(0, n - 1, 1).to_vector<int64_t>(), (std::vector<int64_t>{1}));
  EXPECT_EQ(u.narrow(0, n / 2 - 21, 2).to_vector<int64_t>(), (std::vector<int64_t>{3, 7}));
}

TEST(CudaReduce, LargeSumsAndBroadcastsMatchCpu) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Tensor x = random_tensor({3000017}, 11, DType::f64, 0.0, 1.0);
  const double expect = sum(x).item();
  EXPECT_NEAR(sum(x.to(DType::f32).to(gpu())).item(), expect, 1e-5 * expect);
  EXPECT_NEAR(sum(x.to(gpu())).item(), expect, 1e-9 * expect);
  EXPECT_NEAR(mean(x.to(DType::bf16).to(gpu())).item(), expect / double(x.numel()), 1e-2);
  // An unaligned start (offset of one element) takes the scalar path.
  const Tensor xs = x.to(DType::f32).to(gpu()).narrow(0, 1, x.numel() - 1);
  EXPECT_NEAR(sum(xs).item(), expect - x.narrow(0, 0, 1).item(), 1e-5 * expect);
  // broadcast_scalar reads the scalar on the device.
  Tensor out = empty({1001}, DType::f32, gpu());
  cuda::broadcast_scalar(full({}, 2.0, DType::f32, gpu()), -0.5, out, current_stream(gpu()));
  EXPECT_TRUE(all_close(out, full({1001}, -1.0), 0, 0));
}

}  // namespace
}  // namespace cz::testing
