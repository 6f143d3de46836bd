// Argument checks shared by every backend, the Tensor forms, and the communicator factory.
#include "dist/comm/communicator.h"

#include <algorithm>

#include "dist/comm/bootstrap.h"
#include "dist/comm/collective_log.h"
#include "dist/comm/hier_communicator.h"
#include "dist/comm/mpi_communicator.h"
#include "dist/comm/mpi_util.h"
#include "dist/comm/topology_detect.h"
#include "tensor/check.h"
#include "tensor/trace.h"
#if CZ_WITH_CUDA
#include "dist/comm/cuda/nccl_communicator.h"
#endif

namespace cz::dist {
namespace {
bool is_reduction(Collective k) {
  return k == Collective::all_reduce || k == Collective::reduce_scatter;
}

thread_local std::string tls_communicator;  // current_communicator()
}  // namespace

std::string_view current_communicator() {
  return tls_communicator;
}

void Communicator::name_this_thread() const {
  tls_communicator = label_;
  // Note [Trace lanes]: one lane per communication thread, so its collectives' spans never overlap.
  trace::set_thread_lane(fmt::format("comm {} ({})", label_, name(backend())));
}

Communicator::Call Communicator::make_call(Collective kind, const void* send, void* recv, int64_t count,
                                           DType dtype, Device device, ReduceOp op, int peer) {
  return Call{.kind = kind,
              .send = send,
              .recv = recv,
              .count = count,
              .dtype = dtype,
              .device = device,
              .op = op,
              .peer = peer,
              .bytes = 0,
              .what = {}};
}

Communicator::Communicator(int rank, int size, CommOptions options, std::vector<int> ring)
    : rank_(rank), size_(size), options_(std::move(options)), ring_(std::move(ring)) {
  members_ = options_.members;
  if (members_.empty())
    for (int r = 0; r < size_; ++r) members_.push_back(r);
  label_ = !options_.label.empty() ? options_.label : options_.members.empty() ? "world" : "group";
  log_id_ = CollectiveLog::local().add_comm(label_, size_);
}

WorkHandle Communicator::validate_and_submit(Call call) {
  const char* op = name(call.kind).data();
  CZ_CHECK(call.count >= 0, "{}: count must be >= 0, got {}", op, call.count);
  if (is_reduction(call.kind)) {
    CZ_CHECK_DTYPE(is_comm_dtype(call.dtype), "{}: reductions take f32, f64, f16 or bf16, not {}", op,
                   dtype_name(call.dtype));
  }
  CZ_CHECK_DEVICE(accepts(call.device), "{}: a {} communicator on {} cannot take buffers on {}", op,
                  name(backend()), options_.device.str(), call.device.str());
  // A CUDA build on a machine without a usable GPU (no device, or no driver) must refuse CUDA buffers by name
  // here, not fail later inside the CUDA runtime while staging them.
  CZ_CHECK_DEVICE(!call.device.is_cuda() || cuda_available(),
                  "{}: buffers on {} but no CUDA GPU is available", op, call.device.str());
  if (call.kind == Collective::broadcast) {
    CZ_CHECK(call.peer >= 0 && call.peer < size_, "broadcast: root {} is not a rank of a world of {}",
             call.peer, size_);
  }
  if (call.kind == Collective::send || call.kind == Collective::recv) {
    CZ_CHECK(call.peer >= 0 && call.peer < size_ && call.peer != rank_,
             "{}: peer {} must be another rank of a world of {} (this is rank {})", op, call.peer, size_,
             rank_);
  }
  const bool needs_send = call.kind != Collective::recv && call.kind != Collective::barrier &&
                          (call.kind != Collective::broadcast || call.peer == rank_);
  const bool needs_recv = call.kind != Collective::send && call.kind != Collective::barrier;
  CZ_CHECK(call.count == 0 || !needs_send || call.send, "{}: null send buffer", op);
  CZ_CHECK(call.count == 0 || !needs_recv || call.recv, "{}: null receive buffer", op);
  call.bytes = size_t(call.count) * dtype_size(call.dtype);
  if (call.kind == Collective::send) {
    call.what = fmt::format("send of {} bytes to rank {}", call.bytes, members_[size_t(call.peer)]);
  } else if (call.kind == Collective::recv) {
    call.what = fmt::format("recv of {} bytes from rank {}", call.bytes, members_[size_t(call.peer)]);
  } else {
    call.what = describe_call(call.kind, call.bytes, members_);
  }
  const Work::Call info{call.kind, int64_t(call.bytes), size_};
  WorkHandle work = submit(std::move(call));
  if (work) work->set_call(info);
  return work;
}

std::string Communicator::explain(Collective, size_t) const {
  return choice_.empty() ? std::string(name(algorithm())) : choice_;
}

WorkHandle Communicator::all_reduce(const void* send, void* recv, int64_t count, DType dtype, Device device,
                                    ReduceOp op) {
  return validate_and_submit(make_call(Collective::all_reduce, send, recv, count, dtype, device, op, -1));
}
WorkHandle Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                        Device device, ReduceOp op) {
  return validate_and_submit(make_call(Collective::reduce_scatter, send, recv, count, dtype, device, op, -1));
}
WorkHandle Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype, Device device) {
  return validate_and_submit(
      make_call(Collective::all_gather, send, recv, count, dtype, device, ReduceOp::sum, -1));
}
WorkHandle Communicator::broadcast(const void* send, void* recv, int64_t count, DType dtype, Device device,
                                   int root) {
  return validate_and_submit(
      make_call(Collective::broadcast, send, recv, count, dtype, device, ReduceOp::sum, root));
}
WorkHandle Communicator::send(const void* buf, int64_t count, DType dtype, Device device, int peer) {
  return validate_and_submit(
      make_call(Collective::send, buf, nullptr, count, dtype, device, ReduceOp::sum, peer));
}
WorkHandle Communicator::recv(void* buf, int64_t count, DType dtype, Device device, int peer) {
  return validate_and_submit(
      make_call(Collective::recv, nullptr, buf, count, dtype, device, ReduceOp::sum, peer));
}
WorkHandle Communicator::barrier() {
  return validate_and_submit(
      make_call(Collective::barrier, nullptr, nullptr, 0, DType::f32, options_.device, ReduceOp::sum, -1));
}

