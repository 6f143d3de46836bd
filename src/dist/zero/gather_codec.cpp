// The encodings of a gathered chunk (Note [Quantized gathers]): host kernels on the CPU, the CUDA kernels of
// dist/comm/cuda/quant_kernels.h on the current stream (compiled, not run: no GPU here).
#include "dist/zero/gather_codec.h"

#include <bit>

#include "dist/comm/quant.h"
#include "tensor/check.h"
#include "tensor/half.h"

#if CZ_WITH_CUDA
#include "dist/comm/cuda/cuda_check.h"
#include "dist/comm/cuda/quant_kernels.h"
#include "tensor/stream.h"
#endif

namespace cz::zero {
namespace {

#if CZ_WITH_CUDA
cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(current_stream(t.device()).handle);
}
#endif

void quantize_on(const Tensor& x, int64_t n, int64_t block, int8_t* q, float* s) {
  if (!x.device().is_cuda()) return dist::quantize(x.dtype(), x.raw_data(), n, block, q, s);
#if CZ_WITH_CUDA
  const cudaStream_t st = stream_of(x);
  switch (x.dtype()) {
    case DType::f32:
      CZ_CUDA_COMM(dist::cuda::quantize_f32(x.raw_data(), n, block, q, s, st));
      return;
    case DType::bf16:
      CZ_CUDA_COMM(dist::cuda::quantize_bf16(x.raw_data(), n, block, q, s, st));
      return;
    case DType::f16:
      CZ_CUDA_COMM(dist::cuda::quantize_f16(x.raw_data(), n, block, q, s, st));
      return;
    default:
      break;
  }
#endif
  CZ_CHECK_DEVICE(false, "gather: cannot quantize {} on {}", dtype_name(x.dtype()), x.device().str());
}

void dequantize_on(const int8_t* q, const float* s, int64_t n, int64_t block, const Tensor& out) {
  if (!out.device().is_cuda()) return dist::dequantize(q, s, n, block, out.dtype(), out.raw_data());
#if CZ_WITH_CUDA
  const cudaStream_t st = stream_of(out);
  switch (out.dtype()) {
    case DType::f32:
      CZ_CUDA_COMM(dist::cuda::dequantize_f32(q, s, n, block, out.raw_data(), st));
      return;
    case DType::bf16:
      CZ_CUDA_COMM(dist::cuda::dequantize_bf16(q, s, n, block, out.raw_data(), st));
      return;
    case DType::f16:
      CZ_CUDA_COMM(dist::cuda::dequantize_f16(q, s, n, block, out.raw_data(), st));
      return;
    default:
      break;
  }
#endif
  CZ_CHECK_DEVICE(false, "gather: cannot dequantize into {} on {}", dtype_name(out.dtype()),
                  out.device().str());
}

}  // namespace

GatherCodec::GatherCodec(DType compute, DType wire, int64_t block) : compute_(compute), wire_(wire) {
  if (wire == DType::u8) {
    dist::check_quant_block(block);
    kind_ = Kind::int8;
    block_ = block;
    return;
  }
  CZ_CHECK_DTYPE(wire == DType::f32 || wire == DType::bf16 || wire == DType::f16,
                 "gather: parameters travel in f32, bf16, f16 or INT8 blocks, not {}", dtype_name(wire));
  // Never wider than the compute copy: with 16-bit compute the compute copy itself travels.
  if (dtype_size(wire) >= dtype_size(compute)) wire_ = compute;
  kind_ = wire_ == compute ? Kind::direct : Kind::cast;
}

int64_t GatherCodec::record_numel(int64_t chunk) const {
  return kind_ == Kind::int8 ? dist::quant_packed_bytes(chunk, block_) : chunk;
}

int64_t GatherCodec::align() const {
  return kind_ == Kind::int8 ? block_ : 16;
}

void GatherCodec::encode(const Tensor& src, const Tensor& record) const {
  const int64_t n = src.numel();
  CZ_ASSERT(src.is_contiguous() && record.is_contiguous() && record.numel() == record_numel(n) &&
                record.dtype() == wire_,
            "gather: a record of {} for a chunk of {}", record.str(), n);
  if (kind_ != Kind::int8) {
    Tensor(record).copy_(src);  // a cast (or, direct, a copy)
    return;
  }
  auto* base = static_cast<uint8_t*>(record.raw_data());
  quantize_on(src, n, block_, reinterpret_cast<int8_t*>(base),
              reinterpret_cast<float*>(base + dist::quant_scales_offset(n)));
}

void GatherCodec::decode(const Tensor& wire, int64_t n, int64_t chunk, const Tensor& out) const {
  CZ_ASSERT(wire.numel() == n * record_numel(chunk) && out.numel() == n * chunk && out.is_contiguous() &&
                out.dtype() == compute_,
            "gather: {} records of {} into {}", n, wire.str(), out.str());
  if (kind_ == Kind::cast) {
    // Raw, not copy_: the unit's buffer is viewed by tensors autograd saved, and a re-gathered unit holds
    // the same values, so its storage version must not move (Note [Releasable storage]).
    CZ_CHECK_DEVICE(!out.device().is_cuda(),
                    "gather: --gather-dtype {} with fp32 compute runs on the CPU only (no CUDA cast kernel)",
                    dtype_name(wire_));
    float* y = static_cast<float*>(out.raw_data());
    const auto* x = static_cast<const uint16_t*>(wire.raw_data());
    const int64_t total = n * chunk;
    if (wire_ == DType::bf16)
      for (int64_t i = 0; i < total; ++i) y[i] = std::bit_cast<float>(uint32_t(x[i]) << 16);
    else
      for (int64_t i = 0; i < total; ++i) y[i] = Half::to_float(x[i]);
    return;
  }
  if (kind_ == Kind::direct) {
    Tensor(out).copy_(wire);
    return;
  }
  const int64_t rb = record_numel(chunk);
  const auto* base = static_cast<const uint8_t*>(wire.raw_data());
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* rec = base + r * rb;
    dequantize_on(reinterpret_cast<const int8_t*>(rec),
                  reinterpret_cast<const float*>(rec + dist::quant_scales_offset(chunk)), chunk, block_,
                  out.narrow(0, r * chunk, chunk));
  }
}

}  // namespace cz::zero
