// Two-level collectives (Note [Two-level collectives]) and the factory that picks them.
#include "dist/comm/hier_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/mesh.h"
#include "dist/comm/topology.h"
#include "dist/comm/topology_detect.h"
#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::dist {

class HierCommunicator final : public Communicator {
 public:
  HierCommunicator(const CommOptions& options, const HostMap& hosts, const Topology& topology,
                   std::unique_ptr<Communicator> flat, std::unique_ptr<Communicator> host,
                   std::unique_ptr<Communicator> cross)
      : Communicator(flat->rank(), flat->size(), options, flat->ring()),
        hosts_(hosts),
        topology_(topology),
        flat_(std::move(flat)),
        host_(std::move(host)),
        cross_(std::move(cross)) {
    if (options.backend == Backend::mpi) thread_ = std::thread([this] { loop(); });
  }

  ~HierCommunicator() override {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
  }

  void abort() noexcept override {
    host_->abort();
    cross_->abort();
    flat_->abort();
    fail_all("communicator aborted");
  }

  std::string explain(Collective kind, size_t bytes) const override {
    const std::string layout = fmt::format("{} hosts x {} ranks", hosts_.num_hosts(), host_->size());
    if (!is_two_level(kind)) return fmt::format("ring: {} always runs on the flat ring", name(kind));
    if (algorithm() == Algorithm::hier) return fmt::format("hier: as asked ({})", layout);
    return "auto: " + predict(kind, bytes).reason;
  }

 protected:
  bool accepts(Device d) const override {
    return backend() == Backend::nccl ? d.is_cuda() : d.is_cpu() || (d.is_cuda() && cuda_runtime::built());
  }

  void note_tensor_use(const Tensor& t) override {
    flat_->note_tensor_use(t);
    host_->note_tensor_use(t);
    cross_->note_tensor_use(t);
  }

  WorkHandle submit(Call call) override {
    if (!two_level(call.kind, call.bytes, call.device)) return forward(*flat_, call);
    auto work = std::make_shared<Work>(call.what, call.device);
    if (backend() == Backend::nccl) {
      run_inline(call, work);
      return work;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Note [Back-pressure], as the backends do.
      space_cv_.wait(lock,
                     [&] { return broken_ || queue_.size() + running_ < size_t(options().max_in_flight); });
      if (broken_) {
        work->mark_failed(fmt::format("{}: the communicator failed earlier: {}", call.what, reason_));
        return work;
      }
      queue_.push_back({std::move(call), work});
    }
    cv_.notify_one();
    return work;
  }

 private:
  struct Task {
    Call call;
    WorkHandle work;
  };

  static bool is_two_level(Collective k) {
    return k == Collective::all_reduce || k == Collective::reduce_scatter || k == Collective::all_gather;
  }

  TwoLevelPrediction predict(Collective kind, size_t bytes) const {
    return topology_.predict_two_level(ring(), hosts_.ranks, double(bytes), kind);
  }

  // Whether this call takes the two levels: every rank decides alike (same topology, same call).
  bool two_level(Collective kind, size_t bytes, Device device) const override {
    if (!is_two_level(kind)) return false;
    if (algorithm() == Algorithm::hier || (backend() == Backend::mpi && device.is_cuda()))
      return takes_two_levels(algorithm(), backend(), topology_, ring(), hosts_.ranks, kind, bytes, device);
    // A step's buckets repeat a few sizes; the model walks the world's ring, so remember its answers.
    std::lock_guard<std::mutex> lock(choice_mu_);
    const auto key = std::make_pair(kind, bytes);
    auto it = choices_.find(key);
    if (it == choices_.end()) {
      if (choices_.size() >= 256) choices_.clear();  // a sweep of sizes, not a training step
      it = choices_
               .emplace(key, takes_two_levels(algorithm(), backend(), topology_, ring(), hosts_.ranks, kind,
                                              bytes, device))
               .first;
    }
    return it->second;
  }