namespace {
void check_tensor(const Tensor& t, const char* op, const char* role) {
  CZ_CHECK(t.defined(), "{}: {} tensor is undefined", op, role);
  CZ_CHECK_SHAPE(t.is_contiguous(), "{}: {} tensor must be contiguous, got strides {}", op, role,
                 shape_str(t.strides()));
}
void check_same(const Tensor& a, const Tensor& b, const char* op) {
  CZ_CHECK_DTYPE(a.dtype() == b.dtype(), "{}: input is {} but output is {}", op, dtype_name(a.dtype()),
                 dtype_name(b.dtype()));
  CZ_CHECK_DEVICE(a.device() == b.device(), "{}: input on {} but output on {}", op, a.device().str(),
                  b.device().str());
}
}  // namespace

WorkHandle Communicator::all_reduce(Tensor& t, ReduceOp op) {
  return all_reduce(t, t, op);
}

WorkHandle Communicator::all_reduce(const Tensor& in, Tensor& out, ReduceOp op) {
  check_tensor(in, "all_reduce", "input");
  check_tensor(out, "all_reduce", "output");
  check_same(in, out, "all_reduce");
  CZ_CHECK_SHAPE(in.numel() == out.numel(), "all_reduce: input has {} elements but output has {}", in.numel(),
                 out.numel());
  note_tensor_use(in);
  note_tensor_use(out);
  return all_reduce(in.raw_data(), out.raw_data(), in.numel(), in.dtype(), in.device(), op);
}

WorkHandle Communicator::reduce_scatter(const Tensor& in, Tensor& shard, ReduceOp op) {
  check_tensor(in, "reduce_scatter", "input");
  check_tensor(shard, "reduce_scatter", "shard");
  check_same(in, shard, "reduce_scatter");
  const int64_t want = shard_count(in.numel(), size_, rank_);
  CZ_CHECK_SHAPE(shard.numel() == want,
                 "reduce_scatter: rank {} of {} holds {} of the input's {} elements but the shard has {}",
                 rank_, size_, want, in.numel(), shard.numel());
  note_tensor_use(in);
  note_tensor_use(shard);
  return reduce_scatter(in.raw_data(), shard.raw_data(), in.numel(), in.dtype(), in.device(), op);
}

WorkHandle Communicator::all_gather(const Tensor& shard, Tensor& out) {
  check_tensor(shard, "all_gather", "shard");
  check_tensor(out, "all_gather", "output");
  check_same(shard, out, "all_gather");
  const int64_t want = shard_count(out.numel(), size_, rank_);
  CZ_CHECK_SHAPE(shard.numel() == want,
                 "all_gather: rank {} of {} holds {} of the output's {} elements but the shard has {}", rank_,
                 size_, want, out.numel(), shard.numel());
  note_tensor_use(shard);
  note_tensor_use(out);
  return all_gather(shard.raw_data(), out.raw_data(), out.numel(), out.dtype(), out.device());
}

