// The tiled 7x7 depthwise kernels without a GPU: their geometry (every output computed by exactly one thread,
// every strip's window inside the staged tile, shared memory and grid within limits) and their phases run on
// the CPU (depthwise_emulation.h) against the CPU backend, at odd sizes, in f32, bf16 and f16, through the
// 16-byte and the element-by-element staging paths.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <tuple>

#include "common/gradcheck.h"
#include "depthwise_emulation.h"
#include "tensor/cpu/kernels.h"

namespace cz::testing {
namespace {

namespace dw7 = cuda::dw7;

struct Size {
  int64_t n, h, w, c;
};

// ConvNeXt-T's four stages at batch 64, then odd sizes: C not a multiple of 8 (or above 32), H and W below
// the tile and not multiples of the strip, N = 1 and 3.
const std::vector<Size> kSizes = {{64, 56, 56, 96}, {64, 28, 28, 192}, {64, 14, 14, 384},
                                  {64, 7, 7, 768},  {1, 5, 9, 19},     {3, 9, 16, 40},
                                  {1, 1, 1, 3},     {3, 13, 30, 67},   {2, 33, 3, 8}};

TEST(DepthwiseTiles, EveryOutputIsComputedByExactlyOneThread) {
  for (const Size& z : kSizes)
    for (bool backward : {false, true})
      for (int elem : {2, 4})
        for (int sms : {1, 132}) {
          const dw7::Geometry g = dw7::plan(z.n, z.h, z.w, z.c, elem, backward, sms);
          SCOPED_TRACE(::testing::Message() << z.n << "x" << z.h << "x" << z.w << "x" << z.c << " backward "
                                            << backward << " elem " << elem << " sms " << sms);
          ASSERT_LE(g.strips(), backward ? dw7::kBackwardWarps : dw7::kForwardWarps);
          EXPECT_LE(backward ? dw7::backward_smem(g, elem) : dw7::forward_smem(g, elem), dw7::kSmemCap);
          EXPECT_TRUE(dw7::fits_grid(g, backward));
          EXPECT_GE(g.tiles_h * g.th(), z.h);
          EXPECT_GE(g.tiles_w * g.tw(), z.w);
          EXPECT_GE(g.batches * g.ni, z.n);
          // ConvNeXt's widths are multiples of the strip: no column computed outside the image.
          if (z.n == 64) {
            EXPECT_EQ(z.w % dw7::kRW, 0);
            EXPECT_EQ((g.tiles_w * g.tw()) % z.w, 0);
          }
          std::map<std::tuple<int64_t, int64_t, int64_t>, int> seen;  // (image, row, column) per lane 0
          const int64_t blocks = backward ? g.tiles() * g.nz : g.batches * g.tiles();
          for (int64_t bx = 0; bx < blocks; ++bx) {
            std::vector<dw7::Block> bs;
            if (backward)
              for (int64_t batch = dw7::backward_z(g, bx); batch < g.batches; batch += g.nz)
                bs.push_back(dw7::tile_block(g, batch, dw7::backward_tile(g, bx), 0));
            else
              bs.push_back(dw7::forward_block(g, bx, 0));
            for (const dw7::Block& b : bs)
              for (int warp = 0; warp < g.strips(); ++warp) {
                const dw7::Strip s = dw7::strip_of(g, warp);
                // The strip's window of staged inputs lies in the block's staged tile.
                ASSERT_LE(s.oh + dw7::kInH, g.sth());
                ASSERT_LE(s.ow + dw7::kInW, g.stw());
                ASSERT_LT(s.slot, g.ni);
                if (!dw7::strip_live(g, b, s)) continue;
                for (int o = 0; o < dw7::kRH; ++o)
                  for (int x = 0; x < dw7::kRW; ++x) {
                    const int64_t hh = b.h0 + s.oh + o, ww = b.w0 + s.ow + x;
                    if (hh < z.h && ww < z.w) ++seen[{b.batch * g.ni + s.slot, hh, ww}];
                  }
              }
          }
          EXPECT_EQ(int64_t(seen.size()), z.n * z.h * z.w);
          for (const auto& [pixel, count] : seen) ASSERT_EQ(count, 1);
        }
}

// Host buffers whose first element is 16-byte aligned (or, with misalign, one element past that: the
// element-by-element staging path).
template <class T>
struct HostBuf {
  std::vector<unsigned char> bytes;
  T* p;
  HostBuf(const Tensor& t, bool misalign) : bytes(size_t(t.numel()) * sizeof(T) + 32) {
    uintptr_t a = (reinterpret_cast<uintptr_t>(bytes.data()) + 15) & ~uintptr_t(15);
    p = reinterpret_cast<T*>(a) + (misalign ? 1 : 0);
    if (t.numel() > 0)
      std::memcpy(static_cast<void*>(p), t.contiguous().raw_data(), size_t(t.numel()) * sizeof(T));
  }
  HostBuf(int64_t numel, bool misalign) : bytes(size_t(numel) * sizeof(T) + 32) {
    uintptr_t a = (reinterpret_cast<uintptr_t>(bytes.data()) + 15) & ~uintptr_t(15);
    p = reinterpret_cast<T*>(a) + (misalign ? 1 : 0);
  }
  Tensor tensor(const Shape& shape) const {
    Tensor t = empty(shape, dtype_of<T>);
    if (t.numel() > 0) std::memcpy(t.raw_data(), static_cast<const void*>(p), size_t(t.numel()) * sizeof(T));
    return t.to(DType::f32);
  }
};

struct Result {
  Tensor y, dx, dw, db;
};

// The emulated kernels in T on inputs rounded to T.
template <class T>
Result emulate(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy, bool misalign, int sms) {
  const DType t = dtype_of<T>;
  const int64_t n = x.size(0), h = x.size(1), ww = x.size(2), c = x.size(3);
  HostBuf<T> hx(x.to(t), misalign), hw(w.to(t), misalign), hb(b.to(t), misalign), hg(gy.to(t), misalign);
  HostBuf<T> y(x.numel(), misalign), dx(x.numel(), misalign), dw(w.numel(), misalign), db(c, misalign);
  emulate_depthwise7_forward<T>(hx.p, hw.p, hb.p, y.p, n, h, ww, c, false, sms);
  emulate_depthwise7_backward<T>(hg.p, hx.p, hw.p, dx.p, dw.p, db.p, n, h, ww, c, sms);
  return {y.tensor(x.sizes()), dx.tensor(x.sizes()), dw.tensor(w.sizes()), db.tensor({c})};
}

// The CPU backend in f32 on the same inputs rounded to `round`.
Result cpu_reference(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy, DType round) {
  auto r = [&](const Tensor& t) { return t.to(round).to(DType::f32); };
  const Tensor xr = r(x), wr = r(w), br = r(b), gr = r(gy);
  Result out{empty(x.sizes()), empty(x.sizes()), empty(w.sizes()), empty({x.size(3)})};
  cpu::depthwise_conv2d_forward(xr, wr, br, out.y);
  cpu::depthwise_conv2d_backward(gr, xr, wr, out.dx, out.dw, out.db);
  return out;
}

void expect_close(const Result& got, const Result& ref, double tol, const std::string& what) {
  EXPECT_TRUE(all_close(got.y, ref.y, tol, tol)) << what << ": forward";
  EXPECT_TRUE(all_close(got.dx, ref.dx, tol, tol)) << what << ": dx";
  // dw and db sum N H W products: compare relative to their size.
  EXPECT_TRUE(all_close(got.dw, ref.dw, tol, tol * 10)) << what << ": dw";
  EXPECT_TRUE(all_close(got.db, ref.db, tol, tol * 10)) << what << ": db";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.to_vector<float>() == b.to_vector<float>();
}

TEST(DepthwiseTiles, EmulatedKernelsMatchTheCpuBackend) {
  const std::vector<Size> sizes = {
      {1, 5, 9, 19}, {3, 9, 16, 40}, {1, 1, 1, 3}, {3, 13, 30, 67}, {2, 7, 7, 8}};
  uint64_t seed = 100;
  for (const Size& z : sizes) {
    const Tensor x = random_tensor({z.n, z.h, z.w, z.c}, seed++, DType::f32);
    const Tensor w = random_tensor({7, 7, z.c}, seed++, DType::f32);
    const Tensor b = random_tensor({z.c}, seed++, DType::f32);
    const Tensor gy = random_tensor({z.n, z.h, z.w, z.c}, seed++, DType::f32);
    const std::string name = ::testing::PrintToString(std::vector<int64_t>{z.n, z.h, z.w, z.c});
    for (int sms : {1, 132}) {
      const Result f32 = emulate<float>(x, w, b, gy, false, sms);
      expect_close(f32, cpu_reference(x, w, b, gy, DType::f32), 1e-5, name + " f32");
      expect_close(emulate<BFloat16>(x, w, b, gy, false, sms), cpu_reference(x, w, b, gy, DType::bf16), 2e-2,
                   name + " bf16");
      expect_close(emulate<Half>(x, w, b, gy, false, sms), cpu_reference(x, w, b, gy, DType::f16), 1e-2,
                   name + " f16");
      // The element-by-element staging path gives the 16-byte path's bits.
      const Result scalar = emulate<float>(x, w, b, gy, true, sms);
      EXPECT_TRUE(same_bits(scalar.y, f32.y) && same_bits(scalar.dx, f32.dx) &&
                  same_bits(scalar.dw, f32.dw) && same_bits(scalar.db, f32.db))
          << name;
    }
  }
}

// The weight-gradient partials: dw and db alone (no dx), and with more image subsets than images per block.
TEST(DepthwiseTiles, FilterGradientWithoutInputGradient) {
  const Size z{5, 6, 11, 33};
  const Tensor x = random_tensor({z.n, z.h, z.w, z.c}, 7, DType::f32);
  const Tensor w = random_tensor({7, 7, z.c}, 8, DType::f32);
  const Tensor gy = random_tensor({z.n, z.h, z.w, z.c}, 9, DType::f32);
  HostBuf<float> hx(x, false), hw(w, false), hg(gy, false), dw(w.numel(), false), db(z.c, false);
  emulate_depthwise7_backward<float>(hg.p, hx.p, hw.p, nullptr, dw.p, db.p, z.n, z.h, z.w, z.c, 132);
  Tensor rdx, rdw = empty(w.sizes()), rdb = empty({z.c});
  cpu::depthwise_conv2d_backward(gy, x, w, rdx, rdw, rdb);
  EXPECT_TRUE(all_close(dw.tensor(w.sizes()), rdw, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(db.tensor({z.c}), rdb, 1e-5, 1e-4));
  EXPECT_GT(dw7::plan(z.n, z.h, z.w, z.c, 4, true, 132).nz, 1);
}

}  // namespace
}  // namespace cz::testing
