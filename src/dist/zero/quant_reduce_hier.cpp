// Note [Two-hop quantized reduction] (quant_reduce_hier.h): hop 1 inside the host, the fp32 partial sums,
// hop 2 across hosts. Host kernels (a CUDA bucket is refused: the quantized reductions' CUDA kernels have not
// run on a GPU yet, and this path has no caller for them).
#include "dist/zero/quant_reduce_hier.h"

#include <algorithm>

#include "dist/comm/quant.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/held_bytes.h"
#include "dist/zero/quant_reduce.h"
#include "optim/clip.h"
#include "tensor/autograd/engine.h"
#include "tensor/check.h"
#include "tensor/ops.h"

namespace cz::zero {
namespace {

// acc[0, n) = deq(record) + acc, in f32 (one fma per value).
void dequantize_add(const uint8_t* record, int64_t n, int64_t block, float* acc) {
  const auto* q = reinterpret_cast<const int8_t*>(record);
  const auto* s = reinterpret_cast<const float*>(record + dist::quant_scales_offset(n));
  dist::dequantize_add_quantize(q, s, acc, n, block, nullptr, nullptr, acc);
}

}  // namespace

bool two_hop_applies(const dist::ProcessGroup& group, const dist::HostMap& hosts) {
  if (hosts.num_hosts() < 2 || hosts.ranks_per_host() < 2) return false;
  const std::vector<int>& r = group.ranks();
  if (int(r.size()) != int(hosts.host_of.size())) return false;
  for (size_t i = 0; i < r.size(); ++i)
    if (r[i] != int(i)) return false;
  return true;
}

int64_t two_hop_records_bytes(int hosts, int ranks_per_host, int64_t chunk, int64_t block) {
  const int64_t rec = dist::quant_packed_bytes(chunk, block);
  return 2 * int64_t(ranks_per_host) * hosts * rec + 2 * int64_t(hosts) * rec;
}

int64_t TwoHopQuantizedReduceScatter::chunk_index(int h, int l) const {
  return hosts_.ranks[size_t(h)][size_t(l)];  // the group is the world in rank order (two_hop_applies)
}

TwoHopQuantizedReduceScatter::TwoHopQuantizedReduceScatter(const dist::ProcessGroup& group,
                                                           const dist::ProcessGroup& host,
                                                           const dist::ProcessGroup& cross,
                                                           const dist::HostMap& hosts, const Tensor& bucket,
                                                           int64_t chunk, int64_t block, CommMeter& meter)
    : group_(group),
      host_(host),
      cross_(cross),
      hosts_(hosts),
      bucket_(bucket),
      chunk_(chunk),
      block_(block),
      record_bytes_(dist::quant_packed_bytes(chunk, block)),
      meter_(meter) {
  CZ_CHECK(two_hop_applies(group_, hosts_),
           "two-hop quantized reduction: needs the world over several hosts of the same number (> 1) of "
           "ranks; {} ranks on {} hosts",
           group_.size(), hosts_.num_hosts());
  const int nh = cross_.size(), nr = host_.size(), l = host_.rank();
  CZ_CHECK(nh == hosts_.num_hosts() && nr == hosts_.ranks_per_host(),
           "two-hop quantized reduction: host group of {} and cross group of {} ranks for {} hosts of {}", nr,
           nh, hosts_.num_hosts(), hosts_.ranks_per_host());
  CZ_CHECK_DEVICE(!bucket_.device().is_cuda(), "two-hop quantized reduction: CPU buckets only, not {}",
                  bucket_.device().str());
  CZ_ASSERT(
      bucket_.dtype() == DType::f32 && bucket_.numel() == int64_t(nh) * nr * chunk && bucket_.is_contiguous(),
      "two-hop quantized reduction: a bucket {} for {} chunks of {}", bucket_.str(), nh * nr, chunk);
  records_ = empty({two_hop_records_bytes(nh, nr, chunk, block)}, DType::u8, bucket_.device());
  partial_ = empty({two_hop_partial_bytes(nh, chunk) / 4}, DType::f32, bucket_.device());
  meter_.hold(held_bytes(records_) + held_bytes(partial_));
  NoGradGuard no_grad;
  const GatherCodec codec(DType::f32, DType::u8, block);
  const int64_t slot = int64_t(nh) * record_bytes_;  // one peer's message: H records
  for (int k = 1; k < nr; ++k) {
    const int to = (l + k) % nr;
    for (int h = 0; h < nh; ++h)
      codec.encode(bucket_.narrow(0, chunk_index(h, to) * chunk, chunk),
                   records_.narrow(0, to * slot + h * record_bytes_, record_bytes_));
  }
  exchange_records(
      host_, [&](int to) { return records_.narrow(0, to * slot, slot); },
      [&](int from) { return records_.narrow(0, (nr + from) * slot, slot); }, works_, meter_);
}

TwoHopQuantizedReduceScatter::~TwoHopQuantizedReduceScatter() {
  dist::settle(works_);
  if (records_.defined()) meter_.hold(-(held_bytes(records_) + held_bytes(partial_)));
}

bool TwoHopQuantizedReduceScatter::post_hop2_if_ready() {
  if (hop2_posted_) return true;
  for (const auto& w : works_)
    if (w && !w->is_completed()) return false;
  post_hop2();
  return true;
}

void TwoHopQuantizedReduceScatter::post_hop2() {
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  NoGradGuard no_grad;
  const int nh = cross_.size(), nr = host_.size(), l = host_.rank(), me_h = cross_.rank();
  const int64_t slot = int64_t(nh) * record_bytes_;
  auto* base = static_cast<uint8_t*>(records_.raw_data());
  auto* p = static_cast<float*>(partial_.raw_data());
  // The host's partial sums of the chunks cross group l owns: own fp32 values, then the host peers' records
  // in local order.
  for (int h = 0; h < nh; ++h) {
    float* ph = p + h * chunk_;
    const float* own = static_cast<const float*>(bucket_.raw_data()) + chunk_index(h, l) * chunk_;
    std::copy(own, own + chunk_, ph);
    for (int r = 0; r < nr; ++r)
      if (r != l) dequantize_add(base + (nr + r) * slot + h * record_bytes_, chunk_, block_, ph);
  }
  // Hop 2: each other host's partial, quantized once more, to its owner; ours stays fp32.
  uint8_t* out2 = base + 2 * int64_t(nr) * slot;
  for (int h = 0; h < nh; ++h)
    if (h != me_h)
      dist::quantize(DType::f32, p + h * chunk_, chunk_, block_,
                     reinterpret_cast<int8_t*>(out2 + h * record_bytes_),
                     reinterpret_cast<float*>(out2 + h * record_bytes_ + dist::quant_scales_offset(chunk_)));
  const int64_t off2 = 2 * int64_t(nr) * slot;
  exchange_records(
      cross_, [&](int to) { return records_.narrow(0, off2 + to * record_bytes_, record_bytes_); },
      [&](int from) { return records_.narrow(0, off2 + slot + from * record_bytes_, record_bytes_); }, works_,
      meter_);
  hop2_posted_ = true;
}

void TwoHopQuantizedReduceScatter::finish(double scale) {
  if (!hop2_posted_) post_hop2();
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  NoGradGuard no_grad;
  const int nh = cross_.size(), me_h = cross_.rank();
  const int64_t slot = int64_t(nh) * record_bytes_;
  auto* p = static_cast<float*>(partial_.raw_data());
  const uint8_t* in2 = static_cast<uint8_t*>(records_.raw_data()) + 2 * int64_t(host_.size()) * slot + slot;
  float* mine = p + me_h * chunk_;
  for (int h = 0; h < nh; ++h)
    if (h != me_h) dequantize_add(in2 + h * record_bytes_, chunk_, block_, mine);
  Tensor out = bucket_.narrow(0, int64_t(group_.rank()) * chunk_, chunk_);
  out.copy_(partial_.narrow(0, me_h * chunk_, chunk_));
  if (scale != 1.0) scale_(out, scale);
  meter_.hold(-(held_bytes(records_) + held_bytes(partial_)));
  records_ = Tensor();
  partial_ = Tensor();
}

TwoHopQuantizedAllReduce::TwoHopQuantizedAllReduce(const dist::ProcessGroup& group,
                                                   const dist::ProcessGroup& host,
                                                   const dist::ProcessGroup& cross,
                                                   const dist::HostMap& hosts, const Tensor& bucket,
                                                   int64_t block, CommMeter& meter)
    : group_(group),
      host_(host),
      cross_(cross),
      hosts_(hosts),
      bucket_(bucket),
      chunk_(bucket.numel() / group.size()),
      block_(block),
      record_bytes_(dist::quant_packed_bytes(chunk_, block)),
      meter_(meter) {
  CZ_ASSERT(bucket_.numel() == group_.size() * chunk_ && chunk_ % block == 0,
            "two-hop quantized all-reduce: a bucket of {} values is not {} chunks of whole blocks of {}",
            bucket_.numel(), group_.size(), block);
  scatter_ = std::make_unique<TwoHopQuantizedReduceScatter>(group_, host_, cross_, hosts_, bucket_, chunk_,
                                                            block_, meter_);
  records_ =
      empty({quantized_all_reduce_buffer_bytes(group_.size(), chunk_, block_)}, DType::u8, bucket_.device());
  meter_.hold(held_bytes(records_));
}

TwoHopQuantizedAllReduce::~TwoHopQuantizedAllReduce() {
  dist::settle(works_);
  if (records_.defined()) meter_.hold(-held_bytes(records_));
}

void TwoHopQuantizedAllReduce::finish(double scale) {
  scatter_->finish(scale);
  NoGradGuard no_grad;
  const int nh = cross_.size(), l = host_.rank(), me_h = cross_.rank();
  auto record = [&](int h, int r) {  // the record of the chunk local rank r of host h owns
    return records_.narrow(0, hosts_.ranks[size_t(h)][size_t(r)] * record_bytes_, record_bytes_);
  };
  const GatherCodec codec(DType::f32, DType::u8, block_);
  codec.encode(bucket_.narrow(0, int64_t(group_.rank()) * chunk_, chunk_), record(me_h, l));
  // Across hosts: this rank's record to the ranks with its local index; theirs back.
  exchange_records(
      cross_, [&](int) { return record(me_h, l); }, [&](int from) { return record(from, l); }, works_,
      meter_);
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  // Inside the host: this rank's column (its cross group's H records) to each host peer, in host order.
  for (int h = 0; h < nh; ++h)
    exchange_records(
        host_, [&](int) { return record(h, l); }, [&](int from) { return record(h, from); }, works_, meter_);
  for (auto& w : works_) meter_.wait(w);
  works_.clear();
  codec.decode(records_, group_.size(), chunk_, bucket_);
  meter_.hold(-held_bytes(records_));
  records_ = Tensor();
  scatter_.reset();
}

}  // namespace cz::zero
