// The quantized reduce-scatter of a gradient bucket (--reduce-dtype int8, Note [Quantized reduction]): each
// rank sends every other rank its chunk of the bucket as one INT8 record, and adds the records it receives
// for its own chunk into its fp32 values.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "dist/comm/process_group.h"
#include "dist/zero/comm_meter.h"
#include "tensor/tensor.h"

namespace cz::zero {

// Note [Quantized reduction]: an all-to-all, as ZeRO++'s qgZ, not the ring: in round k = 1 .. N-1 rank r
// sends Q(its chunk (r + k) mod N) to rank (r + k) mod N and receives Q(chunk r of rank (r - k) mod N). The
// owner adds, in group order, each received record dequantized into its own fp32 chunk (sum = deq(q) + sum,
// one fma per value: dist::dequantize_add_quantize with the sum only), then scales by the average's 1/N. So
// every contribution is quantized exactly once, by the rank that computed it, and nothing is ever added in
// low precision: the error of the result is the sum of the N - 1 senders' own round-trip errors (each at most
// half a scale of that sender's block), independent of the order, never re-quantized, and no worse on more
// ranks per value. The ring would quantize each partial sum again at every hop (N - 1 quantizations of
// growing sums). Bytes each rank sends: (N - 1) records of quant_packed_bytes(chunk, B), 0.254 of the fp32
// reduce-scatter's at B = 256; a non-finite gradient makes its block's scale NaN or Inf, so the owner's sum
// of that block is NaN: the step's overflow check trips on the owner, and through the all-reduced decision on
// every rank (Note [Quantized blocks]). No error feedback: the learning study has not asked for it (docs).
class QuantizedReduceScatter {
 public:
  // bucket: f32, N chunks of `chunk` values (contiguous; this rank's chunk is written by finish()). Posts the
  // sends and receives at once; `meter` counts the bytes, per peer.
  QuantizedReduceScatter(const dist::ProcessGroup& group, const Tensor& bucket, int64_t chunk, int64_t block,
                         CommMeter& meter);
  ~QuantizedReduceScatter();  // waits for what is posted; never throws
  QuantizedReduceScatter(const QuantizedReduceScatter&) = delete;
  QuantizedReduceScatter& operator=(const QuantizedReduceScatter&) = delete;
  // Waits for the records, then this rank's chunk of the bucket becomes (own + sum of the others) * scale.
  void finish(double scale);
  const Tensor& records() const { return records_; }  // 2N records: the ones sent, then the ones received

 private:
  dist::ProcessGroup group_;
  Tensor bucket_, records_;
  int64_t chunk_, block_, record_bytes_;
  CommMeter& meter_;
  std::vector<dist::WorkHandle> works_;
};

// Bytes of the records buffer a quantized reduce-scatter of N chunks of `chunk` values allocates.
int64_t quantized_reduce_buffer_bytes(int n, int64_t chunk, int64_t block);

// The exchange every quantized reduction is made of: for k = 1 .. N - 1 in `group` (N ranks, this one r), a
// send of send_of(r + k) to rank r + k and a receive into recv_of(r - k) from rank r - k (mod N), appended
// to `works`, each send's bytes counted by `meter`. Transfers between two ranks match in posting order.
void exchange_records(const dist::ProcessGroup& group, const std::function<Tensor(int)>& send_of,
                      const std::function<Tensor(int)>& recv_of, std::vector<dist::WorkHandle>& works,
                      CommMeter& meter);

// Note [Quantized all-reduce]: stage 0's bucket all-reduce with --reduce-dtype int8, in two all-to-alls: the
// quantized reduce-scatter above (each rank owns chunk r of the bucket, summed in fp32 and averaged), then
// each owner quantizes its averaged chunk once into one record and sends it to every other rank, and every
// rank, the owner included, dequantizes all N records into the bucket. So every rank applies the same
// gradient, bit for bit (replicas stay identical); each value carries the N - 1 senders' round-trip errors
// divided by N plus one more round trip of the average (at most half its block's scale). Bytes each rank
// sends: 2 (N - 1) records, 0.254 of the fp32 ring all-reduce's 2 (N - 1) chunks at B = 256. The second
// exchange is posted when the reducer finishes the bucket (finish_oldest), not as soon as the first has
// arrived: point-to-point transfers match in call order, and posting it at a moment timing chooses would
// interleave it differently with the next bucket's first exchange on different ranks. The layout pads each
// stage-0 bucket to a multiple of N x B (plan_layout's pad_ranks), so the chunks are whole blocks.
class QuantizedAllReduce {
 public:
  // bucket: f32, N x chunk values. Posts the first exchange and allocates the second's N records.
  QuantizedAllReduce(const dist::ProcessGroup& group, const Tensor& bucket, int64_t block, CommMeter& meter);
  ~QuantizedAllReduce();  // waits for what is posted; never throws
  QuantizedAllReduce(const QuantizedAllReduce&) = delete;
  QuantizedAllReduce& operator=(const QuantizedAllReduce&) = delete;
  // The bucket becomes, on every rank, the dequantized records of the owners' (sum x scale).
  void finish(double scale);

 private:
  dist::ProcessGroup group_;
  Tensor bucket_, records_;  // the second exchange's N records, in rank order
  int64_t chunk_, block_, record_bytes_;
  CommMeter& meter_;
  std::unique_ptr<QuantizedReduceScatter> scatter_;
  std::vector<dist::WorkHandle> works_;
};

// Bytes of the second exchange's records buffer (QuantizedAllReduce), allocated after the first's.
int64_t quantized_all_reduce_buffer_bytes(int n, int64_t chunk, int64_t block);

}  // namespace cz::zero