WorkHandle Communicator::broadcast(Tensor& t, int root) {
  check_tensor(t, "broadcast", "");
  note_tensor_use(t);
  return broadcast(t.raw_data(), t.raw_data(), t.numel(), t.dtype(), t.device(), root);
}

WorkHandle Communicator::send(const Tensor& t, int peer) {
  check_tensor(t, "send", "");
  note_tensor_use(t);
  return send(t.raw_data(), t.numel(), t.dtype(), t.device(), peer);
}

WorkHandle Communicator::recv(Tensor& t, int peer) {
  check_tensor(t, "recv", "");
  note_tensor_use(t);
  return recv(t.raw_data(), t.numel(), t.dtype(), t.device(), peer);
}

std::unique_ptr<Communicator> make_communicator(World& world, const CommOptions& options) {
  CZ_CHECK(options.timeout_s > 0, "communicator: timeout must be positive, got {} s", options.timeout_s);
  CZ_CHECK(options.max_in_flight > 0, "communicator: max_in_flight must be positive, got {}",
           options.max_in_flight);
  CZ_CHECK(options.slice_bytes >= 0, "communicator: slice size must be >= 0, got {}", options.slice_bytes);
  if (options.algorithm == Algorithm::hier || options.algorithm == Algorithm::automatic) {
    if (options.members.empty()) return make_two_level_communicator(world, options);
    CommOptions flat = options;
    flat.algorithm = Algorithm::ring;
    return make_communicator(world, flat);
  }
  std::vector<int> members = options.members;
  if (members.empty())
    for (int r = 0; r < world.size(); ++r) members.push_back(r);
  int me = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    CZ_CHECK(members[i] >= 0 && members[i] < world.size(),
             "communicator: member {} is not a rank of a world of {}", members[i], world.size());
    CZ_CHECK(std::count(members.begin(), members.end(), members[i]) == 1,
             "communicator: rank {} is named twice in the group {}", members[i], rank_list(members));
    if (members[i] == world.rank()) me = int(i);
  }
  CZ_CHECK(me >= 0, "communicator: rank {} is not a member of the group {} it asked to join", world.rank(),
           rank_list(members));
  const int n = int(members.size());
  std::vector<int> ring = options.ring;
  if (!ring.empty()) {
    std::vector<int> sorted = ring;
    std::sort(sorted.begin(), sorted.end());
    bool perm = int(sorted.size()) == n;
    for (size_t i = 0; perm && i < sorted.size(); ++i) perm = sorted[i] == int(i);
    CZ_CHECK(perm, "communicator: ring order {} is not a permutation of the {} ranks", ring, n);
  } else if (options.algorithm == Algorithm::ring) {
    // The world's ring order, keeping the group's ranks: a depth-first walk restricted to them is still one.
    for (int w : detect_topology(world).ring_order()) {
      const auto it = std::find(members.begin(), members.end(), w);
      if (it != members.end()) ring.push_back(int(it - members.begin()));
    }
  } else {
    for (int r = 0; r < n; ++r) ring.push_back(r);
  }
  // The group's own MPI communicator (Note [Groups]): a split of the world keyed by each rank's index in its
  // group, coloured by the group's first member; for the whole world, a duplicate.
  GroupComm group{MPI_COMM_NULL, me, n};
  if (options.members.empty())
    CZ_MPI(MPI_Comm_dup(world.comm(), &group.comm));
  else
    CZ_MPI(MPI_Comm_split(world.comm(), *std::min_element(members.begin(), members.end()), me, &group.comm));
  int split_size = 0;
  CZ_MPI(MPI_Comm_size(group.comm, &split_size));
  if (split_size != n) {
    MPI_Comm_free(&group.comm);
    throw ValueError(
        fmt::format("communicator: rank {} asked for the group {}, but {} ranks joined it (every member must "
                    "name the same "
                    "group)",
                    world.rank(), rank_list(members), split_size));
  }
  CommOptions opt = options;
  opt.members = options.members.empty() ? std::vector<int>{} : members;
  if (options.backend == Backend::mpi) return make_mpi_communicator(world, opt, std::move(ring), group);
#if CZ_WITH_CUDA
  return make_nccl_communicator(world, opt, std::move(ring), group);
#else
  MPI_Comm_free(&group.comm);
  throw DeviceError(
      "the NCCL backend needs the CUDA build of convnext_zero (this one was built without CUDA); use the mpi "
      "backend");
#endif
}

}  // namespace cz::dist