  static WorkHandle forward(Communicator& to, const Call& c) {
    switch (c.kind) {
      case Collective::all_reduce:
        return to.all_reduce(c.send, c.recv, c.count, c.dtype, c.device, c.op);
      case Collective::reduce_scatter:
        return to.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.device, c.op);
      case Collective::all_gather:
        return to.all_gather(c.send, c.recv, c.count, c.dtype, c.device);
      case Collective::broadcast:
        return to.broadcast(c.send, c.recv, c.count, c.dtype, c.device, c.peer);
      case Collective::send:
        return to.send(c.send, c.count, c.dtype, c.device, c.peer);
      case Collective::recv:
        return to.recv(c.recv, c.count, c.dtype, c.device, c.peer);
      case Collective::barrier:
        return to.barrier();
    }
    throw InternalError("hier: unknown collective");
  }

  // --- the steps (Note [Two-level collectives]) ---

  // Waits for one step: on the CPU until it has finished, with CUDA by ordering the current stream after it.
  static void step(const WorkHandle& w) { w->wait(); }

  void copy(void* dst, const void* src, size_t bytes, Device device) {
    if (!bytes) return;
    if (device.is_cuda())
      cuda_runtime::memcpy_async(dst, src, bytes, cuda_runtime::CopyKind::device_to_device,
                                 current_stream(device));
    else
      std::memcpy(dst, src, bytes);
  }

  // Scratch of at least `bytes`: on the CPU kept between calls (only this communicator's thread uses it);
  // with CUDA one block per call from the caching allocator, which the current stream orders.
  char* scratch(size_t bytes, Device device, DataPtr& per_call) {
    if (device.is_cuda()) {
      per_call = allocator_for(device).allocate(std::max<size_t>(bytes, 64));
      return static_cast<char*>(per_call.get());
    }
    if (scratch_.nbytes() < bytes || !scratch_.get()) {
      scratch_ = DataPtr();  // the old block first, as HostBuffer does (mpi_communicator.cpp)
      scratch_ = allocator_for(Device::cpu()).allocate(std::max<size_t>(bytes, 64));
    }
    return static_cast<char*>(scratch_.get());
  }

  void run_steps(const Call& c) {
    if (c.count == 0) return;
    const int H = cross_->size(), R = host_->size(), l = host_->rank();
    const int n = H * R;
    const size_t es = dtype_size(c.dtype);
    const Device d = c.device;
    if (c.kind == Collective::all_reduce) {
      // Note [Two-level pipeline]: in pieces, so that piece k crosses hosts while piece k+1 is reduced
      // inside the host and piece k-1 gathered. Every rank cuts alike and submits in the same order, so
      // each sub-communicator sees the same sequence everywhere: host RS 0..P-1, then host AG 0..P-1.
      const int pieces = two_level_pieces(c.kind, c.count, c.bytes, n);
      const size_t np = size_t(pieces);
      const char* send = static_cast<const char*>(c.send);
      char* recv = static_cast<char*>(c.recv);
      std::vector<WorkHandle> rs(np), ar(np), ag(np);
      std::vector<size_t> lo(np), off(np);
      std::vector<int64_t> count(np);
      for (int k = 0; k < pieces; ++k) {
        const size_t i = size_t(k);
        count[i] = shard_count(c.count, pieces, k);
        lo[i] = size_t(shard_offset(c.count, pieces, k)) * es;
        off[i] = lo[i] + size_t(shard_offset(count[i], R, l)) * es;
        // Out of place the host reduce-scatter reads `send` and writes the shard into `recv`; in place it is
        // the in-place form.
        rs[i] = host_->reduce_scatter(send + lo[i], recv + off[i], count[i], c.dtype, d, c.op);
      }
      for (size_t i = 0; i < rs.size(); ++i) {
        step(rs[i]);
        ar[i] =
            cross_->all_reduce(recv + off[i], recv + off[i], shard_count(count[i], R, l), c.dtype, d, c.op);
      }
      for (size_t i = 0; i < ar.size(); ++i) {
        step(ar[i]);
        ag[i] = host_->all_gather(recv + off[i], recv + lo[i], count[i], c.dtype, d);
      }
      for (const auto& w : ag) step(w);
      return;
    }
    // Slots of S elements, piece-major (Note [Two-level pipeline]): piece k holds elements [o_k, o_k + S_k)
    // of every slot, block k of the scratch the n slots' pieces in slot order, so each piece is a contiguous
    // buffer for the host and the cross collectives.
    const int64_t S = (c.count + n - 1) / n;
    const int pieces = two_level_pieces(c.kind, c.count, c.bytes, n);
    DataPtr per_call;
    char* P = scratch(size_t(n) * size_t(S) * es, d, per_call);
    auto piece = [&](int k) {
      const int64_t o = shard_offset(S, pieces, k), len = shard_count(S, pieces, k);
      return std::pair<int64_t, int64_t>(o, len);
    };
    auto block = [&](int64_t o) { return P + size_t(n) * size_t(o) * es; };  // piece k's, from its o
    // Slot of world rank w (local rank l_w, host h_w) within the block of a piece of `len` elements.
    auto slot_of = [&](int64_t o, int64_t len, int w) {
      const int index = hosts_.local_index[size_t(w)] * H + hosts_.host_of[size_t(w)];
      return block(o) + size_t(index) * size_t(len) * es;
    };
    // Of world shard w, the elements a piece covers: [o, o + len) clipped to the shard.
    auto covered = [&](int w, int64_t o, int64_t len) {
      return std::clamp<int64_t>(shard_count(c.count, n, w) - o, 0, len);
    };
    const int me = rank();
    std::vector<WorkHandle> first(static_cast<size_t>(pieces)), second(static_cast<size_t>(pieces));
    if (c.kind == Collective::reduce_scatter) {
      for (int k = 0; k < pieces; ++k) {
        const auto [o, len] = piece(k);
        for (int w = 0; w < n; ++w) {
          const size_t b = size_t(covered(w, o, len)) * es;
          char* dst = slot_of(o, len, w);
          copy(dst, static_cast<const char*>(c.send) + size_t(shard_offset(c.count, n, w) + o) * es, b, d);
          // The padding is reduced but never read; zeroed on the CPU so that no stray NaN is summed.
          if (b < size_t(len) * es && d.is_cpu()) std::memset(dst + b, 0, size_t(len) * es - b);
        }
        first[size_t(k)] = host_->reduce_scatter(block(o), slot_of(o, len, hosts_.ranks[0][size_t(l)]),
                                                 int64_t(n) * len, c.dtype, d, c.op);
      }
      for (int k = 0; k < pieces; ++k) {
        const auto [o, len] = piece(k);
        step(first[size_t(k)]);
        second[size_t(k)] = cross_->reduce_scatter(slot_of(o, len, hosts_.ranks[0][size_t(l)]),
                                                   slot_of(o, len, me), int64_t(H) * len, c.dtype, d, c.op);
      }
      for (int k = 0; k < pieces; ++k) {
        const auto [o, len] = piece(k);
        step(second[size_t(k)]);
        copy(static_cast<char*>(c.recv) + size_t(o) * es, slot_of(o, len, me),
             size_t(covered(me, o, len)) * es, d);
      }
      return;
    }
    CZ_ASSERT(c.kind == Collective::all_gather, "hier: unexpected {}", name(c.kind));
    for (int k = 0; k < pieces; ++k) {
      const auto [o, len] = piece(k);
      const size_t b = size_t(covered(me, o, len)) * es;
      char* own = slot_of(o, len, me);
      copy(own, static_cast<const char*>(c.send) + size_t(o) * es, b, d);
      if (b < size_t(len) * es && d.is_cpu()) std::memset(own + b, 0, size_t(len) * es - b);
      first[size_t(k)] =
          cross_->all_gather(own, slot_of(o, len, hosts_.ranks[0][size_t(l)]), int64_t(H) * len, c.dtype, d);
    }
    for (int k = 0; k < pieces; ++k) {
      const auto [o, len] = piece(k);
      step(first[size_t(k)]);
      second[size_t(k)] = host_->all_gather(slot_of(o, len, hosts_.ranks[0][size_t(l)]), block(o),
                                            int64_t(n) * len, c.dtype, d);
    }
    for (int k = 0; k < pieces; ++k) {
      const auto [o, len] = piece(k);
      step(second[size_t(k)]);
      for (int w = 0; w < n; ++w)
        copy(static_cast<char*>(c.recv) + size_t(shard_offset(c.count, n, w) + o) * es, slot_of(o, len, w),
             size_t(covered(w, o, len)) * es, d);
    }
  }

  // NCCL: everything is enqueued now; the Work completes with the caller's stream.
  void run_inline(const Call& c, const WorkHandle& work) {
    const Stream cs = current_stream(c.device);
    void* start = cuda_runtime::event_create(c.device.index);
    cuda_runtime::event_record(start, cs);
    work->set_device_start_event(start);
    try {
      run_steps(c);
    } catch (const std::exception& e) {
      work->mark_failed(fmt::format("{} (two-level): {}", c.what, e.what()));
      return;
    }
    void* done = cuda_runtime::event_create(c.device.index);
    cuda_runtime::event_record(done, cs);
    work->set_device_event(done);
    work->mark_done();
  }

  // --- MPI: the communication thread ---

  void loop() {
    name_this_thread();  // its pack scratch is this communicator's (Note [Allocator event log])
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      task.work->mark_started();
      try {
        if (broken_) throw CommError(fmt::format("the communicator failed earlier: {}", reason()));
        run_steps(task.call);
        task.work->mark_done();
      } catch (const std::exception& e) {
        const std::string error = fmt::format("{} (two-level): {}", task.call.what, e.what());
        task.work->mark_failed(error);
        fail_all(error);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        --running_;
      }
      space_cv_.notify_all();
    }
  }

  std::string reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }

  // Breaks the communicator: queued calls fail with the first error, and so do later ones.
  void fail_all(const std::string& error) {
    std::deque<Task> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_) reason_ = error;
      broken_ = true;
      dropped.swap(queue_);
    }
    space_cv_.notify_all();
    for (auto& t : dropped)
      t.work->mark_failed(fmt::format("{}: the communicator failed earlier: {}", t.call.what, error));
  }

  HostMap hosts_;
  Topology topology_;
  std::unique_ptr<Communicator> flat_, host_, cross_;
  DataPtr scratch_;
  std::thread thread_;
  mutable std::mutex choice_mu_;
  mutable std::map<std::pair<Collective, size_t>, bool> choices_;  // auto's answers by call
  std::mutex mu_;
  std::condition_variable cv_, space_cv_;
  std::deque<Task> queue_;
  size_t running_ = 0;
  bool stop_ = false, broken_ = false;
  std::string reason_;
};

