// The gradient reducer: buckets of gradients reduced from the parameters' grad-ready hooks while backward
// runs (Note [ZeRO step] in engine.cpp), over the process group it is given.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "dist/comm/process_group.h"
#include "dist/zero/comm_meter.h"
#include "dist/zero/partition.h"
#include "dist/zero/quant_reduce.h"
#include "dist/zero/quant_reduce_hier.h"
#include "dist/zero/step_plan.h"

namespace cz::zero {

// It carries out ReduceSchedule's events (Note [One schedule]) on real buffers and collectives: its hooks
// drive the step's schedule (Note [Step plan]), which calls it back as its reduction sink. What the plan says
// of the reductions: stages 0-1 reduce in the full gradient buffer `grads` on the last micro-step, stages 2-3
// in buckets filled on every micro-step (each gradient copied in, then dropped; a bucket allocated at its
// first gradient, freed once its reduced chunk is handed on); the kind of every reduction (all-reduce at
// stage 0, reduce-scatter at 1-3, INT8 records, two hops).
class GradReducer : private ReduceSchedule::Sink {
 public:
  // `params`: the model's parameters in layout order (hooks are installed on them). `grads`: the full
  // gradient buffer their .grad views (undefined with buckets). `group`: where buckets are reduced;
  // `replicate` (a group of one when flat): where each reduced chunk is then all-reduced (Note [Cross
  // all-reduce]). Buckets hold the plan's bucket dtype on the group's device.
  GradReducer(const ZeroLayout& layout, std::vector<Tensor> params, Tensor grads, dist::ProcessGroup group,
              dist::ProcessGroup replicate, CommMeter& meter, StepSchedule& schedule);
  ~GradReducer() override;  // removes its hooks, waits for what is in flight; never throws
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Where a partition's reduced chunk (this rank's, averaged; valid during the call) goes, `final` on the
  // step's last micro-step. Without one it stays in the full buffer.
  using ChunkSink = std::function<void(size_t partition, const Tensor& chunk, bool final)>;
  void set_sink(ChunkSink sink) { sink_ = std::move(sink); }
  // What the step's schedule calls to prepare, launch and finish a partition's reduction.
  ReduceSchedule::Sink& sink() { return *this; }
  // The groups of the plan's two-hop reductions (Note [Two-hop quantized reduction]); `group`
  // must be the world in rank order (ValueError otherwise, at the first launch).
  void set_two_hop(dist::ProcessGroup host, dist::ProcessGroup cross, dist::HostMap hosts) {
    host_ = std::move(host);
    cross_ = std::move(cross);
    hosts_ = std::move(hosts);
  }

  // The full buffer back to zero: filled on CUDA; on the CPU its padding zeroed and the parameters' .grad
  // marked zero (Note [Deferred gradient zero]), the segments no gradient reached zeroed by prepare().
  void begin_step();

  const Tensor& grads() const { return grads_; }
  // This rank's chunk of partition p in the full buffer.
  Tensor grad_chunk(size_t p) const;
  int64_t state_bytes() const;  // the full buffer, as the allocator holds it

 private:
  struct InFlight {
    size_t partition;
    dist::WorkHandle work;
    Tensor buffer;           // what the collective reduces (a bucket, or a range of the full gradient buffer)
    dist::WorkHandle cross;  // the chunk's all-reduce across the replication group, once launched
    bool crossed = false;    // launched (or none needed)
    std::unique_ptr<QuantizedReduceScatter> quantized;      // instead of `work`
    std::unique_ptr<QuantizedAllReduce> quantized_all;      // instead of `work` (stage 0)
    std::unique_ptr<TwoHopQuantizedReduceScatter> two_hop;  // instead of `work` (set_two_hop)
    std::unique_ptr<TwoHopQuantizedAllReduce> two_hop_all;  // instead of `work` (set_two_hop, stage 0)
  };
  void launch_cross(InFlight& f);
  void advance();  // launches the cross all-reduces whose reduce-scatter has completed, in launch order
  void on_grad_ready(size_t param, Tensor& p);
  Tensor& bucket(size_t p);  // allocated at first use
  // On the CPU, where neither the full buffer nor a bucket is filled: zeroes the segments of partition p's
  // parameters that got no gradient in `buf` (the partition's range).
  void zero_missing(size_t p, const Tensor& buf);
  // ReduceSchedule::Sink
  void prepare(size_t p) override;
  void launch(size_t p) override;
  void finish(size_t p) override;
  const StepPlan& plan() const { return schedule_.plan(); }
  int64_t own_offset(size_t p) const { return (plan().sharded() ? group_.rank() : 0) * layout_.chunk(p); }

  const ZeroLayout& layout_;
  std::vector<Tensor> params_;
  Tensor grads_;
  dist::ProcessGroup group_;
  dist::ProcessGroup replicate_;
  CommMeter& meter_;
  StepSchedule& schedule_;
  ChunkSink sink_;
  dist::ProcessGroup host_, cross_;
  dist::HostMap hosts_;
  Tensor prepared_;              // the buffer of the partition being launched, from prepare() to launch()
  std::vector<Tensor> buckets_;  // with buckets: the partition's gradients, filled by the hooks
  const bool defer_zero_;        // the CPU (Note [Deferred gradient zero])
  // Per partition, the ranges [offset, offset + count) of its elements in no parameter's segment, from its
  // begin: zeroed at each step's start (or a bucket's allocation) where nothing fills the buffer.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> padding_;
  std::vector<char> arrived_;  // with buckets: parameter i's gradient is in its bucket this micro-step
  std::deque<InFlight> in_flight_;
  std::vector<int> hooks_;  // per parameter
};

}  // namespace cz::zero
