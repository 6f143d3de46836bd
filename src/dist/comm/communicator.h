// The communicator interface: asynchronous collectives and point-to-point transfers on raw buffers (and
// contiguous tensors), over MPI (host buffers, or CUDA buffers staged through pinned memory) or NCCL (CUDA).
//
// Note [Comm streams]: every call returns a Work handle at once. CPU: calls are queued to one communication
// thread per communicator, which runs them in call order and does all the progress (the caller never blocks
// until Work::wait()). CUDA with NCCL: the collective is enqueued on the communicator's stream after an event
// recorded on the caller's current stream, so it sees everything queued before the call; Work::wait() makes
// the caller's current stream wait for it (no host sync). CUDA through MPI: the communication thread copies
// to pinned memory after that same event, runs the host collective and copies back on its stream.
// Buffers must stay alive and untouched until the Work has completed.
//
// Note [Failure handling]: every collective has a deadline (CommOptions::timeout_s). When it passes, or a
// peer dies, the Work fails with a CommError saying which collective, how many bytes and which ranks; a
// timeout also says which ranks never reached the collective and what they last did, from every rank's
// collective log, and the rank prints its own log (Note [Collective log], Note [Logs across hosts]); the
// communicator is then broken and every later call fails at once. main() catches the error and calls die(),
// which prints it with the rank prefix and aborts the job (ncclCommAbort on NCCL communicators, then
// MPI_Abort), so no rank waits forever. NCCL communicators additionally abort themselves on timeout, so that
// their kernels stop and the device streams drain. A caller blocked by Note [Back-pressure] wakes as soon as
// the communicator breaks, with a failed Work.
//
// Note [Back-pressure]: at most CommOptions::max_in_flight calls per communicator are in flight (submitted
// and not yet finished: queued, running, or a posted send/recv); a call beyond that blocks the caller until
// the oldest one finishes, as a full launch queue blocks cudaLaunchKernel. Without the bound a caller that
// runs ahead of the network (a benchmark loop, a backward pass faster than its reductions) queued without
// limit, about 0.6 KB of bookkeeping per call (its task and Work): commbench grew by 1.2 GB/s per rank until
// the OOM killer ended the job, long before a stalled peer's collective could time out. Only bookkeeping is
// queued (buffers are the caller's), so the bound need not be small; 1024 exceeds what a training step issues
// at the default bucket size (ConvNeXt-XLarge: about 54 buckets of 25 MiB), so a step never blocks on it, and
// caps the bookkeeping at about 0.6 MB per communicator. Blocking brings one rule, like MPI's rule that a
// standard send may block until matched: a program must not need more than max_in_flight of its calls on one
// communicator outstanding before a peer can progress (e.g. more sends than that posted before the matching
// receives); such a program stalls until the timeout, then fails.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dist/comm/types.h"
#include "dist/comm/work.h"
#include "tensor/device.h"
#include "tensor/tensor.h"

namespace cz::dist {

class World;

struct CommOptions {
  Backend backend = Backend::mpi;
  // hier and automatic apply to the world (members empty); a group's communicator runs them as the ring.
  Algorithm algorithm = Algorithm::builtin;
  Device device = Device::cpu();  // NCCL: the CUDA device. MPI: CPU buffers, and CUDA ones (staged)
  double timeout_s = 300;         // per collective (Note [Failure handling])
  int max_in_flight = 1024;       // calls in flight before submitting blocks (Note [Back-pressure])
  int64_t slice_bytes = 0;        // ring pipelining granularity; 0 picks one per transport
  std::vector<int> ring;          // ring order as a permutation of the ranks; empty: from the topology
  // The world ranks the communicator spans, in the order of their ranks in it; empty: the whole world.
  // Creating one is collective over the world, as MPI_Comm_split: every rank names the group it joins, and
  // the members of a group name it alike (Note [Groups]).
  std::vector<int> members;
  // What the group is for ("world", "shard", ...: Mesh's kWorldComm and the rest), which names its
  // communication thread (current_communicator). Empty: "world" for the whole world, else "group".
  std::string label;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  Backend backend() const { return options_.backend; }
  Algorithm algorithm() const { return options_.algorithm; }
  const std::vector<int>& ring() const { return ring_; }  // the order the ring algorithms visit ranks in
  // The world rank of each of its ranks (what messages name).
  const std::vector<int>& members() const { return members_; }
  const std::string& label() const { return label_; }  // CommOptions::label, or its default