int two_level_pieces(Collective kind, int64_t count, size_t bytes, int n) {
  const int64_t by_size = int64_t(bytes) / kTwoLevelPieceBytes;
  if (kind == Collective::all_reduce) return int(std::clamp<int64_t>(by_size, 1, kTwoLevelMaxPieces));
  const int64_t slot = (count + n - 1) / n;  // a piece holds at least one element of every slot
  return int(std::clamp<int64_t>(by_size, 1, std::max<int64_t>(std::min(kTwoLevelMaxPieces, slot), 1)));
}

bool takes_two_levels(Algorithm algorithm, Backend backend, const Topology& topology,
                      const std::vector<int>& ring, const std::vector<std::vector<int>>& host_groups,
                      Collective kind, size_t bytes, Device device) {
  if (kind != Collective::all_reduce && kind != Collective::reduce_scatter && kind != Collective::all_gather)
    return false;
  const bool staged = backend == Backend::mpi && device.is_cuda();
  if (algorithm == Algorithm::hier) {
    CZ_CHECK_DEVICE(!staged,
                    "{}: hier over the mpi backend takes CPU buffers, not {} (use the nccl backend, or the "
                    "ring, which stages CUDA buffers)",
                    name(kind), device.str());
    return true;
  }
  if (staged) return false;
  return topology.predict_two_level(ring, host_groups, double(bytes), kind).hier_faster();
}

