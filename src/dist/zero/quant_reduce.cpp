// Note [Quantized reduction] (quant_reduce.h): the records, the all-to-all, the fp32 sum. Host kernels on the
// CPU; on CUDA the kernels of dist/comm/cuda/quant_kernels.h on the current stream (compiled, never run).
#include "dist/zero/quant_reduce.h"

#include "dist/comm/quant.h"
#include "dist/zero/gather_codec.h"
#include "optim/clip.h"
#include "tensor/autograd/engine.h"
#include "tensor/check.h"
#include "tensor/ops.h"

#if CZ_WITH_CUDA
#include "dist/comm/cuda/cuda_check.h"
#include "dist/comm/cuda/quant_kernels.h"
#include "tensor/stream.h"
#endif

namespace cz::zero {
namespace {

// acc = deq(record) + acc, in f32.
void dequantize_add(const uint8_t* record, int64_t n, int64_t block, const Tensor& acc) {
  const auto* q = reinterpret_cast<const int8_t*>(record);
  const auto* s = reinterpret_cast<const float*>(record + dist::quant_scales_offset(n));
  auto* a = static_cast<float*>(acc.raw_data());
  if (!acc.device().is_cuda()) return dist::dequantize_add_quantize(q, s, a, n, block, nullptr, nullptr, a);
#if CZ_WITH_CUDA
  const auto st = static_cast<cudaStream_t>(current_stream(acc.device()).handle);
  CZ_CUDA_COMM(dist::cuda::dequantize_add_quantize(q, s, a, n, block, nullptr, nullptr, a, st));
  return;
#endif
  CZ_CHECK_DEVICE(false, "quantized reduction: no kernels for {}", acc.device().str());
}

// A records buffer of `bytes`, counted by the meter while it lives.
Tensor hold_records(int64_t bytes, Device device, CommMeter& meter) {
  Tensor records = empty({bytes}, DType::u8, device);
  meter.hold(int64_t(round_to_size_class(records.storage()->nbytes())));
  return records;
}

void release_records(Tensor& records, CommMeter& meter) noexcept {
  if (!records.defined()) return;
  meter.hold(-int64_t(round_to_size_class(records.storage()->nbytes())));
  records = Tensor();
}

}  // namespace

void exchange_records(const dist::ProcessGroup& group, const std::function<Tensor(int)>& send_of,
                      const std::function<Tensor(int)>& recv_of, std::vector<dist::WorkHandle>& works,
                      CommMeter& meter) {
  const int n = group.size(), me = group.rank();
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n, from = (me - k + n) % n;
    const Tensor out = send_of(to);
    works.push_back(group.send(out, to));
    Tensor in = recv_of(from);
    works.push_back(group.recv(in, from));
    meter.sent_to(group, to, out.nbytes());
  }
}

int64_t quantized_reduce_buffer_bytes(int n, int64_t chunk, int64_t block) {
  return 2 * int64_t(n) * dist::quant_packed_bytes(chunk, block);
}

QuantizedReduceScatter::QuantizedReduceScatter(const dist::ProcessGroup& group, const Tensor& bucket,
                                               int64_t chunk, int64_t block, CommMeter& meter)
    : group_(group),
      bucket_(bucket),
      chunk_(chunk),
      block_(block),
      record_bytes_(dist::quant_packed_bytes(chunk, block)),
      meter_(meter) {
  const int n = group_.size(), me = group_.rank();
  CZ_ASSERT(bucket_.dtype() == DType::f32 && bucket_.numel() == n * chunk && bucket_.is_contiguous(),
            "quantized reduction: a bucket {} for {} chunks of {}", bucket_.str(), n, chunk);
  records_ = hold_records(quantized_reduce_buffer_bytes(n, chunk, block), bucket_.device(), meter_);
  NoGradGuard no_grad;
  const GatherCodec codec(DType::f32, DType::u8, block);
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    codec.encode(bucket_.narrow(0, to * chunk, chunk), records_.narrow(0, to * record_bytes_, record_bytes_));
  }
  exchange_records(
      group_, [&](int to) { return records_.narrow(0, to * record_bytes_, record_bytes_); },
      [&](int from) { return records_.narrow(0, (n + from) * record_bytes_, record_bytes_); }, works_,
      meter_);
}

QuantizedReduceScatter::~QuantizedReduceScatter() {
  dist::settle(works_);
  release_records(records_, meter_);
}

void QuantizedReduceScatter::finish(double scale) {
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  NoGradGuard no_grad;
  const int n = group_.size(), me = group_.rank();
  Tensor mine = bucket_.narrow(0, me * chunk_, chunk_);
  const auto* base = static_cast<const uint8_t*>(records_.raw_data());
  for (int r = 0; r < n; ++r)
    if (r != me) dequantize_add(base + (n + r) * record_bytes_, chunk_, block_, mine);
  if (scale != 1.0) scale_(mine, scale);
  release_records(records_, meter_);
}

int64_t quantized_all_reduce_buffer_bytes(int n, int64_t chunk, int64_t block) {
  return int64_t(n) * dist::quant_packed_bytes(chunk, block);
}

QuantizedAllReduce::QuantizedAllReduce(const dist::ProcessGroup& group, const Tensor& bucket, int64_t block,
                                       CommMeter& meter)
    : group_(group),
      bucket_(bucket),
      chunk_(bucket.numel() / group.size()),
      block_(block),
      record_bytes_(dist::quant_packed_bytes(chunk_, block)),
      meter_(meter) {
  const int n = group_.size();
  CZ_ASSERT(bucket_.numel() == n * chunk_ && chunk_ % block == 0,
            "quantized all-reduce: a bucket of {} values is not {} chunks of whole blocks of {}",
            bucket_.numel(), n, block);
  scatter_ = std::make_unique<QuantizedReduceScatter>(group_, bucket_, chunk_, block_, meter_);
  records_ = hold_records(quantized_all_reduce_buffer_bytes(n, chunk_, block_), bucket_.device(), meter_);
}

QuantizedAllReduce::~QuantizedAllReduce() {
  dist::settle(works_);
  release_records(records_, meter_);
}

void QuantizedAllReduce::finish(double scale) {
  scatter_->finish(scale);
  const int n = group_.size(), me = group_.rank();
  NoGradGuard no_grad;
  const GatherCodec codec(DType::f32, DType::u8, block_);
  codec.encode(bucket_.narrow(0, me * chunk_, chunk_), records_.narrow(0, me * record_bytes_, record_bytes_));
  const Tensor mine = records_.narrow(0, me * record_bytes_, record_bytes_);
  exchange_records(
      group_, [&](int) { return mine; },
      [&](int from) { return records_.narrow(0, from * record_bytes_, record_bytes_); }, works_, meter_);
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  codec.decode(records_, n, chunk_, bucket_);
  release_records(records_, meter_);
  scatter_.reset();
}

}  // namespace cz::zero