  // Buffers hold `count` elements of `dtype` on `device` unless stated otherwise; send == recv is in place.
  // Shards follow Note [Uneven shards]; `count` is the total element count on every rank. Every call blocks
  // while max_in_flight calls are in flight (Note [Back-pressure]).
  WorkHandle all_reduce(const void* send, void* recv, int64_t count, DType dtype, Device device, ReduceOp op);
  // send: count elements; recv: shard_count(count, size, rank). In place when recv == send + shard_offset;
  // the rest of an in-place buffer is unspecified afterwards.
  WorkHandle reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Device device,
                            ReduceOp op);
  // send: this rank's shard; recv: count elements. In place when send == recv + shard_offset.
  WorkHandle all_gather(const void* send, void* recv, int64_t count, DType dtype, Device device);
  // The root's send buffer to every rank's recv buffer (send is ignored elsewhere and may be null).
  WorkHandle broadcast(const void* send, void* recv, int64_t count, DType dtype, Device device, int root);
  // Point to point. Transfers between a pair of ranks match in call order.
  WorkHandle send(const void* buf, int64_t count, DType dtype, Device device, int peer);
  WorkHandle recv(void* buf, int64_t count, DType dtype, Device device, int peer);
  WorkHandle barrier();

  // Tensor forms: contiguous tensors; dtype and device come from the tensors.
  WorkHandle all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum);  // in place
  WorkHandle all_reduce(const Tensor& in, Tensor& out, ReduceOp op = ReduceOp::sum);
  WorkHandle reduce_scatter(const Tensor& in, Tensor& shard, ReduceOp op = ReduceOp::sum);  // shard: 1-D
  WorkHandle all_gather(const Tensor& shard, Tensor& out);
  WorkHandle broadcast(Tensor& t, int root);
  WorkHandle send(const Tensor& t, int peer);
  WorkHandle recv(Tensor& t, int peer);

  // Which algorithm a `kind` call of `bytes` runs with on this communicator, and why: "ring" for a fixed
  // choice; for hier and auto the reason (Note [Two-level cost model]), e.g. "auto: ring: predicted ...".
  virtual std::string explain(Collective kind, size_t bytes) const;
  // Whether a `kind` call of `bytes` on `device` runs in two levels (Note [Two-level collectives]); what a
  // caller counting the bytes it sends must know.
  virtual bool two_level(Collective kind, size_t bytes, Device device) const {
    (void)kind, (void)bytes, (void)device;
    return false;
  }

  // Stops in-flight work without waiting for peers (NCCL: ncclCommAbort; MPI: marks the communicator broken,
  // since MPI's only abort ends the job: see abort_world). Later calls fail. Safe from any thread.
  virtual void abort() noexcept = 0;

 protected:
  // One validated call, as the backends receive it.
  struct Call {
    Collective kind = Collective::barrier;
    const void* send = nullptr;
    void* recv = nullptr;
    int64_t count = 0;
    DType dtype = DType::f32;
    Device device;
    ReduceOp op = ReduceOp::sum;
    int peer = -1;     // the root of a broadcast, the peer of send/recv
    size_t bytes = 0;  // the size reported in messages and benchmarks: count * element size
    std::string what;  // describe_call(...)
  };

  Communicator(int rank, int size, CommOptions options, std::vector<int> ring);
  static Call make_call(Collective kind, const void* send, void* recv, int64_t count, DType dtype,
                        Device device, ReduceOp op, int peer);
  virtual WorkHandle submit(Call call) = 0;
  // The backend can take buffers on `device` (checked before submit).
  virtual bool accepts(Device device) const = 0;
  // Called for tensors passed to the Tensor forms (NCCL records them on its stream for the allocator).
  virtual void note_tensor_use(const Tensor& t) {}
  // A backend calls it first thing on its communication thread: current_communicator() there says label().
  void name_this_thread() const;
  // Its number in this rank's collective log (Note [Collective log]): backends record each call under it.
  int log_id() const { return log_id_; }

 private:
  // The two-level communicator forwards calls to its sub-communicators' backends.
  friend class HierCommunicator;
  friend std::unique_ptr<Communicator> make_two_level_communicator(World& world, const CommOptions& options);

  WorkHandle validate_and_submit(Call call);
  int rank_, size_;
  std::string choice_;  // set where auto or hier fell back to the flat ring: why
  CommOptions options_;
  std::vector<int> ring_;
  std::vector<int> members_;
  std::string label_;
  int log_id_ = -1;
};

// On a communicator's communication thread, that communicator's label(); "" on any other thread. What tells
// one communicator's requests to the allocator (its ring scratch) from another's: each thread makes its own
// in an order of its own, while the threads' requests interleave as timing has it (Note [Allocator event
// log]; tests/dist/plan/test_step_events.cpp compares them communicator by communicator).
std::string_view current_communicator();

// Note [Groups]: a communicator spans all ranks of the world or a group of them (options.members), each with
// its own MPI communicator (or NCCL communicator) and communication thread, so collectives on different
// groups (within a host, across hosts) run concurrently and never match each other's messages. Its rank()
// and size() are within the group; messages name world ranks. A communicator whose members share hosts
// checks their liveness like the world's.
//
// Creates a communicator (collective over the world: every rank must call it, in the same order as its other
// communicator creations, each naming its own group in options.members). The ring order comes from
// options.ring when given (a permutation of the group's ranks), else from the detected topology restricted
// to the group (Note [Ring order] in topology.h).
std::unique_ptr<Communicator> make_communicator(World& world, const CommOptions& options);

}  // namespace cz::dist
