// The NCCL backend: enqueueing on the communication stream, builtin collectives (uneven shards through
// grouped ncclReduce/ncclBroadcast), the ring over ncclSend/ncclRecv with a device reduction kernel, and the
// watchdog.
#include "dist/comm/cuda/nccl_communicator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "dist/comm/bootstrap.h"
#include "dist/comm/collective_log.h"
#include "dist/comm/cuda/cuda_check.h"
#include "dist/comm/cuda/reduce_kernels.h"
#include "dist/comm/hang_report.h"
#include "dist/comm/mpi_util.h"
#include "dist/comm/ring.h"
#include "dist/comm/topology_detect.h"
#include "tensor/allocator.h"
#include "tensor/cuda/context.h"
#include "tensor/cuda/runtime.h"
#include "tensor/stream.h"

namespace cz::dist {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
    case DType::b8:
      return ncclUint8;
  }
  throw DtypeError(fmt::format("no NCCL type for {}", dtype_name(dt)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::avg ? ncclAvg : ncclSum;
}

// A device block used on the communicator's stream `stream`: allocated for the caller's current stream (the
// collective is ordered after it by the submit event) and recorded on `stream`, so that when freed it waits
// for the work queued there.
DataPtr comm_block(size_t bytes, int device, cudaStream_t stream) {
  Allocator& a = cuda_runtime::device_allocator(device);
  DataPtr block = a.allocate(bytes);
  a.record_stream(block.get(), Stream{Device::cuda(device), stream});
  return block;
}

// The ring's transport over NCCL: everything is ordered on one stream, so waits are no-ops.
class NcclRingTransport final : public RingTransport {
 public:
  NcclRingTransport(ncclComm_t comm, cudaStream_t stream, DataPtr& scratch, int device)
      : comm_(comm), stream_(stream), scratch_(scratch), device_(device) {}

  int exchange(int to, const void* send, size_t send_bytes, int from, void* recv, size_t recv_bytes,
               int) override {
    // Send and receive in one group: issued separately, every rank would block in its send (a ring).
    CZ_NCCL(ncclGroupStart());
    if (to >= 0 && send_bytes) CZ_NCCL(ncclSend(send, send_bytes, ncclUint8, to, comm_, stream_));
    if (from >= 0 && recv_bytes) CZ_NCCL(ncclRecv(recv, recv_bytes, ncclUint8, from, comm_, stream_));
    CZ_NCCL(ncclGroupEnd());
    return 0;
  }
  void wait_recv(int) override {}
  void wait_send(int) override {}
  void reduce(void* dst, const void* a, const void* b, int64_t count, DType dtype, double scale) override {
    switch (dtype) {
      case DType::f32:
        return CZ_CUDA_COMM(cuda::reduce_add_f32(dst, a, b, count, scale, stream_));
      case DType::f64:
        return CZ_CUDA_COMM(cuda::reduce_add_f64(dst, a, b, count, scale, stream_));
      case DType::f16:
        return CZ_CUDA_COMM(cuda::reduce_add_f16(dst, a, b, count, scale, stream_));
      case DType::bf16:
        return CZ_CUDA_COMM(cuda::reduce_add_bf16(dst, a, b, count, scale, stream_));
      default:
        throw DtypeError(fmt::format("device reduce: f32, f64, f16 or bf16, not {}", dtype_name(dtype)));
    }
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    CZ_CUDA_COMM(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void* scratch(size_t bytes) override {
    if (scratch_.nbytes() < bytes || !scratch_.get()) {
      // Recorded on the stream, so the old block is reused only after the work queued on it so far (Note
      // [Cross-stream frees]); no host synchronisation.
      scratch_ = comm_block(std::max<size_t>(bytes, 256), device_, stream_);
    }
    return scratch_.get();
  }
  void finish() override {}

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  DataPtr& scratch_;
  int device_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(World& world, const CommOptions& options, std::vector<int> ring, GroupComm group)
      : Communicator(group.rank, group.size, options, std::move(ring)),
        world_(world),
        queue_(options.max_in_flight) {
    // The group's MPI communicator only carries the unique id (Note [Groups]).
    struct FreeComm {
      MPI_Comm& c;
      ~FreeComm() { MPI_Comm_free(&c); }
    } free_comm{group.comm};
    CZ_CHECK_DEVICE(options.device.is_cuda(), "the NCCL backend takes CUDA buffers, not {}",
                    options.device.str());
    device_ = options.device.index;
    ::cz::cuda::DeviceGuard guard(device_);  // NCCL binds the communicator to the current device
    // Must happen before NCCL initialises (it reads NCCL_P2P_DISABLE then).
    check_gpu_p2p_and_configure_nccl();
    ncclUniqueId id;
    if (group.rank == 0) CZ_NCCL(ncclGetUniqueId(&id));
    CZ_MPI(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, group.comm));
    CZ_NCCL(ncclCommInitRank(&comm_, group.size, id, group.rank));
    // Non-blocking, at the device's highest priority (as cuda::comm_stream), so collectives are not starved
    // by the compute kernels they overlap with. Not the shared comm_stream itself: two communicators on one
    // stream would serialise their collectives, and ranks could order them differently.
    int least = 0, greatest = 0;
    CZ_CUDA_COMM(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CZ_CUDA_COMM(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    slice_bytes_ = options.slice_bytes > 0 ? options.slice_bytes : kNcclSliceBytes;
    abort_hook_ = add_abort_hook([this] { abort(); });
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(queue_.mutex());
      stop_ = true;
    }
    queue_.ready().notify_all();
    watchdog_.join();
    remove_abort_hook(abort_hook_);
    if (!aborted_.load()) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    scratch_ = DataPtr();
    cudaStreamDestroy(stream_);
  }

  // From any thread (the abort hook of die(), the watchdog): fails what is in flight, refuses later calls
  // (they would use the freed communicator) and aborts NCCL.
  void abort() noexcept override {
    try {
      fail("comm failure: the communicator was aborted");
    } catch (...) {
      abort_nccl();
    }
  }

 protected:
  bool accepts(Device d) const override { return d.is_cuda() && d.index == device_; }

  void note_tensor_use(const Tensor& t) override {
    if (Allocator* a = t.storage()->allocator())
      a->record_stream(t.storage()->data(), Stream{t.device(), stream_});
  }

  WorkHandle submit(Call c) override {
    auto work = std::make_shared<Work>(c.what, c.device);
    work->set_trace_lane(fmt::format("comm {} (nccl)", label()));  // --trace: one lane per stream
    std::lock_guard<std::mutex> enqueue_lock(enqueue_mu_);  // NCCL calls on one communicator are serialised
    CollectiveLog::Ticket ticket;  // Note [Collective log]: running from the enqueue to the device's end
    {
      std::unique_lock<std::mutex> lock(queue_.mutex());
      // Note [Back-pressure]: the watchdog retires finished collectives and, once the oldest times out, fails
      // them all, so this wait ends within that collective's timeout.
      if (!queue_.admit(lock, *work)) return work;
      // The host part (NCCL may block in it, e.g. while connecting to a peer that never arrives) is watched
      // like the device part: Note [Failure handling].
      ticket = CollectiveLog::local().begin(
          log_id(), c.kind, int64_t(c.bytes),
          c.kind == Collective::send || c.kind == Collective::recv ? members()[size_t(c.peer)] : -1);
      enqueuing_ = Watched{c.what, Clock::now(), Logged{ticket, c.kind, int64_t(c.bytes)}};
    }
    queue_.ready().notify_one();
    struct EndEnqueuing {
      NcclCommunicator* self;
      ~EndEnqueuing() {
        std::lock_guard<std::mutex> lock(self->queue_.mutex());
        self->enqueuing_.reset();
      }
    } end_enqueuing{this};
    try {
      ::cz::cuda::DeviceGuard guard(device_);
      const Stream comm_stream{c.device, stream_};
      // Note [Comm streams]: the collective sees everything queued on the caller's stream before the call.
      void* ready = cuda_runtime::event_create(device_);
      cuda_runtime::event_record(ready, current_stream(c.device));
      cuda_runtime::event_wait(ready, comm_stream);
      cuda_runtime::event_destroy(ready);
      void* start = cuda_runtime::event_create(device_);  // times the device-side part (Work::run_seconds)
      cuda_runtime::event_record(start, comm_stream);
      work->set_device_start_event(start);
      enqueue(c);
      void* done = cuda_runtime::event_create(device_);
      cuda_runtime::event_record(done, comm_stream);
      work->set_device_event(done);
      std::string failed_meanwhile;  // the watchdog gave up on the communicator while NCCL was enqueueing
      {
        std::lock_guard<std::mutex> lock(queue_.mutex());
        if (queue_.broken())
          failed_meanwhile = queue_.reason_locked();
        else
          queue_.tasks().push_back(
              {work, done, Clock::now(), c.what, Logged{ticket, c.kind, int64_t(c.bytes)}});
      }
      if (failed_meanwhile.empty())
        work->mark_done();  // the host part; the device part is the event
      else
        work->mark_failed(fmt::format("{}: {}", c.what, failed_meanwhile));
      if (!failed_meanwhile.empty()) CollectiveLog::local().end(ticket, false);
      queue_.ready().notify_one();
    } catch (const std::exception& e) {
      CollectiveLog::local().end(ticket, false);
      work->mark_failed(e.what());
      fail(e.what());
    }
    return work;
  }

 private:
  struct Logged {  // what the collective log and a timeout's report know it by
    CollectiveLog::Ticket ticket;
    Collective kind = Collective::barrier;
    int64_t bytes = 0;
  };
  struct Inflight {
    WorkHandle work;
    void* done;  // owned by the Work
    Clock::time_point start;
    std::string what;
    Logged logged;
  };
  struct Watched {  // what the watchdog times: the oldest collective, or a submit inside NCCL's host calls
    std::string what;
    Clock::time_point start;
    Logged logged;
  };

  void enqueue(const Call& c) {
    const int n = size(), me = rank();
    const ncclDataType_t dt = nccl_type(c.dtype);
    const size_t es = dtype_size(c.dtype);
    if (c.kind == Collective::send) {
      CZ_NCCL(ncclSend(c.send, size_t(c.count), dt, c.peer, comm_, stream_));
      return;
    }
    if (c.kind == Collective::recv) {
      CZ_NCCL(ncclRecv(c.recv, size_t(c.count), dt, c.peer, comm_, stream_));
      return;
    }
    if (c.kind == Collective::barrier) {
      if (!barrier_buf_.get()) barrier_buf_ = comm_block(sizeof(float), device_, stream_);
      CZ_NCCL(ncclAllReduce(barrier_buf_.get(), barrier_buf_.get(), 1, ncclFloat32, ncclSum, comm_, stream_));
      return;
    }
    if (algorithm() == Algorithm::ring) {
      NcclRingTransport transport(comm_, stream_, scratch_, device_);
      run_ring(ring_spec(c, c.send, c.recv, me, ring(), slice_bytes_), transport);
      return;
    }
    const bool even = c.count % n == 0;
    switch (c.kind) {
      case Collective::all_reduce:
        CZ_NCCL(ncclAllReduce(c.send, c.recv, size_t(c.count), dt, nccl_op(c.op), comm_, stream_));
        return;
      case Collective::reduce_scatter:
        if (even) {
          CZ_NCCL(ncclReduceScatter(c.send, c.recv, size_t(c.count / n), dt, nccl_op(c.op), comm_, stream_));
        } else {  // uneven shards: one reduce per rank, rooted at the shard's owner
          CZ_NCCL(ncclGroupStart());
          for (int r = 0; r < n; ++r) {
            const char* src = static_cast<const char*>(c.send) + size_t(shard_offset(c.count, n, r)) * es;
            CZ_NCCL(ncclReduce(src, c.recv, size_t(shard_count(c.count, n, r)), dt, nccl_op(c.op), r, comm_,
                               stream_));
          }
          CZ_NCCL(ncclGroupEnd());
        }
        return;
      case Collective::all_gather:
        if (even) {
          CZ_NCCL(ncclAllGather(c.send, c.recv, size_t(c.count / n), dt, comm_, stream_));
        } else {  // uneven shards: every rank broadcasts its own
          CZ_NCCL(ncclGroupStart());
          for (int r = 0; r < n; ++r) {
            char* dst = static_cast<char*>(c.recv) + size_t(shard_offset(c.count, n, r)) * es;
            const void* src = r == me ? c.send : dst;
            CZ_NCCL(ncclBroadcast(src, dst, size_t(shard_count(c.count, n, r)), dt, r, comm_, stream_));
          }
          CZ_NCCL(ncclGroupEnd());
        }
        return;
      case Collective::broadcast:
        CZ_NCCL(ncclBroadcast(c.send, c.recv, size_t(c.count), dt, c.peer, comm_, stream_));
        return;
      default:
        break;
    }
    CZ_ASSERT(false, "nccl enqueue: unexpected {}", name(c.kind));
  }

  // Fails every collective in flight with `error`, then aborts NCCL so that its kernels return.
  void fail(const std::string& error) {
    for (auto& f : queue_.break_with(error)) {  // callers blocked in submit() are refused from now on
      CollectiveLog::local().end(f.logged.ticket, false);
      f.work->mark_failed(fmt::format("{}: {}", f.what, error));
    }
    abort_nccl();
  }

  void abort_nccl() noexcept {
    std::lock_guard<std::mutex> lock(abort_mu_);  // the watchdog must not query a communicator being freed
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

  // Note [Failure handling]: polls the oldest collective's event every millisecond (sleeping in between; a
  // submit still inside NCCL's host calls counts as in flight, since they can block on a peer), and NCCL's
  // asynchronous error state; fails everything in flight on timeout, error or a dead peer.
  void watch() {
    // Event queries need a current device: this thread never chose one, so the guard makes device_ its device
    // for good (Note [Current device]); otherwise it would adopt the process's default one.
    try {
      ::cz::cuda::DeviceGuard guard(device_);
    } catch (const std::exception& e) {
      fail(fmt::format("comm failure: the watchdog cannot use cuda:{}: {}", device_, e.what()));
    }
    auto next_liveness = Clock::now();
    for (;;) {
      if (queue_.broken()) {  // everything in flight has failed and later calls are refused: nothing to watch
        std::unique_lock<std::mutex> lock(queue_.mutex());
        queue_.ready().wait(lock, [&] { return stop_; });
        return;
      }
      Watched oldest;
      std::string error;
      size_t finished = 0;
      bool idle = false;
      {
        std::unique_lock<std::mutex> lock(queue_.mutex());
        // Idle: sleep until there is something to watch. (A wait_for with this predicate would return at once
        // whenever work is in flight, and the thread would spin on cudaEventQuery holding the mutex.)
        std::deque<Inflight>& inflight = queue_.tasks();
        queue_.ready().wait(lock, [&] { return stop_ || !inflight.empty() || enqueuing_.has_value(); });
        finished = end_finished(inflight, error);
        idle = error.empty() && inflight.empty() && !enqueuing_;
        if (idle && stop_) return;
        // The oldest unfinished thing: a collective on the device, else the submit inside NCCL's host calls.
        if (!inflight.empty())
          oldest = {inflight.front().what, inflight.front().start, inflight.front().logged};
        else if (enqueuing_)
          oldest = *enqueuing_;
      }
      if (finished) queue_.retire(finished);  // callers blocked in submit() may go on
      if (idle) continue;
      if (error.empty()) error = health_error(oldest, next_liveness);
      if (!error.empty()) {
        fail(error);
        continue;
      }
      std::this_thread::sleep_for(
          std::chrono::milliseconds(1));  // the polling interval while work is in flight
    }
  }

  // Ends the collectives at the front of `inflight` whose device part has finished, and returns how many; a
  // device error becomes `error` (it must not escape the watchdog: std::terminate). The mutex is held.
  size_t end_finished(std::deque<Inflight>& inflight, std::string& error) {
    size_t n = 0;
    try {
      while (!inflight.empty() && cuda_runtime::event_query(inflight.front().done)) {
        CollectiveLog::local().end(inflight.front().logged.ticket, true);
        inflight.pop_front();
        ++n;
      }
    } catch (const std::exception& e) {
      error = fmt::format("comm failure: {} failed on the device: {}", inflight.front().what, e.what());
    }
    return n;
  }

  // Why the communicator must fail now, or "": NCCL's asynchronous error, the oldest call past its timeout,
  // or (every 100 ms) a peer that died.
  std::string health_error(const Watched& oldest, Clock::time_point& next_liveness) {
    const std::string& what = oldest.what;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      ncclResult_t async = ncclSuccess;
      if (!aborted_.load() && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress)
        return fmt::format("comm failure: NCCL reported {} during {}", ncclGetErrorString(async), what);
    }
    const auto now = Clock::now();
    if (now - oldest.start > std::chrono::duration<double>(options().timeout_s)) {
      const Logged& l = oldest.logged;
      return fmt::format("comm timeout: {} after {:.1f} s{}", what, options().timeout_s,
                         hang_report({l.ticket.comm, l.ticket.seq, l.kind, l.bytes}, label(), members()));
    }
    if (now < next_liveness) return {};
    next_liveness = now + std::chrono::milliseconds(100);
    for (int r = 0; r < size(); ++r) {
      const int w = members()[size_t(r)];
      if (r != rank() && !world_.peer_alive(w))
        return fmt::format("comm failure: peer rank {} (pid {} on {}) died during {}", w, world_.peer(w).pid,
                           world_.peer(w).host, what);
    }
    return {};
  }

  World& world_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int64_t slice_bytes_ = kNcclSliceBytes;
  DataPtr scratch_, barrier_buf_;
  int abort_hook_ = 0;
  std::mutex enqueue_mu_;
  std::mutex abort_mu_;  // ncclCommAbort vs the watchdog's ncclCommGetAsyncError
  // The collectives on the device, oldest first, retired by the watchdog (Note [Back-pressure]); its ready()
  // wakes the watchdog.
  WorkQueue<Inflight> queue_;
  std::optional<Watched> enqueuing_;  // guarded by queue_.mutex()
  bool stop_ = false;                 // guarded by queue_.mutex()
  std::atomic<bool> aborted_{false};
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(World& world, const CommOptions& options,
                                                     std::vector<int> ring, GroupComm group) {
  return std::make_unique<NcclCommunicator>(world, options, std::move(ring), group);
}

}  // namespace cz::dist
