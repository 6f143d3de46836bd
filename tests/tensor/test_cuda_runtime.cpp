// The CUDA runtime pieces: device allocator statistics, the cross-stream rule of the caching allocator
// (Note [Cross-stream frees]), the pinned host allocator, the per-device context (handles, streams), and
// streams/events. Skips without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <thread>

#include "common/gradcheck.h"
#include "cuda_test_util.h"
#include "tensor/autograd/engine.h"
#include "tensor/cuda/allocator.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/status.h"
#include "tensor/ops.h"

namespace cz::testing {
namespace {

TEST(CudaRuntime, DeviceCountIsZeroWithoutAGpuAndCudaTensorsAreRefused) {
  // Runs everywhere: without a GPU the backend must say so instead of failing.
  EXPECT_TRUE(cuda_runtime::built());
  EXPECT_EQ(cuda_device_count(), cuda_runtime::device_count());
  if (!cuda_available()) {
    EXPECT_THROW(empty({2}, DType::f32, gpu()), DeviceError);
    EXPECT_THROW(cuda::context(0), DeviceError);
    EXPECT_THROW(cuda::pinned_allocator(), DeviceError);
    EXPECT_NE(pinned_host_allocator().allocate(64).get(), nullptr);  // plain host memory instead
  }
}

TEST(CudaStatus, ErrorsNameLibraryCodeStatementPlaceAndRank) {
  // Runs everywhere: formatting a status needs no device.
  set_log_prefix("[rank 3] ");
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error thrown");
  };
  const std::string cuda_msg = message([] { CZ_CHECK_STATUS(cudaErrorInvalidValue); });
  const std::string blas_msg = message([] { CZ_CHECK_STATUS(CUBLAS_STATUS_NOT_SUPPORTED); });
  const std::string dnn_msg = message([] { CZ_CHECK_STATUS(CUDNN_STATUS_BAD_PARAM); });
  set_log_prefix("");
  EXPECT_EQ(cuda_msg.rfind("[rank 3] CUDA error: cudaErrorInvalidValue", 0), 0u) << cuda_msg;
  EXPECT_NE(cuda_msg.find("`cudaErrorInvalidValue`"), std::string::npos) << cuda_msg;
  EXPECT_NE(cuda_msg.find("test_cuda_runtime.cpp:"), std::string::npos) << cuda_msg;
  EXPECT_NE(blas_msg.find("cuBLAS error: CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << blas_msg;
  EXPECT_NE(dnn_msg.find("cuDNN error: CUDNN_STATUS_BAD_PARAM"), std::string::npos) << dnn_msg;
  EXPECT_NO_THROW(CZ_CHECK_STATUS(cudaSuccess));
}

TEST(CudaAllocator, StatisticsTrackLiveCachedAndPeak) {
  CZ_REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  EXPECT_EQ(a.device(), gpu());
  a.empty_cache();
  a.reset_peak();
  const MemoryStats s0 = a.stats();
  const size_t big = round_to_size_class(10'000'000);
  void* first = nullptr;
  {
    Tensor t = empty({2'500'000}, DType::f32, gpu());
    first = t.storage()->data();
    const MemoryStats s1 = a.stats();
    EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, int64_t(big));
    EXPECT_EQ(s1.reserved_bytes - s0.reserved_bytes, int64_t(big));
    EXPECT_EQ(s1.num_allocs - s0.num_allocs, 1);
    EXPECT_EQ(s1.num_system_allocs - s0.num_system_allocs, 1);
  }
  const MemoryStats s2 = a.stats();
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s2.num_frees - s0.num_frees, 1);
  EXPECT_EQ(s2.peak_allocated_bytes - s0.allocated_bytes, int64_t(big));
  EXPECT_EQ(s2.reserved_bytes - s0.reserved_bytes, int64_t(big));  // still cached
  {
    Tensor t = empty({2'499'000}, DType::f32, gpu());  // same size class, same stream: the cached block
    EXPECT_EQ(t.storage()->data(), first);
    EXPECT_EQ(a.stats().num_system_allocs, s2.num_system_allocs);
  }
  a.reset_peak();
  EXPECT_EQ(a.stats().peak_allocated_bytes, a.stats().allocated_bytes);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, a.stats().allocated_bytes);  // nothing cached, nothing pending
}

TEST(CudaAllocator, OutOfMemoryIsAClearErrorAndLeavesTheAllocatorUsable) {
  CZ_REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  const MemoryStats before = a.stats();
  try {
    (void)a.allocate(size_t(1) << 50);  // 1 PiB
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const cuda::OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.stats().allocated_bytes, before.allocated_bytes);
  Tensor t = ones({1000}, DType::f32, gpu());  // no sticky error left behind
  EXPECT_EQ(sum(t).item(), 1000.0);
}

