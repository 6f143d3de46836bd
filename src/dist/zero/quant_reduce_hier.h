// The two-hop quantized reduce-scatter and all-reduce of a gradient bucket (--reduce-dtype int8 with
// --comm-impl hier; ZeRO++'s qgZ): records are exchanged and summed inside each host first, and
// only the host's partial sums cross hosts.
#pragma once

#include <memory>
#include <vector>

#include "dist/comm/mesh.h"
#include "dist/comm/process_group.h"
#include "dist/zero/comm_meter.h"
#include "tensor/tensor.h"

namespace cz::zero {

// Note [Two-hop quantized reduction]: the world is H hosts of R ranks (HostMap), the bucket N = H R chunks,
// chunk c owned by the group's rank c (Note [Quantized reduction] in quant_reduce.h). Local rank l of host h
// is cross rank h of cross group l.
//   hop 1 (inside the host): local rank l receives from each other local rank of its host one message of H
//     INT8 records: that rank's chunks owned by the ranks with local index l on hosts 0 .. H-1 (its own
//     chunk's host column). It adds them, dequantized, in local order, into its own fp32 values of those H
//     chunks: the host's partial sums P[h'] of the chunks its cross group owns.
//   hop 2 (across hosts, in cross group l): it quantizes each P[h'] (h' != h) once more into one record and
//     sends it to cross rank h' (their owner); the owner adds the H - 1 records it receives, in host order,
//     dequantized, to its own host's partial P[h] (kept in fp32, never quantized), then scales by 1/N.
// Bytes: (R - 1) H records inside the host and H - 1 records across hosts per rank, against the flat
// all-to-all's N - 1 records of which (H - 1) R leave the host: what crosses hosts is 1/R of the flat path's.
// Error (docs/zero.md, Note [Quantized reduction]'s analysis): a value carries the R - 1 host peers' round
// trips on each host (half a scale of each sender's block), as in the flat path, plus, for each of the H - 1
// other hosts, one round trip of that host's partial sum: half a scale of the partial's block peak, at most
// the sum of R ranks' peaks / 254. The owner's own host's partial is exact in fp32.
// Hop 2 needs hop 1's sums: the reducer posts it as soon as hop 1 has arrived (post_hop2_if_ready, from its
// hooks while backward runs, buckets in launch order), else finish() does. Only this reduction uses the cross
// communicator at stages 1-3, so the moment timing chooses cannot change how transfers match there; the hops
// run on the host and cross communicators, so they never interleave with another bucket's other hop.
class TwoHopQuantizedReduceScatter {
 public:
  // bucket: f32, N chunks of `chunk` values over `group` (the flat world); `host` and `cross` the mesh's
  // host and cross groups (Note [2-D mesh]), `hosts` the launch's hosts. Posts hop 1.
  TwoHopQuantizedReduceScatter(const dist::ProcessGroup& group, const dist::ProcessGroup& host,
                               const dist::ProcessGroup& cross, const dist::HostMap& hosts,
                               const Tensor& bucket, int64_t chunk, int64_t block, CommMeter& meter);
  ~TwoHopQuantizedReduceScatter();  // waits for what is posted; never throws
  TwoHopQuantizedReduceScatter(const TwoHopQuantizedReduceScatter&) = delete;
  TwoHopQuantizedReduceScatter& operator=(const TwoHopQuantizedReduceScatter&) = delete;
  // Hop 2 posted if hop 1 has arrived (or it was posted before): whether it is posted. Never blocks.
  bool post_hop2_if_ready();
  // Waits for hop 1, sums, runs hop 2 (unless posted); then this rank's chunk is the world's sum x scale.
  void finish(double scale);

 private:
  int64_t chunk_index(int h, int l) const;  // the bucket chunk owned by local rank l of host h
  void post_hop2();                         // hop 1 waited for and summed, hop 2 posted
  bool hop2_posted_ = false;
  dist::ProcessGroup group_, host_, cross_;
  const dist::HostMap& hosts_;
  Tensor bucket_, records_, partial_;  // partial_: the host's fp32 sums P[0 .. H-1]
  int64_t chunk_, block_, record_bytes_;
  CommMeter& meter_;
  std::vector<dist::WorkHandle> works_;
};

// Note [Two-hop quantized all-reduce]: stage 0's quantized all-reduce (Note [Quantized all-reduce] in
// quant_reduce.h) on H hosts of R ranks: the bucket's N = H R chunks reduced as above (each rank then owns
// its chunk's sum), then the owners' records spread in two hops as well: across hosts in the cross group
// (each owner's record to the H - 1 ranks with its local index), then inside the host (each rank's H records,
// its cross group's chunks, to the R - 1 host peers). Every rank decodes the same N records, so all hold the
// same values. Per rank: H - 1 records cross hosts in the second exchange instead of the flat exchange's
// (H - 1) R. Error: that of the reduce-scatter plus the owner's final round trip, as in the flat all-reduce.
class TwoHopQuantizedAllReduce {
 public:
  // bucket: f32, N x chunk values (whole blocks). Posts hop 1 and allocates the second exchange's N records.
  TwoHopQuantizedAllReduce(const dist::ProcessGroup& group, const dist::ProcessGroup& host,
                           const dist::ProcessGroup& cross, const dist::HostMap& hosts, const Tensor& bucket,
                           int64_t block, CommMeter& meter);
  ~TwoHopQuantizedAllReduce();  // waits for what is posted; never throws
  TwoHopQuantizedAllReduce(const TwoHopQuantizedAllReduce&) = delete;
  TwoHopQuantizedAllReduce& operator=(const TwoHopQuantizedAllReduce&) = delete;
  // The bucket becomes, on every rank, the dequantized records of the owners' (sum x scale).
  void finish(double scale);

 private:
  dist::ProcessGroup group_, host_, cross_;
  const dist::HostMap& hosts_;
  Tensor bucket_, records_;  // the second exchange's N records, in rank (= chunk) order
  int64_t chunk_, block_, record_bytes_;
  CommMeter& meter_;
  std::unique_ptr<TwoHopQuantizedReduceScatter> scatter_;
  std::vector<dist::WorkHandle> works_;
};

// The two buffers a two-hop reduce-scatter allocates at its launch on H hosts of R ranks (freed at finish):
// the records (hop 1's sent and received, R H apiece, and hop 2's, H apiece) and the fp32 partial sums (H
// chunks). The planner's replay allocates the same (engine_events.cpp).
int64_t two_hop_records_bytes(int hosts, int ranks_per_host, int64_t chunk, int64_t block);
inline int64_t two_hop_partial_bytes(int hosts, int64_t chunk) {
  return 4 * int64_t(hosts) * chunk;
}

// Whether the two hops apply: several hosts of the same number (> 1) of ranks, and `group` the world.
bool two_hop_applies(const dist::ProcessGroup& group, const dist::HostMap& hosts);

}  // namespace cz::zero
