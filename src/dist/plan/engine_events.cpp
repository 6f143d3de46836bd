// Note [What the engine allocates]
// ZeroEngine's parts (src/dist/zero/: grad_reducer.cpp, unit_gatherer.cpp, offload.cpp) allocate during a
// step only what this file replays; its model state is allocated once (Note [ZeRO memory model]). When each
// of these happens is the step schedule's to say (Note [Step plan], Note [One schedule]): this file drives it
// from the same points as the engine and carries out its events on the trace.
//  * Gradients (GradReducer::on_grad_ready, run by AccumulateGrad after the gradient became .grad and before
//    AccumulateGrad lets go of it). Stages 0-1: the gradient was added into the full gradient buffer; only
//    on the last micro-step does the hook count it. Stages 2-3: the partition's bucket (its padded size in
//    the reduce dtype) is allocated at its first gradient, the gradient copied in and .grad dropped.
//  * A partition whose last gradient arrived is launched (GradReducer::launch): stages 0-1 all-reduce or
//    reduce-scatter a view of the gradient buffer, or a copy cast to the reduce dtype when it differs; at
//    most two collectives are in flight, so a third first finishes the oldest (its bucket or cast copy is
//    freed; at stages 2-3 its chunk was added into the fp32 gradient shard, or handed to the offload worker,
//    which copies it to the host at once). Up to three buckets are alive: two in flight and one filling.
//  * Stage 3 (Note [Stage-3 units]): a unit is gathered (its padded size in the compute dtype) at its
//  forward-
//    pre hook and released at its forward hook; gathered again at its backward-pre hook and released when
//    its reduce-scatter is launched. From the second pass on, the next --prefetch units in the recorded order
//    (the previous ones in backward) are gathered ahead. Under activation checkpointing the recompute runs
//    the forward hooks inside backward, where the forward hook keeps the unit. Parameters whose storage is
//    released (LinearBackward keeps the weight tensor itself) cost nothing while released.
//  * The communicator's ring scratch (src/dist/comm/mpi_communicator.cpp HostBuffer on the CPU, the NCCL
//    communicator's device block on CUDA): two slots of one chunk (one with 2 ranks) for the partial sums of
//    reduce-scatter and all-reduce, grown when a larger collective comes (on the CPU the old block is freed
//    first, on CUDA the new one is taken first) and kept for good; all-gather and broadcast need none. One
//    rank has no communicator. The replay grows it when a collective is launched. On a 2-D mesh the shard and
//    replication groups have communicators (and scratch) of their own, unless one spans the world: a stage
//    1-3 partition is reduce-scattered in the shard group, then its chunk all-reduced across the replication
//    group (Note [Cross all-reduce]); the loss is all-reduced over the world, the global norm over the shard
//    group. Each communicator's thread grows its own scratch, so the replay tags each with the communicator's
//    label (TraceEvent::thread).
//  * A two-level world communicator (--comm-impl hier, or auto where dist::takes_two_levels says so for the
//    call; src/dist/comm/hier_communicator.cpp): its host and cross communicators ("world.host",
//    "world.cross") grow their ring scratch with each piece's steps (Note [Two-level pipeline]), and its own
//    thread ("world") a pack scratch of the slots for reduce-scatter and all-gather (stage 3's gathers,
//    stages 1-2's after the update), kept and grown like the ring's; calls
//    it leaves on its flat ring grow that ring's scratch ("world.flat"). EngineEvents::two_level.
//  * The step: a one-element f64 tensor per ProcessGroup::all_reduce of a scalar (the mean loss; the global
//    norm at stages 1-3) and the squared-norm scalars of ShardedState::global_grad_norm, one per partition
//    summed as they come.
#include "dist/plan/engine_events.h"

#include <algorithm>
#include <utility>

#include "dist/comm/hier_communicator.h"
#include "dist/comm/mesh.h"
#include "dist/comm/types.h"
#include "dist/zero/gather_codec.h"
#include "dist/zero/quant_reduce.h"
#include "dist/zero/quant_reduce_hier.h"
#include "tensor/check.h"