// Note [Cross-stream frees]: a block freed while a recorded side stream may still use it must not be handed
// out until that stream has passed the free; blocks of one stream are not handed to another stream.
TEST(CudaAllocator, BlockUsedOnASideStreamIsNotReusedWhileThatStreamIsBusy) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  Allocator& a = allocator_for(gpu());
  a.empty_cache();
  const Stream side = cuda::comm_stream(0);
  ASSERT_NE(side.handle, nullptr);
  const Shape shape{3'333'333};
  void* first = nullptr;
  Event done(gpu());
  {
    Tensor t = empty(shape, DType::f32, gpu());  // home stream: the current (default) stream
    first = t.storage()->data();
    {
      StreamGuard on_side(side);
      cuda::busy_wait(side, 300'000);  // 0.3 s
      t.fill_(1.0);                    // queued behind the wait: writes the block late
    }
    cuda::record_stream(t, side);
    done.record(side);
  }  // freed here, with the side stream's write still pending
  const bool side_still_busy = !done.query();
  Tensor u = empty(shape, DType::f32, gpu());
  u.fill_(2.0);
  if (side_still_busy) {
    EXPECT_NE(u.storage()->data(), first) << "block reused while the recorded stream still uses it";
  }
  done.synchronize();
  current_stream(gpu()).synchronize();
  // Whatever happened, the late write on the side stream must not have landed in u.
  EXPECT_TRUE(all_close(u, full(shape, 2.0), 0, 0));
  // Once the side stream is past the free, the block returns to its home stream's pool.
  Tensor v = empty(shape, DType::f32, gpu());
  if (side_still_busy) {
    EXPECT_EQ(v.storage()->data(), first);
  }
}

TEST(CudaAllocator, BlocksAreReusedOnTheirHomeStreamOnly) {
  CZ_REQUIRE_GPU();
  Allocator& a = allocator_for(gpu());
  a.empty_cache();
  const Stream s1 = cuda::copy_stream(0), s2 = cuda::compute_stream(0);
  const Shape shape{1'234'567};
  void* p1 = nullptr;
  {
    StreamGuard g(s1);
    Tensor t = empty(shape, DType::f32, gpu());
    p1 = t.storage()->data();
  }
  {
    StreamGuard g(s2);
    Tensor t = empty(shape, DType::f32, gpu());
    EXPECT_NE(t.storage()->data(), p1) << "a block of one stream handed to another without synchronisation";
  }
  {
    StreamGuard g(s1);
    Tensor t = empty(shape, DType::f32, gpu());
    EXPECT_EQ(t.storage()->data(), p1) << "stream-ordered reuse on the home stream";
  }
  // Temporaries allocated for an explicit stream go back to that stream's pool.
  void* p2 = nullptr;
  {
    DataPtr d = cuda::allocate(4'000'000, s2);
    p2 = d.get();
  }
  DataPtr d = cuda::allocate(4'000'000, s2);
  EXPECT_EQ(d.get(), p2);
  EXPECT_THROW(a.record_stream(static_cast<char*>(d.get()) + 4, s1), ValueError);  // not a block start
}

TEST(CudaAllocator, PinnedHostMemoryKeepsItsOwnStatisticsAndWaitsForRecordedCopies) {
  CZ_REQUIRE_GPU();
  Allocator& p = pinned_host_allocator();
  EXPECT_EQ(&p, &cuda::pinned_allocator());
  p.empty_cache();
  const MemoryStats cpu_before = allocator_for(Device::cpu()).stats();
  const MemoryStats before = p.stats();
  const size_t n = 8 << 20;
  Tensor dev = empty({int64_t(n / 4)}, DType::f32, gpu());
  const Stream side = cuda::copy_stream(0);
  void* first = nullptr;
  Event done(gpu());
  {
    DataPtr host = p.allocate(n);
    first = host.get();
    EXPECT_EQ(p.stats().allocated_bytes - before.allocated_bytes, int64_t(round_to_pinned_class(n)));
    std::memset(host.get(), 0, n);
    cuda::busy_wait(side, 300'000);
    cuda_runtime::memcpy_async(dev.raw_data(), host.get(), n, cuda_runtime::CopyKind::host_to_device, side);
    p.record_stream(host.get(), side);
    done.record(side);
  }
  const bool side_still_busy = !done.query();
  {
    DataPtr again = p.allocate(n);
    if (side_still_busy) {
      EXPECT_NE(again.get(), first) << "pinned block reused while an async copy from it is pending";
    }
  }
  done.synchronize();
  DataPtr later = p.allocate(n);
  EXPECT_TRUE(later.get() == first || !side_still_busy);
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, cpu_before.num_allocs);
}

