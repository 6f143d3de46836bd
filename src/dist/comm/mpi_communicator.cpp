// The MPI backend: the communication thread, builtin collectives (MPI's nonblocking ones, polled per
// Note [Polling]), the ring over MPI point-to-point, user send/recv, and staging of CUDA buffers.
#include "dist/comm/mpi_communicator.h"

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "dist/comm/bootstrap.h"
#include "dist/comm/collective_log.h"
#include "dist/comm/hang_report.h"
#include "dist/comm/mpi_util.h"
#include "dist/comm/progress.h"
#include "dist/comm/reduce_kernels.h"
#include "dist/comm/ring.h"
#include "tensor/allocator.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::dist {
namespace {

constexpr int kUserTag = 0;                         // user send/recv; the ring uses tags from 1
constexpr int64_t kProgressPieceBytes = 128 << 10;  // ring reductions call into MPI this often

int to_int(int64_t v, const char* what) {
  CZ_CHECK_T(CommError, v <= INT_MAX, "{} of {} exceeds what one MPI call takes (INT_MAX); use --impl ring",
             what, v);
  return int(v);
}

// Grows on demand; keeps its bytes between calls. Its contents do not outlive a call, so the old block is
// freed before the larger one is taken: the two are never held at once, at a moment the main thread's own
// peak may be (Note [Allocator event log]; the replay grows it the same way, EngineEvents::grow).
struct HostBuffer {
  DataPtr data;
  void* get(size_t bytes, Allocator& alloc) {
    if (data.nbytes() < bytes || !data.get()) {
      data = DataPtr();
      data = alloc.allocate(std::max<size_t>(bytes, 64));
    }
    return data.get();
  }
};

class MpiRingTransport final : public RingTransport {
 public:
  MpiRingTransport(MPI_Comm comm, Poller& poller, HostBuffer& scratch)
      : comm_(comm), poller_(poller), scratch_(scratch) {}

  int exchange(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
               int tag) override {
    Pair p;
    p.to = to;
    p.from = from;
    if (from >= 0 && recv_bytes)
      CZ_MPI(MPI_Irecv(recv, to_int(int64_t(recv_bytes), "ring slice"), MPI_BYTE, from, tag, comm_, &p.recv));
    if (to >= 0 && send_bytes)
      CZ_MPI(MPI_Isend(send, to_int(int64_t(send_bytes), "ring slice"), MPI_BYTE, to, tag, comm_, &p.send));
    pairs_.push_back(p);
    return int(pairs_.size() - 1);
  }
  void wait_recv(int ticket) override { wait(pairs_[size_t(ticket)].recv, pairs_[size_t(ticket)].from); }
  void wait_send(int ticket) override { wait(pairs_[size_t(ticket)].send, pairs_[size_t(ticket)].to); }
  // Reduces in pieces and lets MPI progress in between: peers' handshakes (a receiver's completion notice, a
  // sender's ready-to-send) are only answered when this thread calls into MPI, so a long reduction would
  // otherwise stall the neighbours' pipelines.
  void reduce(void* dst, const void* a, const void* b, int64_t count, DType dtype, double scale) override {
    const size_t es = dtype_size(dtype);
    const int64_t piece = std::max<int64_t>(1, kProgressPieceBytes / int64_t(es));
    for (int64_t i = 0; i < count; i += piece) {
      const int64_t m = std::min(piece, count - i);
      reduce_add(dtype, static_cast<char*>(dst) + size_t(i) * es,
                 static_cast<const char*>(a) + size_t(i) * es, static_cast<const char*>(b) + size_t(i) * es,
                 m, scale);
      if (i + m < count) poke();
    }
    poller_.progressed();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    for (size_t i = 0; i < bytes; i += kProgressPieceBytes) {
      std::memcpy(static_cast<char*>(dst) + i, static_cast<const char*>(src) + i,
                  std::min<size_t>(kProgressPieceBytes, bytes - i));
      poke();
    }
  }
  void* scratch(size_t bytes) override { return scratch_.get(bytes, allocator_for(Device::cpu())); }
  void finish() override {
    for (auto& p : pairs_) {
      wait(p.recv, p.from);
      wait(p.send, p.to);
    }
    pairs_.clear();
    open_ = 0;
  }

