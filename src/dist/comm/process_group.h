// A process group: the ranks a set of collectives spans and the communicator that connects them. It is the
// one route to a communicator for the training code: the ZeRO engine's parts are each handed the group they
// communicate in, and the trainer's own small exchanges (the loss, the rank-agreement check, checkpoints'
// strings) go through it too. Today every group is the world (or a group of one); a 2-D mesh (shard within a
// host, replicate across hosts) hands different parts different groups, each with its own communicator.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "dist/comm/communicator.h"

namespace cz::dist {

class ProcessGroup {
 public:
  // A group of one (no communicator): collectives are local copies, scalars come back as they went in.
  // `world_rank`: the rank it holds.
  explicit ProcessGroup(Device device = Device::cpu(), int world_rank = 0);
  // All of `comm`'s ranks (`comm` null: a group of one). Not owned: it must outlive the group.
  ProcessGroup(Communicator* comm, Device device);

  int rank() const { return rank_; }  // this process's index in the group
  int size() const { return int(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // the world ranks it spans, in group order
  Device device() const { return device_; }  // where its small exchanges' buffers live (NCCL: CUDA only)
  // Its world ranks in the order the ring algorithms visit them (each sends to the next): with the ranks'
  // hosts, how many of a ring's links leave a host (CommMeter's cross-host count).
  std::vector<int> ring_order() const;
  const Communicator* communicator() const { return comm_; }  // null for a group of one

  // Asynchronous collectives on contiguous tensors, as Communicator's. In a group of one nothing is sent and
  // the handle is null: an out-of-place all-gather or reduce-scatter copies the bytes (not through copy_,
  // which would count as an in-place write of `out`, as a real collective's write does not).
  WorkHandle all_reduce(Tensor& t, ReduceOp op) const;
  WorkHandle reduce_scatter(const Tensor& in, Tensor& shard, ReduceOp op) const;
  WorkHandle all_gather(const Tensor& shard, Tensor& out) const;
  WorkHandle broadcast(Tensor& t, int root) const;
  // Point to point with the group's rank `peer` (not this rank); a group of one has no peer.
  WorkHandle send(const Tensor& t, int peer) const;
  WorkHandle recv(Tensor& t, int peer) const;

  // Blocking exchanges of small host values, through f64 buffers on device().
  double all_reduce(double value, ReduceOp op) const;
  // Every rank's `mine` (the same length on every rank), back to back in group order.
  std::vector<double> all_gather(const std::vector<double>& mine) const;
  // The root's bytes on every rank, one u8 each.
  std::string broadcast(const std::string& bytes, int root) const;

 private:
  Communicator* comm_ = nullptr;
  Device device_;
  std::vector<int> ranks_;
  int rank_ = 0;
};

// Bytes sent by this rank in a ring collective over `group` on a buffer of `bytes`: (N-1)/N of it for
// reduce-scatter and all-gather (factor 1), twice that for all-reduce (factor 2).
int64_t ring_bytes_sent(const ProcessGroup& group, int64_t bytes, int factor);

}  // namespace cz::dist