std::unique_ptr<Communicator> make_hier_communicator(const CommOptions& options, const HostMap& hosts,
                                                     const Topology& topology,
                                                     std::unique_ptr<Communicator> flat,
                                                     std::unique_ptr<Communicator> host,
                                                     std::unique_ptr<Communicator> cross) {
  return std::make_unique<HierCommunicator>(options, hosts, topology, std::move(flat), std::move(host),
                                            std::move(cross));
}

namespace {

std::string host_sizes(const HostMap& hosts) {
  std::string s;
  for (size_t h = 0; h < hosts.hosts.size(); ++h)
    s += fmt::format("{}{} on {}", h ? ", " : "", hosts.ranks[h].size(), hosts.hosts[h]);
  return s;
}

// The ring order of `members` (world ranks) restricted from the world's, as indices into `members`.
std::vector<int> group_ring(const Topology& topology, const std::vector<int>& members) {
  std::vector<int> ring;
  for (int w : topology.restrict_ring(topology.ring_order(), members))
    ring.push_back(int(std::find(members.begin(), members.end(), w) - members.begin()));
  return ring;
}

}  // namespace

std::unique_ptr<Communicator> make_two_level_communicator(World& world, const CommOptions& options) {
  CZ_ASSERT(options.members.empty(), "two-level communicators span the world");
  const bool forced = options.algorithm == Algorithm::hier;
  const HostMap hosts = host_map(world);
  const int per_host = hosts.ranks_per_host();
  CZ_CHECK(!forced || per_host > 0,
           "hier collectives need the same number of ranks on every host; this launch has {} (use the ring)",
           host_sizes(hosts));
  const Topology topology = detect_topology(world);  // collective; the same on every rank
  CommOptions flat = options;
  flat.algorithm = Algorithm::ring;
  flat.ring = options.ring.empty() ? topology.ring_order() : options.ring;
  std::string why;
  if (hosts.num_hosts() == 1)
    why = "one host";
  else if (per_host == 1)
    why = "one rank per host";
  else if (per_host == 0)
    why = fmt::format("hosts differ in size ({})", host_sizes(hosts));
  if (!why.empty()) {
    auto c = make_communicator(world, flat);
    c->choice_ =
        fmt::format("{}: ring: {}, where two levels are the flat ring", name(options.algorithm), why);
    if (per_host == 0) c->choice_ = fmt::format("auto: ring: {}", why);
    return c;
  }
  const int me = world.rank();
  // Each inner communicator's thread by a name of its own (Note [Two-level collectives]).
  const std::string label = !options.label.empty() ? options.label : "world";
  flat.label = label + kFlatLevel;
  auto world_comm = make_communicator(world, flat);
  CommOptions host = flat, cross = flat;
  host.label = label + kHostLevel;
  cross.label = label + kCrossLevel;
  host.members = hosts.ranks[size_t(hosts.host_of[size_t(me)])];
  for (const auto& g : hosts.ranks) cross.members.push_back(g[size_t(hosts.local_index[size_t(me)])]);
  host.ring = group_ring(topology, host.members);
  cross.ring = group_ring(topology, cross.members);
  auto host_comm = make_communicator(world, host);
  auto cross_comm = make_communicator(world, cross);
  CommOptions mine = options;
  mine.ring = flat.ring;
  return make_hier_communicator(mine, hosts, topology, std::move(world_comm), std::move(host_comm),
                                std::move(cross_comm));
}

}  // namespace cz::dist