 private:
  struct Pair {
    MPI_Request send = MPI_REQUEST_NULL, recv = MPI_REQUEST_NULL;
    int to = -1, from = -1;
  };
  // One turn of MPI's progress engine: test the oldest request still open.
  void poke() {
    while (open_ < pairs_.size() && pairs_[open_].send == MPI_REQUEST_NULL &&
           pairs_[open_].recv == MPI_REQUEST_NULL)
      ++open_;
    if (open_ == pairs_.size()) return;
    MPI_Request& req = pairs_[open_].recv != MPI_REQUEST_NULL ? pairs_[open_].recv : pairs_[open_].send;
    int flag = 0;
    CZ_MPI(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
  }

  void wait(MPI_Request& req, int peer) {
    poller_.until(
        [&] {
          int flag = 0;
          CZ_MPI(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
          return flag != 0;
        },
        peer);
  }

  MPI_Comm comm_;
  Poller& poller_;
  HostBuffer& scratch_;
  std::vector<Pair> pairs_;
  size_t open_ = 0;  // pairs_ before this index have completed
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(World& world, const CommOptions& options, std::vector<int> ring, GroupComm group)
      : Communicator(group.rank, group.size, options, std::move(ring)),
        world_(world),
        comm_(group.comm),
        queue_(options.max_in_flight) {
    CZ_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    slice_bytes_ = options.slice_bytes > 0 ? options.slice_bytes : kMpiSliceBytes;
    thread_ = std::thread([this] { loop(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(queue_.mutex());
      stop_ = true;
    }
    queue_.ready().notify_all();
    thread_.join();
    if (stream_) cuda_runtime::stream_destroy(stream_);
    // A broken communicator may still have requests in flight; the job is about to be aborted anyway.
    if (!queue_.broken()) MPI_Comm_free(&comm_);
  }

  void abort() noexcept override {
    aborted_.store(true);
    fail_all("communicator aborted");
  }

 protected:
  bool accepts(Device d) const override { return d.is_cpu() || (d.is_cuda() && cuda_runtime::built()); }

  WorkHandle submit(Call call) override {
    auto work = std::make_shared<Work>(call.what, call.device);
    Task task{std::move(call), work, nullptr};
    if (task.call.device.is_cuda() && task.call.kind != Collective::barrier) {
      // Note [Comm streams]: the staging copy must see everything queued on the caller's stream so far.
      task.ready_event = cuda_runtime::event_create(task.call.device.index);
      cuda_runtime::event_record(task.ready_event, current_stream(task.call.device));
    }
    if (!queue_.push(std::move(task)) && task.ready_event) cuda_runtime::event_destroy(task.ready_event);
    return work;
  }

 private:
  struct Task {
    Call call;
    WorkHandle work;
    void* ready_event = nullptr;
  };
  // A user send/recv in flight (they complete out of queue order, so that a pair of ranks can exchange).
  struct P2p {
    MPI_Request req = MPI_REQUEST_NULL;
    WorkHandle work;
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    DataPtr stage;  // pinned copy of a CUDA buffer
    void* device_dst = nullptr;
    size_t bytes = 0;
    Device device;
    Collective kind = Collective::send;
    int peer = -1;  // world rank
    CollectiveLog::Ticket ticket;
  };

  void loop() {
    Poller::tune_thread();
    name_this_thread();
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(queue_.mutex());
        std::deque<Task>& queued = queue_.tasks();
        while (queued.empty()) {
          if (stop_ && p2p_.empty()) return;
          if (p2p_.empty()) {
            queue_.ready().wait(lock);
          } else {
            lock.unlock();
            try {
              poll_p2p();
            } catch (const std::exception& e) {
              fail_all(e.what());
            }
            lock.lock();
            if (queued.empty() && !p2p_.empty()) queue_.ready().wait_for(lock, std::chrono::microseconds(50));
          }
        }
        task = std::move(queued.front());
        queued.pop_front();
      }
      run(task);
    }
  }

  void run(Task& task) {
    const Call& c = task.call;
    const bool p2p = c.kind == Collective::send || c.kind == Collective::recv;
    // Stays set when the call fails: a launcher's SIGTERM may arrive before main() has printed the error.
    set_current_activity(c.what);
    task.work->mark_started();
    CollectiveLog& log = CollectiveLog::local();  // Note [Collective log]
    const CollectiveLog::Ticket ticket =
        log.begin(log_id(), c.kind, int64_t(c.bytes), p2p ? members()[size_t(c.peer)] : -1);
    bool ok = false;
    try {
      if (queue_.broken()) throw CommError(queue_.failed_earlier(*task.work, queue_.reason()));
      Poller poller(&world_, c.what, options().timeout_s, &members());
      poller.set_idle_hook([this] { poll_p2p(); });
      poller.set_abort_flag(&aborted_);
      poller.set_collective({ticket.comm, ticket.seq, c.kind, int64_t(c.bytes)}, label());
      if (p2p) {
        start_p2p(task, poller, ticket);
      } else if (c.device.is_cuda() && c.kind != Collective::barrier) {
        run_staged(task, poller);
        task.work->mark_done();
        log.end(ticket, true);
      } else {
        run_host(c, c.send, c.recv, poller);
        task.work->mark_done();
        log.end(ticket, true);
      }
      ok = true;
    } catch (const std::exception& e) {
      log.end(ticket, false);
      task.work->mark_failed(e.what());
      fail_all(e.what());
    }
    if (task.ready_event) cuda_runtime::event_destroy(task.ready_event);
    if (ok) set_current_activity("");
    // A posted send/recv stays in flight until poll_p2p() sees it complete.
    const bool posted = ok && (c.kind == Collective::send || c.kind == Collective::recv);
    if (!posted) queue_.retire(1);
  }

  // Breaks the communicator: queued calls and user transfers in flight fail with the first error.
  void fail_all(const std::string& error) {
    for (auto& t : queue_.fail_all(error))
      if (t.ready_event) cuda_runtime::event_destroy(t.ready_event);
    if (std::this_thread::get_id() == thread_.get_id()) {
      for (auto& p : p2p_) {
        CollectiveLog::local().end(p.ticket, false);
        p.work->mark_failed(fmt::format("{}: {}", p.what, error));
      }
      queue_.retire(p2p_.size());
      p2p_.clear();
    }
  }

  // The collective on host memory (CPU buffers, or pinned staging copies).
  void run_host(const Call& c, const void* send, void* recv, Poller& poller) {
    if (algorithm() == Algorithm::ring && c.kind != Collective::barrier) {
      RingSpec spec = ring_spec(c, send, recv, rank(), ring(), slice_bytes_);
      spec.tag_base = kUserTag + 1;
      MpiRingTransport transport(comm_, poller, scratch_);
      run_ring(spec, transport);
      return;
    }
    run_builtin(c, send, recv, poller);
  }

  void wait_request(MPI_Request& req, Poller& poller) {
    poller.until([&] {
      int flag = 0;
      CZ_MPI(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
      return flag != 0;
    });
  }

  void run_builtin(const Call& c, const void* send, void* recv, Poller& poller) {
    const int n = size(), me = rank();
    const size_t es = dtype_size(c.dtype);
    const double avg = c.op == ReduceOp::avg ? 1.0 / n : 1.0;
    MPI_Request req = MPI_REQUEST_NULL;
    switch (c.kind) {
      case Collective::barrier:
        CZ_MPI(MPI_Ibarrier(comm_, &req));
        return wait_request(req, poller);
      case Collective::all_reduce: {
        const MPI_Datatype dt = mpi_datatype(c.dtype);
        const bool in_place = send == recv;
        // MPI counts are ints: large buffers go in pieces.
        constexpr int64_t kPiece = int64_t(1) << 30;
        for (int64_t off = 0; off < c.count; off += kPiece) {
          const int len = int(std::min(kPiece, c.count - off));
          char* r = static_cast<char*>(recv) + size_t(off) * es;
          const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + size_t(off) * es;
          CZ_MPI(MPI_Iallreduce(s, r, len, dt, mpi_sum_op(c.dtype), comm_, &req));
          wait_request(req, poller);
        }
        if (c.op == ReduceOp::avg) scale_copy(c.dtype, recv, recv, c.count, avg);
        return;
      }
      case Collective::reduce_scatter:
        return builtin_reduce_scatter(c, send, recv, poller);
      case Collective::all_gather:
        return builtin_all_gather(c, send, recv, poller);
      case Collective::broadcast: {
        const MPI_Datatype dt = mpi_datatype(c.dtype);
        if (me == c.peer && send != recv && c.count) std::memcpy(recv, send, size_t(c.count) * es);
        constexpr int64_t kPiece = int64_t(1) << 30;
        for (int64_t off = 0; off < c.count; off += kPiece) {
          const int len = int(std::min(kPiece, c.count - off));
          CZ_MPI(MPI_Ibcast(static_cast<char*>(recv) + size_t(off) * es, len, dt, c.peer, comm_, &req));
          wait_request(req, poller);
        }
        return;
      }
      case Collective::send:
      case Collective::recv:
        break;
    }
    CZ_ASSERT(false, "run_builtin: unexpected {}", name(c.kind));
  }

  // MPI's reduce-scatter; uneven shards through the counts form.
  void builtin_reduce_scatter(const Call& c, const void* send, void* recv, Poller& poller) {
    const int n = size(), me = rank();
    const size_t es = dtype_size(c.dtype);
    MPI_Request req = MPI_REQUEST_NULL;
    const MPI_Datatype dt = mpi_datatype(c.dtype);
    to_int(c.count, "reduce_scatter count");
    const int64_t mine = shard_count(c.count, n, me);
    char* shard_in_place =
        const_cast<char*>(static_cast<const char*>(send)) + size_t(shard_offset(c.count, n, me)) * es;
    const bool in_place = recv == shard_in_place;
    // MPI's in-place form takes the input from, and leaves the result at the start of, the receive buffer.
    void* rbuf = in_place ? const_cast<void*>(send) : recv;
    const void* sbuf = in_place ? MPI_IN_PLACE : send;
    if (c.count % n == 0) {
      CZ_MPI(MPI_Ireduce_scatter_block(sbuf, rbuf, int(c.count / n), dt, mpi_sum_op(c.dtype), comm_, &req));
    } else {
      counts_.resize(size_t(n));
      for (int r = 0; r < n; ++r) counts_[size_t(r)] = int(shard_count(c.count, n, r));
      CZ_MPI(MPI_Ireduce_scatter(sbuf, rbuf, counts_.data(), dt, mpi_sum_op(c.dtype), comm_, &req));
    }
    wait_request(req, poller);
    if (in_place && rbuf != recv) std::memmove(recv, rbuf, size_t(mine) * es);
    if (c.op == ReduceOp::avg) scale_copy(c.dtype, recv, recv, mine, 1.0 / n);
  }

  // MPI's all-gather; uneven shards through the counts-and-displacements form.
  void builtin_all_gather(const Call& c, const void* send, void* recv, Poller& poller) {
    const int n = size(), me = rank();
    const size_t es = dtype_size(c.dtype);
    MPI_Request req = MPI_REQUEST_NULL;
    const MPI_Datatype dt = mpi_datatype(c.dtype);
    to_int(c.count, "all_gather count");
    const int mine = int(shard_count(c.count, n, me));
    const bool in_place = send == static_cast<char*>(recv) + size_t(shard_offset(c.count, n, me)) * es;
    const void* sbuf = in_place ? MPI_IN_PLACE : send;
    if (c.count % n == 0) {
      CZ_MPI(MPI_Iallgather(sbuf, in_place ? 0 : mine, dt, recv, int(c.count / n), dt, comm_, &req));
    } else {
      counts_.resize(size_t(n));
      displs_.resize(size_t(n));
      for (int r = 0; r < n; ++r) {
        counts_[size_t(r)] = int(shard_count(c.count, n, r));
        displs_[size_t(r)] = int(shard_offset(c.count, n, r));
      }
      CZ_MPI(MPI_Iallgatherv(sbuf, in_place ? 0 : mine, dt, recv, counts_.data(), displs_.data(), dt, comm_,
                             &req));
    }
    return wait_request(req, poller);
  }

  // User send/recv: posted now, completed by poll_p2p().
  void start_p2p(Task& task, Poller& poller, const CollectiveLog::Ticket& ticket) {
    const Call& c = task.call;
    P2p p;
    p.kind = c.kind;
    p.peer = members()[size_t(c.peer)];
    p.ticket = ticket;
    p.work = task.work;
    p.what = c.what;
    p.deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(options().timeout_s));
    p.bytes = c.bytes;
    p.device = c.device;
    const int count = to_int(c.count, "message count");
    const MPI_Datatype dt = mpi_datatype(c.dtype);
    if (c.kind == Collective::send) {
      const void* buf = c.send;
      if (c.device.is_cuda()) {
        p.stage = pinned_host_allocator().allocate(c.bytes);
        Stream cs = comm_stream(c.device);
        cuda_runtime::event_wait(task.ready_event, cs);
        cuda_runtime::memcpy_async(p.stage.get(), c.send, c.bytes, cuda_runtime::CopyKind::device_to_host,
                                   cs);
        sync_stream(cs, poller);
        buf = p.stage.get();
      }
      CZ_MPI(MPI_Isend(buf, count, dt, c.peer, kUserTag, comm_, &p.req));
    } else {
      void* buf = c.recv;
      if (c.device.is_cuda()) {
        p.stage = pinned_host_allocator().allocate(c.bytes);
        p.device_dst = c.recv;
        buf = p.stage.get();
      }
      CZ_MPI(MPI_Irecv(buf, count, dt, c.peer, kUserTag, comm_, &p.req));
    }
    p2p_.push_back(std::move(p));
  }

  void poll_p2p() {
    if (p2p_.empty()) return;
    if (aborted_.load()) throw CommError("comm failure: communicator aborted");
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < p2p_.size();) {
      P2p& p = p2p_[i];
      int flag = 0;
      CZ_MPI(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE));
      if (flag) {
        if (p.device_dst) {
          Stream cs = comm_stream(p.device);
          cuda_runtime::memcpy_async(p.device_dst, p.stage.get(), p.bytes,
                                     cuda_runtime::CopyKind::host_to_device, cs);
          void* done = cuda_runtime::event_create(p.device.index);
          cuda_runtime::event_record(done, cs);
          p.work->set_device_event(done);
          // The pinned copy must outlive the upload.
          cuda_runtime::stream_synchronize(cs);
        }
        p.work->mark_done();
        CollectiveLog::local().end(p.ticket, true);
        p2p_.erase(p2p_.begin() + std::ptrdiff_t(i));
        queue_.retire(1);
        continue;
      }
      if (now > p.deadline) {
        const std::string report = hang_report({p.ticket.comm, 0, p.kind, int64_t(p.bytes)}, label(),
                                               {members()[size_t(rank())], p.peer});
        throw CommError(
            fmt::format("comm timeout: {} after {:.1f} s{}", p.what, options().timeout_s, report));
      }
      ++i;
    }
  }

