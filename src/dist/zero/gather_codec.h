// What parameters travel in when they are all-gathered (--gather-dtype): the compute copy itself, a 16-bit
// cast of it, or block-quantized INT8 records (Note [Quantized gathers]). The gatherers encode this rank's
// chunk into its record once per update and decode the gathered records into the compute copy.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace cz::zero {

// Note [Quantized gathers]: with --gather-dtype int8, each rank quantizes its own chunk of every partition
// (from its fp32 master: Note [Quantized blocks] in dist/comm/quant.h, blocks of B values starting at the
// chunk's first element) into one record, once per update (and after a load or an EMA swap); the records of
// a partition's N chunks are all-gathered as bytes and every rank, the owner included, dequantizes all N
// into the compute copy, so every rank computes with the same weights. The master weights and the optimizer
// never see the error: the next update starts from exact fp32 values, and the next quantization is of those,
// so no error carries from step to step. The layout aligns every parameter to B elements and pads each
// partition to a multiple of N x B (ZeroLayout's align), so no block mixes two tensors (a LayerNorm's gamma
// beside conv weights would round to 0: docs/zero.md, "Choosing B") and every chunk starts a block.
// Checkpoints hold the fp32 master, in per-tensor ranges, so they load at any world size and with or
// without quantization.
class GatherCodec {
 public:
  enum class Kind { direct, cast, int8 };
  // `wire`: f32/bf16/f16 (narrowed to `compute` when wider: the compute copy is what travels), or u8 for
  // INT8 blocks of `block` values.
  GatherCodec(DType compute, DType wire, int64_t block);

  Kind kind() const { return kind_; }
  bool direct() const { return kind_ == Kind::direct; }  // the compute chunks themselves are gathered
  DType wire_dtype() const { return wire_; }             // of a record's elements (u8 for INT8)
  int64_t block() const { return block_; }
  // Elements (of wire_dtype) of the record of a chunk of `chunk` values.
  int64_t record_numel(int64_t chunk) const;
  int64_t record_bytes(int64_t chunk) const { return record_numel(chunk) * int64_t(dtype_size(wire_)); }
  // The alignment of the flat layout this codec needs (B for INT8, else 16).
  int64_t align() const;

  // src: `chunk` values (f32, or the compute dtype), on the device; record: record_numel(chunk) of
  // wire_dtype.
  void encode(const Tensor& src, const Tensor& record) const;
  // wire: `n` records of chunks of `chunk` values back to back; out: n x chunk values of the compute dtype.
  void decode(const Tensor& wire, int64_t n, int64_t chunk, const Tensor& out) const;

 private:
  Kind kind_ = Kind::direct;
  DType compute_ = DType::f32, wire_ = DType::f32;
  int64_t block_ = 0;
};

}  // namespace cz::zero