TEST(CudaContext, HandlesAndNamedStreamsAreCreatedOnce) {
  CZ_REQUIRE_GPU();
  cuda::DeviceContext& ctx = cuda::context(0);
  EXPECT_EQ(&ctx, &cuda::context(0));
  EXPECT_GT(ctx.sm_count(), 0);
  const Stream c = cuda::compute_stream(0), m = cuda::comm_stream(0), k = cuda::copy_stream(0);
  EXPECT_NE(c.handle, nullptr);
  EXPECT_NE(c.handle, m.handle);
  EXPECT_NE(m.handle, k.handle);
  EXPECT_EQ(c, cuda::compute_stream(0));
  cublasHandle_t blas = nullptr;
  {
    auto lease = ctx.cublas(c);
    blas = lease.handle;
    EXPECT_NE(blas, nullptr);
  }
  EXPECT_EQ(ctx.cublas(m).handle, blas);
  {
    auto lt = ctx.cublaslt(c);
    EXPECT_NE(lt.handle, nullptr);
    EXPECT_NE(lt.workspace, nullptr);
    EXPECT_GE(lt.workspace_bytes, size_t(4) << 20);
  }
  EXPECT_NE(ctx.cudnn(c).handle, nullptr);
  EXPECT_THROW(cuda::context(cuda_device_count()), DeviceError);
}

// Note [Backend switches]: the switches live in each device's context with their documented defaults, the
// process-wide setters reach every visible device, and without a GPU those setters do nothing (no context is
// made, nothing throws).
TEST(CudaContext, SwitchesLiveInEachDeviceContextAndTheSettersReachEveryDevice) {
  auto set_all = [](bool on) {
    cuda::set_allow_tf32(on);
    cuda::set_gemm_epilogues(!on);
    cuda::set_conv_benchmark(on);
    cuda::set_reproducible(!on);
    cuda::set_depthwise_algo(on ? cuda::DepthwiseAlgo::cudnn : cuda::DepthwiseAlgo::tiled);
    cuda::set_patchify_gemm(on);
  };
  if (!cuda_available()) {
    EXPECT_NO_THROW(set_all(true));
    EXPECT_NO_THROW(cuda::clear_algorithm_caches());
    EXPECT_THROW(cuda::context(0), DeviceError);
    return;
  }
  auto expect_all = [](bool on, const std::string& when) {
    for (int d = 0; d < cuda_device_count(); ++d) {
      const cuda::DeviceContext& c = cuda::context(d);
      EXPECT_EQ(c.allow_tf32(), on) << when << ", cuda:" << d;
      EXPECT_EQ(c.gemm_epilogues(), !on) << when << ", cuda:" << d;
      EXPECT_EQ(c.conv_benchmark(), on) << when << ", cuda:" << d;
      EXPECT_EQ(c.reproducible(), !on) << when << ", cuda:" << d;
      EXPECT_EQ(c.depthwise_algo(), on ? cuda::DepthwiseAlgo::cudnn : cuda::DepthwiseAlgo::tiled)
          << when << ", cuda:" << d;
      EXPECT_EQ(c.patchify_gemm(), on) << when << ", cuda:" << d;
    }
  };
  expect_all(false, "defaults");
  set_all(true);
  expect_all(true, "after the process-wide setters");
  set_all(false);
  expect_all(false, "after setting them back");
  cuda::context(0).set_depthwise_algo(cuda::DepthwiseAlgo::direct);  // one device's own setter
  EXPECT_EQ(cuda::context(0).depthwise_algo(), cuda::DepthwiseAlgo::direct);
  cuda::context(0).set_depthwise_algo(cuda::DepthwiseAlgo::tiled);
}

// Note [Current device]: a guard restores a chosen device, and a thread that never chose one adopts the
// process's default device instead of falling back to device 0.
TEST(CudaContext, DeviceGuardsRestoreChosenDevicesAndThreadsAdoptTheDefault) {
  CZ_REQUIRE_GPU();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  cuda_runtime::set_device(1);
  {
    cuda::DeviceGuard g(0);
    int now = -1;
    ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, 0);
  }
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, 1);
  int seen = -1;
  std::thread([&] {
    (void)cuda::pinned_allocator().allocate(4096);
    (void)cudaGetDevice(&seen);
  }).join();
  EXPECT_EQ(seen, 1);
  cuda_runtime::set_device(0);
}

TEST(CudaStreams, EventsOrderWorkAcrossStreamsAndTime) {
  CZ_REQUIRE_GPU();
  NoGradGuard no_grad;
  const Stream a = cuda::compute_stream(0), b = cuda::comm_stream(0);
  Tensor t = zeros({1 << 20}, DType::f32, gpu());
  current_stream(gpu()).synchronize();
  Event start(gpu()), produced(gpu());
  start.record(a);
  cuda::busy_wait(a, 50'000);
  {
    StreamGuard g(a);
    t.fill_(3.0);
  }
  produced.record(a);
  produced.wait(b);  // b's work starts after a's fill
  cuda::record_stream(t, a);
  cuda::record_stream(t, b);
  {
    StreamGuard g(b);
    t.mul_(2.0);
  }
  b.synchronize();
  EXPECT_TRUE(produced.query());
  EXPECT_GT(start.elapsed_ms(produced), 0.0f);
  EXPECT_TRUE(all_close(t, full({1 << 20}, 6.0), 0, 0));
}

}  // namespace
}  // namespace cz::testing