  // --- CUDA buffers through pinned host memory ---
  Stream comm_stream(Device device) {
    if (!stream_) {
      cuda_runtime::set_device(device.index);
      stream_ = cuda_runtime::stream_create(device.index);
      stream_device_ = device.index;
    }
    CZ_CHECK_DEVICE(device.index == stream_device_,
                    "an MPI communicator stages buffers of one GPU; it started with cuda:{} but got {}",
                    stream_device_, device.str());
    return Stream{device, stream_};
  }

  void sync_stream(Stream cs, Poller& poller) {
    void* ev = cuda_runtime::event_create(cs.device.index);
    cuda_runtime::event_record(ev, cs);
    try {
      poller.until([&] { return cuda_runtime::event_query(ev); });
    } catch (...) {
      cuda_runtime::event_destroy(ev);
      throw;
    }
    cuda_runtime::event_destroy(ev);
  }

  void run_staged(Task& task, Poller& poller) {
    const Call& c = task.call;
    const int n = size(), me = rank();
    const size_t es = dtype_size(c.dtype);
    const size_t full = size_t(c.count) * es;
    const size_t off = size_t(shard_offset(c.count, n, me)) * es;
    const size_t mine = size_t(shard_count(c.count, n, me)) * es;
    Stream cs = comm_stream(c.device);
    if (stage_.data.nbytes() < full) cuda_runtime::stream_synchronize(cs);  // an upload may still read it
    char* h = static_cast<char*>(stage_.get(full, pinned_host_allocator()));
    cuda_runtime::event_wait(task.ready_event, cs);
    using cuda_runtime::CopyKind;
    // Download the input, run the collective in place on the host copy, upload the result.
    const void* hs = h;
    void* hr = h;
    const char* up_src = h;
    size_t up_bytes = full;
    switch (c.kind) {
      case Collective::all_reduce:
        if (full) cuda_runtime::memcpy_async(h, c.send, full, CopyKind::device_to_host, cs);
        break;
      case Collective::reduce_scatter:
        if (full) cuda_runtime::memcpy_async(h, c.send, full, CopyKind::device_to_host, cs);
        hr = h + off;
        up_src = h + off;
        up_bytes = mine;
        break;
      case Collective::all_gather:
        if (mine) cuda_runtime::memcpy_async(h + off, c.send, mine, CopyKind::device_to_host, cs);
        hs = h + off;
        break;
      case Collective::broadcast:
        if (me == c.peer && full) cuda_runtime::memcpy_async(h, c.send, full, CopyKind::device_to_host, cs);
        break;
      default:
        CZ_ASSERT(false, "run_staged: unexpected {}", name(c.kind));
    }
    sync_stream(cs, poller);
    run_host(c, hs, hr, poller);
    if (up_bytes) cuda_runtime::memcpy_async(c.recv, up_src, up_bytes, CopyKind::host_to_device, cs);
    void* done = cuda_runtime::event_create(c.device.index);
    cuda_runtime::event_record(done, cs);
    task.work->set_device_event(done);
  }

  World& world_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int64_t slice_bytes_ = kMpiSliceBytes;
  // In flight (Note [Back-pressure]): queued, running, and posted send/recv until poll_p2p() sees them end.
  WorkQueue<Task> queue_;
  bool stop_ = false;  // guarded by queue_.mutex()
  std::atomic<bool> aborted_{false};
  std::thread thread_;
  // Communication-thread state.
  std::vector<P2p> p2p_;
  std::vector<int> counts_, displs_;
  HostBuffer scratch_, stage_;
  void* stream_ = nullptr;
  int stream_device_ = -1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(World& world, const CommOptions& options,
                                                    std::vector<int> ring, GroupComm group) {
  return std::make_unique<MpiCommunicator>(world, options, std::move(ring), group);
}

}  // namespace cz::dist