namespace cz::plan {
namespace {
constexpr MemoryEvents::Id kNone = -1;
}  // namespace

EngineEvents::EngineEvents(MemoryEvents& m, EngineSpec spec)
    : m_(m), s_(std::move(spec)), schedule_(s_.plan, s_.layout, s_.prefetch, s_.units) {
  schedule_.bind(this, this, this);
  const zero::ZeroLayout& L = s_.layout;
  for (size_t i = 0; i < L.flat.segments.size(); ++i) param_index_[L.flat.segments[i].name] = i;
  const size_t np = L.partitions.size();
  bucket_.assign(np, kNone);
  gathered_.assign(np, kNone);
  wire_.assign(np, kNone);
  in_flight_.resize(np);
  if (s_.plan.chunk_gathers())
    for (size_t u = 0; u < s_.units.size(); ++u) unit_index_[s_.units[u]] = u;
}

size_t EngineEvents::param_index(const std::string& name) const {
  const auto it = param_index_.find(name);
  CZ_ASSERT(it != param_index_.end(), "planner: no parameter '{}' in the layout", name);
  return it->second;
}

int EngineEvents::unit_of_module(const std::string& module) const {
  if (!s_.plan.unit_gathers()) return -1;
  for (size_t p = 0; p < s_.layout.partitions.size(); ++p)
    if (s_.layout.partitions[p].name == module) return int(p);
  return -1;
}

void EngineEvents::backward_begin(bool last_micro_step) {
  schedule_.begin_backward(last_micro_step);
}

void EngineEvents::backward_end() {
  schedule_.end_backward(true);
}

void EngineEvents::grad_ready(size_t param, Id grad) {
  const size_t p = schedule_.partition_of(param);
  if (s_.plan.buckets() && bucket_[p] == kNone)
    bucket_[p] = m_.alloc(s_.layout.partitions[p].numel * int64_t(dtype_size(s_.plan.bucket_dtype())),
                          Use::bucket, "gradient bucket");
  schedule_.grad_ready(param);
  m_.release(grad);
}

void EngineEvents::prepare(size_t p) {
  const int64_t numel = s_.layout.partitions[p].numel, er = int64_t(dtype_size(s_.plan.bucket_dtype()));
  if (s_.plan.buckets()) {
    if (bucket_[p] == kNone) bucket_[p] = m_.alloc(numel * er, Use::bucket, "gradient bucket");
  } else if (s_.plan.bucket_dtype() != s_.plan.compute()) {
    in_flight_[p].cast = m_.alloc(numel * er, Use::bucket, "gradients cast to the reduce dtype");
  }
}

void EngineEvents::launch(size_t p) {
  const zero::StepPlan& plan = s_.plan;
  const int64_t numel = s_.layout.partitions[p].numel, er = int64_t(dtype_size(plan.bucket_dtype()));
  const int64_t qb = plan.quant_block();
  InFlight& f = in_flight_[p];
  const int group = plan.reduce_group();
  switch (plan.reduce_kind()) {
    case zero::ReduceKind::quantized_all_reduce:
      // QuantizedAllReduce: the reduce-scatter's records, then the second exchange's, both at launch.
      f.records = m_.alloc(zero::quantized_reduce_buffer_bytes(group, numel / group, qb), Use::bucket,
                           "reduction records");
      f.records2 = m_.alloc(zero::quantized_all_reduce_buffer_bytes(group, numel / group, qb), Use::bucket,
                            "all-reduce records");
      break;
    case zero::ReduceKind::two_hop_reduce_scatter:
    case zero::ReduceKind::two_hop_all_reduce: {
      // TwoHopQuantizedReduceScatter: its records and the host's fp32 partial sums, both at launch; at stage
      // 0 (TwoHopQuantizedAllReduce) then the second exchange's records.
      const int hosts = plan.world() / s_.ranks_per_host;
      const int64_t chunk = plan.sharded() ? s_.layout.chunk(p) : numel / group;
      f.records = m_.alloc(zero::two_hop_records_bytes(hosts, s_.ranks_per_host, chunk, qb), Use::bucket,
                           "reduction records");
      f.records2 = m_.alloc(zero::two_hop_partial_bytes(hosts, chunk), Use::bucket, "two-hop partial sums");
      if (plan.reduce_kind() == zero::ReduceKind::two_hop_all_reduce)
        f.records3 = m_.alloc(zero::quantized_all_reduce_buffer_bytes(group, chunk, qb), Use::bucket,
                              "all-reduce records");
      break;
    }
    case zero::ReduceKind::quantized_reduce_scatter:
      // An all-to-all of records (QuantizedReduceScatter): point to point, no ring scratch.
      f.records = m_.alloc(zero::quantized_reduce_buffer_bytes(group, s_.layout.chunk(p), qb), Use::bucket,
                           "reduction records");
      break;
    case zero::ReduceKind::all_reduce:
      collective(world_comm, dist::Collective::all_reduce, numel, er);
      break;
    case zero::ReduceKind::reduce_scatter:
      collective(shard_comm, dist::Collective::reduce_scatter, numel, er);
      collective(replicate_comm, dist::Collective::all_reduce, numel / plan.shards(), er);
      break;
  }
}

void EngineEvents::finish(size_t p) {
  InFlight& f = in_flight_[p];
  for (Id* id : {&f.records, &f.records2, &f.records3})  // freed once summed, before the bucket
    if (*id != kNone) m_.release(std::exchange(*id, kNone));
  if (s_.plan.buckets()) {
    m_.release(std::exchange(bucket_[p], kNone));
  } else if (f.cast != kNone) {
    m_.release(std::exchange(f.cast, kNone));
  }
}

void EngineEvents::collective(Comm c, dist::Collective kind, int64_t count, int64_t elem_bytes) {
  const int world = s_.plan.world(), shards = s_.plan.shards();
  const int size = c == world_comm ? world : c == shard_comm ? shards : world / shards;
  if (size < 2) return;
  // A group spanning the world shares the world's communicator (Mesh): the shard group of a flat run, the
  // replication group of shard groups of one.
  if (size == world) c = world_comm;
  if (c == world_comm && hier() && s_.two_level(kind, count * elem_bytes))
    return two_level(kind, count, elem_bytes);
  if (kind != dist::Collective::all_gather) ring_scratch(c, size, count, elem_bytes);
}

void EngineEvents::ring_scratch(Comm c, int size, int64_t count, int64_t elem_bytes) {
  if (count == 0) return;  // the ring returns before it asks for scratch
  const int64_t slot = dist::shard_count(count, size, 0) * elem_bytes;
  grow(c, (size > 2 ? 2 : 1) * slot);
}

// Note [Two-level collectives], step by step, on hosts of R consecutive ranks: the scratch each call grows
// on the host and cross communicators' threads, each in its own order (host: the pieces' reduce-scatters;
// cross: the pieces' all-reduces or reduce-scatters), and the slots' pack scratch on the two-level
// communicator's own thread. The replay grows them all when the call is launched, never later than the
// threads do.
void EngineEvents::two_level(dist::Collective kind, int64_t count, int64_t elem_bytes) {
  if (count == 0) return;
  const int R = s_.ranks_per_host, H = s_.plan.world() / R, n = s_.plan.world(), l = s_.rank % R;
  const int pieces = dist::two_level_pieces(kind, count, size_t(count * elem_bytes), n);
  if (kind == dist::Collective::all_reduce) {
    for (int k = 0; k < pieces; ++k)
      ring_scratch(host_level, R, dist::shard_count(count, pieces, k), elem_bytes);
    for (int k = 0; k < pieces; ++k)
      ring_scratch(cross_level, H, dist::shard_count(dist::shard_count(count, pieces, k), R, l), elem_bytes);
    return;
  }
  const int64_t S = (count + n - 1) / n;  // a slot
  if (s_.cuda) {
    // NCCL runs the steps inline on the caller's stream, the pack scratch a block per call.
    m_.release(m_.alloc(n * S * elem_bytes, Use::scratch, "two-level pack scratch"));
  } else {
    grow(pack, n * S * elem_bytes);
  }
  if (kind != dist::Collective::reduce_scatter) return;
  for (int k = 0; k < pieces; ++k)
    ring_scratch(host_level, R, n * dist::shard_count(S, pieces, k), elem_bytes);
  for (int k = 0; k < pieces; ++k)
    ring_scratch(cross_level, H, H * dist::shard_count(S, pieces, k), elem_bytes);
}

void EngineEvents::grow(Comm c, int64_t need) {
  Id& scratch = scratch_[c];
  int64_t& bytes = scratch_bytes_[c];
  if (scratch != kNone && bytes >= need) return;
  bytes = std::max<int64_t>(need, s_.cuda && c != pack ? 256 : 64);
  // The communicator's own thread asks for it, by its label (Mesh's, and a two-level world's inner
  // communicators' after it: dist::current_communicator() on that thread).
  static const std::string kWorldFlat = std::string(dist::kWorldComm) + dist::kFlatLevel;
  static const std::string kWorldHost = std::string(dist::kWorldComm) + dist::kHostLevel;
  static const std::string kWorldCross = std::string(dist::kWorldComm) + dist::kCrossLevel;
  static const char* const kThread[] = {dist::kWorldComm,   dist::kShardComm,    dist::kReplicateComm,
                                        kWorldHost.c_str(), kWorldCross.c_str(), dist::kWorldComm};
  const char* thread = c == world_comm && hier() ? kWorldFlat.c_str() : kThread[c];
  // On the CPU the old block is freed before the new one is taken (HostBuffer in mpi_communicator.cpp, the
  // two-level communicator's scratch); the NCCL communicator's device block is replaced on its stream, the
  // new one taken first.
  if (scratch != kNone && !s_.cuda) m_.release(std::exchange(scratch, kNone));
  const Id grown =
      m_.alloc(bytes, Use::scratch, c == pack ? "two-level pack scratch" : "ring scratch", -1, thread);
  if (scratch != kNone) m_.release(scratch);
  scratch = grown;
}

void EngineEvents::gather(size_t p) {
  const int64_t numel = s_.layout.partitions[p].numel, ec = int64_t(dtype_size(s_.plan.compute()));
  gathered_[p] = m_.alloc(numel * ec, Use::gather, "gathered unit");
  const bool backward = schedule_.in_backward();
  // hpZ: from the host-local slices, in the compute dtype; an all-gather grows no ring scratch.
  if (s_.plan.host_local_gather(backward)) return;
  gather_collective(p, backward);
}

void EngineEvents::gather_collective(size_t p, bool backward) {
  if (const int64_t w = s_.plan.gather_records_bytes(s_.layout, p, backward)) {
    wire_[p] = m_.alloc(w, Use::gather, "gathered records");
    collective(shard_comm, dist::Collective::all_gather, w, 1);
  } else {
    collective(shard_comm, dist::Collective::all_gather, s_.layout.partitions[p].numel,
               int64_t(dtype_size(s_.plan.compute())));
  }
}

void EngineEvents::use(size_t p) {
  if (wire_[p] != kNone) m_.release(std::exchange(wire_[p], kNone));
}

void EngineEvents::release(size_t p) {
  use(p);
  m_.release(std::exchange(gathered_[p], kNone));
}

void EngineEvents::forward_pre(int u) {
  if (u >= 0) schedule_.unit_forward_pre(size_t(u));
}

void EngineEvents::chunk_forward_pre(const std::string& module) {
  const auto it = unit_index_.find(module);  // stages 1-2 only: empty otherwise
  if (it != unit_index_.end()) schedule_.unit_forward_pre_chunks(it->second);
}

void EngineEvents::gather_partition(size_t p) {
  gather_collective(p, false);
}

void EngineEvents::use_partition(size_t p) {
  if (wire_[p] != kNone) m_.release(std::exchange(wire_[p], kNone));
}

void EngineEvents::forward_post(int u) {
  if (u >= 0) schedule_.unit_forward_post(size_t(u));
}

void EngineEvents::backward_pre(int u) {
  if (u >= 0) schedule_.unit_backward_pre(size_t(u));
}

void EngineEvents::all_reduce_scalar() {
  all_reduce_scalar_in(world_comm);
}

void EngineEvents::all_reduce_scalar_in(Comm c) {
  const int size = c == world_comm ? s_.plan.world() : s_.plan.shards();
  if (size < 2) return;  // a group of one returns the value
  const Id t = m_.alloc(8, Use::transient, "all-reduced scalar");
  collective(c, dist::Collective::all_reduce, 1, 8);
  m_.release(t);
}

void EngineEvents::optimizer_step() {
  // global_grad_norm: a squared norm per partition, summed into a new scalar each time.
  Id sum = m_.alloc(8, Use::transient, "gradient norm");
  for (size_t p = 1; p < s_.layout.partitions.size(); ++p) {
    const Id part = m_.alloc(8, Use::transient, "gradient norm");
    const Id next = m_.alloc(8, Use::transient, "gradient norm");
    m_.release(part);
    m_.release(sum);
    sum = next;
  }
  if (s_.plan.sharded()) all_reduce_scalar_in(shard_comm);
  m_.release(sum);
  // Stages 1-2: the updated chunks are all-gathered into the compute copy as the engine's ChunkSchedule says
  // (ChunkGatherer::after_update); quantized, each partition's records into a buffer of its own, decoded and
  // freed in order at once.
  schedule_.after_update();
}

}  // namespace cz::plan
