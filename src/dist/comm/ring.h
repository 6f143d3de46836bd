// Our own pipelined, chunked ring collectives (reduce-scatter, all-gather, all-reduce, and a chain
// broadcast), written once over a small transport interface that MPI (host buffers) and NCCL (device buffers)
// implement.
//
// Note [Ring schedule]: the buffer is cut into one chunk per rank (Note [Uneven shards]) and each chunk into
// slices of a fixed element count, so slice j covers the same offsets in every chunk. Ranks sit on the ring
// in `order` (the topology's, not necessarily rank order); at each step a rank sends one chunk to the next
// rank and receives another from the previous one. Reduce-scatter takes n-1 steps, each adding the received
// partial sum to the local input; all-gather takes n-1 steps forwarding finished chunks; all-reduce is the
// two back to back. Slices flow independently: slice j moves on to step s+1 as soon as its step s is done,
// so transfers of later slices overlap the reduction of earlier ones (step 0 keeps kRingWindow slices in
// flight, so that each arrives shortly before it is reduced, still in cache). Partial sums travel through two
// scratch slots of one chunk each (alternating by step); all-gather receives straight into the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/comm/types.h"

namespace cz::dist {

// Moves bytes between ring neighbours and runs local reductions, in the order the ring issues them. Host
// transports complete operations asynchronously and wait on request; stream transports (NCCL) order
// everything on one stream, where the waits are no-ops.
class RingTransport {
 public:
  virtual ~RingTransport() = default;
  // Starts sending [send, send + send_bytes) to rank `to` and receiving recv_bytes into `recv` from rank
  // `from` (either side may be absent: -1 / 0 bytes). Both ends use the same tag. Returns a ticket.
  virtual int exchange(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
                       int tag) = 0;
  virtual void wait_recv(int ticket) = 0;  // the received bytes are in place
  virtual void wait_send(int ticket) = 0;  // the send buffer may be overwritten
  // dst = (a + b) * scale over `count` elements (Note: dst may be a or b).
  virtual void reduce(void* dst, const void* a, const void* b, int64_t count, DType dtype, double scale) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Transport-owned memory for partial sums, valid until the next call.
  virtual void* scratch(size_t bytes) = 0;
  virtual void finish() = 0;  // every started transfer has completed
};

struct RingSpec {
  Collective kind;             // all_reduce, reduce_scatter, all_gather or broadcast
  const void* send = nullptr;  // buffers as in Communicator (Note [Uneven shards])
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  // broadcast
  int rank = 0;
  std::vector<int> order;  // ring position -> rank
  size_t slice_bytes = 1 << 20;
  int tag_base = 1;  // tags used: tag_base .. tag_base + kMaxTags - 1
};

// A communicator's call `c` (its kind, count, dtype, op, and peer as the root) for the ring over `send` and
// `recv`: the call's own buffers, or staged copies of them.
template <class Call>
RingSpec ring_spec(const Call& c, const void* send, void* recv, int rank, const std::vector<int>& order,
                   int64_t slice_bytes) {
  return RingSpec{.kind = c.kind,
                  .send = send,
                  .recv = recv,
                  .count = c.count,
                  .dtype = c.dtype,
                  .op = c.op,
                  .root = c.peer,
                  .rank = rank,
                  .order = order,
                  .slice_bytes = size_t(slice_bytes)};
}

inline constexpr int kRingMaxTags = 30000;
inline constexpr int kRingWindow = 4;  // slices of step 0 in flight at once

void run_ring(const RingSpec& spec, RingTransport& transport);

}  // namespace cz::dist
