// The tiled 7x7 depthwise kernels run on the CPU: every block of the launch, every thread of a block, phase
// after phase (a barrier ends a phase), through the same functions of depthwise_tiles.h the kernels call and
// with the launchers' geometry. The same FMAs in the same order with the same roundings: the kernels' bits,
// without a GPU (test_depthwise_tiles.cpp checks them against the CPU backend; with a GPU, test_cuda_ops.cpp
// checks the kernels against them bit for bit).
#pragma once

#include <type_traits>
#include <vector>

#include "tensor/cuda/depthwise_tiles.h"
#include "tensor/half.h"

namespace cz::testing {

struct HostCvt {
  static float in(float v) { return v; }
  static float in(BFloat16 v) { return float(v); }
  static float in(Half v) { return float(v); }
  template <class T>
  static T out(float v) {
    if constexpr (std::is_same_v<T, float>)
      return v;
    else
      return T(v);
  }
};

// One block's shared memory, 16-byte aligned.
struct HostSmem {
  std::vector<float> words;
  explicit HostSmem(int64_t bytes) : words(size_t((bytes + 15) / 16 * 4), -1.f) {}
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(words.data()); }
};

// launch::depthwise7_forward (flip = false) and depthwise7_backward_data (flip = true, bias null).
template <class T>
void emulate_depthwise7_forward(const T* x, const T* wt, const T* bias, T* y, int64_t n, int64_t h, int64_t w,
                                int64_t c, bool flip, int sm_count) {
  namespace dw7 = cuda::dw7;
  const dw7::Geometry g = dw7::plan(n, h, w, c, int(sizeof(T)), false, sm_count);
  const bool vec = dw7::vector_ok(x, c);
  for (int64_t bx = 0; bx < g.batches * g.tiles(); ++bx)
    for (int64_t by = 0; by < g.cgroups; ++by) {
      HostSmem smem(dw7::forward_smem(g, int(sizeof(T))));
      float* wsm = reinterpret_cast<float*>(smem.bytes());
      T* buf = reinterpret_cast<T*>(smem.bytes() + dw7::kWeightBytes);
      const dw7::Block b = dw7::forward_block(g, bx, by);
      for (int tid = 0; tid < g.threads(); ++tid) {
        if (flip)
          dw7::stage_weights<T, HostCvt, true>(wt, g, b, wsm, tid);
        else
          dw7::stage_weights<T, HostCvt, false>(wt, g, b, wsm, tid);
        dw7::stage<T, HostCvt>(x, g, b, vec, buf, tid);
      }
      for (int tid = 0; tid < g.threads(); ++tid)
        dw7::forward_strip<T, HostCvt>(g, b, buf, wsm, bias, y, tid);
    }
}

// launch::depthwise7_backward: any of dx, dw, db may be null (not all three).
template <class T>
void emulate_depthwise7_backward(const T* gy, const T* x, const T* wt, T* dx, T* dw, T* db, int64_t n,
                                 int64_t h, int64_t w, int64_t c, int sm_count) {
  namespace dw7 = cuda::dw7;
  if (!dw && !db)
    return emulate_depthwise7_forward(gy, wt, static_cast<const T*>(nullptr), dx, n, h, w, c, true, sm_count);
  const dw7::Geometry g = dw7::plan(n, h, w, c, int(sizeof(T)), true, sm_count);
  std::vector<float> partial(size_t(g.partials() * dw7::kSlots * c), -1.f);
  const bool vec_gy = dw7::vector_ok(gy, c), vec_x = dw7::vector_ok(x, c);
  dw7::Geometry finish = g;
  if (n * h * w == 0) finish.nz = 0;
  for (int64_t bx = 0; n * h * w > 0 && bx < g.tiles() * g.nz; ++bx)
    for (int64_t by = 0; by < g.cgroups; ++by) {
      HostSmem smem(dw7::backward_smem(g, int(sizeof(T))));
      float* wsm = reinterpret_cast<float*>(smem.bytes());
      T* buf = reinterpret_cast<T*>(smem.bytes() + dw7::kWeightBytes);
      float* sums = reinterpret_cast<float*>(smem.bytes() + dw7::forward_smem(g, int(sizeof(T))));
      const int64_t tile = dw7::backward_tile(g, bx), z = dw7::backward_z(g, bx);
      std::vector<dw7::GyStrip> gs(size_t(g.threads()));
      for (int tid = 0; tid < g.threads(); ++tid) {
        if (dx) dw7::stage_weights<T, HostCvt, true>(wt, g, dw7::tile_block(g, 0, tile, by), wsm, tid);
        dw7::zero_sums(g, sums, tid);
      }
      for (int64_t batch = z; batch < g.batches; batch += g.nz) {
        const dw7::Block b = dw7::tile_block(g, batch, tile, by);
        for (int tid = 0; tid < g.threads(); ++tid) dw7::stage<T, HostCvt>(gy, g, b, vec_gy, buf, tid);
        for (int tid = 0; tid < g.threads(); ++tid) {
          if (dx) dw7::forward_strip<T, HostCvt>(g, b, buf, wsm, nullptr, dx, tid);
          dw7::load_gy<T, HostCvt>(g, b, buf, gs[size_t(tid)], tid);
        }
        for (int tid = 0; tid < g.threads(); ++tid) dw7::stage<T, HostCvt>(x, g, b, vec_x, buf, tid);
        for (int tid = 0; tid < g.threads(); ++tid)
          dw7::accumulate_filter<T, HostCvt>(g, b, buf, gs[size_t(tid)], sums, tid);
      }
      for (int tid = 0; tid < g.threads(); ++tid)
        dw7::write_partial(g, dw7::tile_block(g, 0, tile, by), tile * g.nz + z, sums, partial.data(), tid);
    }
  for (int64_t i = 0; i < int64_t(dw7::kSlots) * c; ++i)
    dw7::finish_item<T, HostCvt>(finish, partial.data(), dw, db, i);
}

}  // namespace cz::testing
