// The process group's collectives: forwarded to its communicator, or done locally in a group of one.
#include "dist/comm/process_group.h"

#include <cstring>
#include <numeric>

#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::dist {
namespace {

void copy_bytes(const Tensor& dst, const Tensor& src) {
  if (dst.raw_data() == src.raw_data()) return;
  if (dst.is_cpu() && src.is_cpu())
    std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
  else
    cuda_runtime::memcpy_async(dst.raw_data(), src.raw_data(), src.nbytes(),
                               cuda_runtime::CopyKind::device_to_device, current_stream(dst.device()));
}

}  // namespace

ProcessGroup::ProcessGroup(Device device, int world_rank) : device_(device), ranks_{world_rank} {}

ProcessGroup::ProcessGroup(Communicator* comm, Device device) : comm_(comm), device_(device) {
  ranks_ = comm ? comm->members() : std::vector<int>{0};
  rank_ = comm ? comm->rank() : 0;
}

std::vector<int> ProcessGroup::ring_order() const {
  if (!comm_) return ranks_;
  std::vector<int> out;
  for (int r : comm_->ring()) out.push_back(ranks_[size_t(r)]);
  return out.size() == ranks_.size() ? out : ranks_;
}

WorkHandle ProcessGroup::all_reduce(Tensor& t, ReduceOp op) const {
  return comm_ ? comm_->all_reduce(t, op) : nullptr;
}

WorkHandle ProcessGroup::reduce_scatter(const Tensor& in, Tensor& shard, ReduceOp op) const {
  if (comm_) return comm_->reduce_scatter(in, shard, op);
  copy_bytes(shard, in);
  return nullptr;
}

WorkHandle ProcessGroup::all_gather(const Tensor& shard, Tensor& out) const {
  if (comm_) return comm_->all_gather(shard, out);
  copy_bytes(out.narrow(0, 0, shard.numel()), shard);
  return nullptr;
}

WorkHandle ProcessGroup::send(const Tensor& t, int peer) const {
  CZ_CHECK(comm_ && peer != rank_, "process group: rank {} of {} cannot send to {}", rank_, size(), peer);
  return comm_->send(t, peer);
}

WorkHandle ProcessGroup::recv(Tensor& t, int peer) const {
  CZ_CHECK(comm_ && peer != rank_, "process group: rank {} of {} cannot receive from {}", rank_, size(),
           peer);
  return comm_->recv(t, peer);
}

WorkHandle ProcessGroup::broadcast(Tensor& t, int root) const {
  return comm_ ? comm_->broadcast(t, root) : nullptr;
}

double ProcessGroup::all_reduce(double value, ReduceOp op) const {
  if (!comm_) return value;
  Tensor t = full({1}, value, DType::f64, device_);
  comm_->all_reduce(t, op)->wait();
  return t.item();
}

std::vector<double> ProcessGroup::all_gather(const std::vector<double>& mine) const {
  if (!comm_) return mine;
  const int64_t k = int64_t(mine.size());
  Tensor shard = from_vector(mine, {k}).to(device_);
  Tensor all = zeros({k * size()}, DType::f64, device_);
  comm_->all_gather(shard, all)->wait();
  return all.to_vector<double>();
}

std::string ProcessGroup::broadcast(const std::string& bytes, int root) const {
  if (!comm_) return bytes;
  Tensor len = full({1}, double(bytes.size()), DType::f64, device_);
  comm_->broadcast(len, root)->wait();
  const int64_t n = int64_t(len.item());
  if (n == 0) return {};
  std::vector<uint8_t> v(size_t(n), 0);
  if (rank_ == root) std::memcpy(v.data(), bytes.data(), size_t(n));
  Tensor t = from_vector(v, {n}).to(device_);
  comm_->broadcast(t, root)->wait();
  const std::vector<uint8_t> got = t.to_vector<uint8_t>();
  return std::string(got.begin(), got.end());
}

int64_t ring_bytes_sent(const ProcessGroup& group, int64_t bytes, int factor) {
  return int64_t(factor) * bytes * (group.size() - 1) / group.size();
}

}  // namespace cz::dist
