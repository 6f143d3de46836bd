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
        cross_(std::move(cross)),
        queue_(options.max_in_flight) {
    if (options.backend == Backend::mpi) thread_ = std::thread([this] { loop(); });
  }

  ~HierCommunicator() override {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(queue_.mutex());
        stop_ = true;
      }
      queue_.ready().notify_all();
      thread_.join();
    }
  }

  void abort() noexcept override {
    host_->abort();
    cross_->abort();
    flat_->abort();
    queue_.fail_all("communicator aborted");
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
    queue_.push({std::move(call), work});
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
    if (c.kind == Collective::all_reduce) return run_all_reduce(c);
    const int n = cross_->size() * host_->size();
    const int64_t S = (c.count + n - 1) / n;
    DataPtr per_call;
    const Slots slots{hosts_,
                      cross_->size(),
                      n,
                      two_level_pieces(c.kind, c.count, c.bytes, n),
                      c.count,
                      S,
                      dtype_size(c.dtype),
                      scratch(size_t(n) * size_t(S) * dtype_size(c.dtype), c.device, per_call)};
    if (c.kind == Collective::reduce_scatter) return run_reduce_scatter(c, slots);
    CZ_ASSERT(c.kind == Collective::all_gather, "hier: unexpected {}", name(c.kind));
    run_all_gather(c, slots);
  }

  // Note [Two-level pipeline]: in pieces, so that piece k crosses hosts while piece k+1 is reduced inside the
  // host and piece k-1 gathered. Every rank cuts alike and submits in the same order, so each
  // sub-communicator sees the same sequence everywhere: host RS 0..P-1, then host AG 0..P-1.
  void run_all_reduce(const Call& c) {
    const int R = host_->size(), l = host_->rank();
    const size_t es = dtype_size(c.dtype);
    const Device d = c.device;
    const int pieces = two_level_pieces(c.kind, c.count, c.bytes, cross_->size() * R);
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
      ar[i] = cross_->all_reduce(recv + off[i], recv + off[i], shard_count(count[i], R, l), c.dtype, d, c.op);
    }
    for (size_t i = 0; i < ar.size(); ++i) {
      step(ar[i]);
      ag[i] = host_->all_gather(recv + off[i], recv + lo[i], count[i], c.dtype, d);
    }
    for (const auto& w : ag) step(w);
  }

  // Slots of S elements, piece-major (Note [Two-level pipeline]): piece k holds elements [o_k, o_k + S_k) of
  // every slot, block k of the scratch P the n slots' pieces in slot order, so each piece is a contiguous
  // buffer for the host and the cross collectives.
  struct Slots {
    const HostMap& hosts;
    int H, n, pieces;
    int64_t count, S;
    size_t es;
    char* P;

    // Piece k's first element within a slot, and its length.
    std::pair<int64_t, int64_t> piece(int k) const {
      return {shard_offset(S, pieces, k), shard_count(S, pieces, k)};
    }
    char* block(int64_t o) const { return P + size_t(n) * size_t(o) * es; }  // piece k's, from its o
    // Slot of world rank w (local rank l_w, host h_w) within the block of a piece of `len` elements.
    char* slot_of(int64_t o, int64_t len, int w) const {
      const int index = hosts.local_index[size_t(w)] * H + hosts.host_of[size_t(w)];
      return block(o) + size_t(index) * size_t(len) * es;
    }
    // Of world shard w, the bytes a piece covers: [o, o + len) clipped to the shard.
    size_t covered(int w, int64_t o, int64_t len) const {
      return size_t(std::clamp<int64_t>(shard_count(count, n, w) - o, 0, len)) * es;
    }
    // This rank's slot within its host's block, where a host collective leaves (or takes) its part.
    char* host_part(int64_t o, int64_t len, int l) const {
      return slot_of(o, len, hosts.ranks[0][size_t(l)]);
    }
  };

  // Note [Two-level pipeline]: piece by piece, a first collective, a second once the piece's first has
  // finished, then a local step once its second has; first and second return their Work.
  template <class First, class Second, class Last>
  static void pipeline(const Slots& sl, First&& first, Second&& second, Last&& last) {
    std::vector<WorkHandle> a(size_t(sl.pieces)), b(size_t(sl.pieces));
    for (int k = 0; k < sl.pieces; ++k) {
      const auto [o, len] = sl.piece(k);
      a[size_t(k)] = first(o, len);
    }
    for (int k = 0; k < sl.pieces; ++k) {
      const auto [o, len] = sl.piece(k);
      step(a[size_t(k)]);
      b[size_t(k)] = second(o, len);
    }
    for (int k = 0; k < sl.pieces; ++k) {
      const auto [o, len] = sl.piece(k);
      step(b[size_t(k)]);
      last(o, len);
    }
  }

  // Every rank's shards into the slots, reduced inside the host, then across hosts into our slot.
  void run_reduce_scatter(const Call& c, const Slots& sl) {
    const int me = rank(), l = host_->rank();
    const Device d = c.device;
    const size_t es = sl.es;
    const auto gather_slots = [&](int64_t o, int64_t len) {
      for (int w = 0; w < sl.n; ++w) {
        const size_t b = sl.covered(w, o, len);
        char* dst = sl.slot_of(o, len, w);
        copy(dst, static_cast<const char*>(c.send) + size_t(shard_offset(c.count, sl.n, w) + o) * es, b, d);
        // The padding is reduced but never read; zeroed on the CPU so that no stray NaN is summed.
        if (b < size_t(len) * es && d.is_cpu()) std::memset(dst + b, 0, size_t(len) * es - b);
      }
      return host_->reduce_scatter(sl.block(o), sl.host_part(o, len, l), int64_t(sl.n) * len, c.dtype, d,
                                   c.op);
    };
    pipeline(
        sl, gather_slots,
        [&](int64_t o, int64_t len) {
          return cross_->reduce_scatter(sl.host_part(o, len, l), sl.slot_of(o, len, me), int64_t(sl.H) * len,
                                        c.dtype, d, c.op);
        },
        [&](int64_t o, int64_t len) {
          copy(static_cast<char*>(c.recv) + size_t(o) * es, sl.slot_of(o, len, me), sl.covered(me, o, len),
               d);
        });
  }

  // Our shard into our slot, gathered across hosts, then inside the host; every slot back to its shard.
  void run_all_gather(const Call& c, const Slots& sl) {
    const int me = rank(), l = host_->rank();
    const Device d = c.device;
    const size_t es = sl.es;
    const auto gather_across = [&](int64_t o, int64_t len) {
      const size_t b = sl.covered(me, o, len);
      char* own = sl.slot_of(o, len, me);
      copy(own, static_cast<const char*>(c.send) + size_t(o) * es, b, d);
      if (b < size_t(len) * es && d.is_cpu()) std::memset(own + b, 0, size_t(len) * es - b);
      return cross_->all_gather(own, sl.host_part(o, len, l), int64_t(sl.H) * len, c.dtype, d);
    };
    pipeline(
        sl, gather_across,
        [&](int64_t o, int64_t len) {
          return host_->all_gather(sl.host_part(o, len, l), sl.block(o), int64_t(sl.n) * len, c.dtype, d);
        },
        [&](int64_t o, int64_t len) {
          for (int w = 0; w < sl.n; ++w)
            copy(static_cast<char*>(c.recv) + size_t(shard_offset(c.count, sl.n, w) + o) * es,
                 sl.slot_of(o, len, w), sl.covered(w, o, len), d);
        });
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
        std::unique_lock<std::mutex> lock(queue_.mutex());
        std::deque<Task>& queued = queue_.tasks();
        queue_.ready().wait(lock, [&] { return stop_ || !queued.empty(); });
        if (queued.empty()) return;
        task = std::move(queued.front());
        queued.pop_front();
      }
      task.work->mark_started();
      try {
        if (queue_.broken())
          throw CommError(fmt::format("the communicator failed earlier: {}", queue_.reason()));
        run_steps(task.call);
        task.work->mark_done();
      } catch (const std::exception& e) {
        const std::string error = fmt::format("{} (two-level): {}", task.call.what, e.what());
        task.work->mark_failed(error);
        queue_.fail_all(error);  // queued calls fail with the first error, and so do later ones
      }
      queue_.retire(1);
    }
  }

  HostMap hosts_;
  Topology topology_;
  std::unique_ptr<Communicator> flat_, host_, cross_;
  DataPtr scratch_;
  std::thread thread_;
  mutable std::mutex choice_mu_;
  mutable std::map<std::pair<Collective, size_t>, bool> choices_;  // auto's answers by call
  WorkQueue<Task> queue_;  // MPI: queued and running (Note [Back-pressure])
  bool stop_ = false;      // guarded by queue_.mutex()
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
