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
#include "dist/zero/schedule.h"

namespace cz::zero {

struct ReducerMode {
  // Reduce-scatter, each rank keeping its chunk of every bucket (stages 1-3), or all-reduce (stage 0).
  bool scatter = false;
  // Stages 2-3: on every micro-step each gradient is copied into its bucket (allocated at the first) and
  // dropped, and a full bucket is reduced, handed on and freed. Stages 0-1: the gradients accumulate in the
  // full buffer `grads`, whose ranges are reduced in place on the last micro-step.
  bool buckets = false;
  DType reduce_dtype = DType::f32;
  Device device = Device::cpu();
  // > 0 (--reduce-dtype int8; with scatter, f32 buckets and a flat mesh): each reduce-scatter travels as INT8
  // records of blocks of this many values (Note [Quantized reduction] in quant_reduce.h).
  int64_t quant_block = 0;
};

// It carries out ReduceSchedule's events (Note [One schedule]) on real buffers and collectives.
class GradReducer : private ReduceSchedule::Sink {
 public:
  // `params`: the model's parameters in layout order (hooks are installed on them). `grads`: the full
  // gradient buffer their .grad views (undefined with buckets). `group`: where buckets are reduced;
  // `replicate` (a group of one when flat): where each reduced chunk is then all-reduced (Note [Cross
  // all-reduce]).
  GradReducer(const ZeroLayout& layout, std::vector<Tensor> params, Tensor grads, dist::ProcessGroup group,
              dist::ProcessGroup replicate, CommMeter& meter, ReducerMode mode);
  ~GradReducer() override;  // removes its hooks, waits for what is in flight; never throws
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Where a partition's reduced chunk (this rank's, averaged; valid during the call) goes, `final` on the
  // step's last micro-step. Without one it stays in the full buffer.
  using ChunkSink = std::function<void(size_t partition, const Tensor& chunk, bool final)>;
  void set_sink(ChunkSink sink) { sink_ = std::move(sink); }
  // Called once a partition's gradients have been handed to their collective (stage 3 releases the unit).
  void set_on_launch(std::function<void(size_t partition)> f) { on_launch_ = std::move(f); }
  // Quantized reduce-scatters in two hops (Note [Two-hop quantized reduction]) over these groups; `group`
  // must be the world in rank order (ValueError otherwise, at the first launch).
  void set_two_hop(dist::ProcessGroup host, dist::ProcessGroup cross, dist::HostMap hosts) {
    two_hop_ = true;
    host_ = std::move(host);
    cross_ = std::move(cross);
    hosts_ = std::move(hosts);
  }

  void begin_step();  // the full buffer back to zero
  void begin_backward(bool last_micro_step);
  // After backward: partitions some of whose parameters got no gradient are reduced now (every rank reaches
  // here with the same set: the graph has the same structure on every rank); then everything in flight ends.
  void flush();

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
  // ReduceSchedule::Sink
  void prepare(size_t p) override;
  void launch(size_t p) override;
  void finish(size_t p) override;
  int64_t own_offset(size_t p) const { return (mode_.scatter ? group_.rank() : 0) * layout_.chunk(p); }

  const ZeroLayout& layout_;
  std::vector<Tensor> params_;
  Tensor grads_;
  dist::ProcessGroup group_;
  dist::ProcessGroup replicate_;
  CommMeter& meter_;
  ReducerMode mode_;
  ChunkSink sink_;
  bool two_hop_ = false;
  dist::ProcessGroup host_, cross_;
  dist::HostMap hosts_;
  std::function<void(size_t)> on_launch_;

  ReduceSchedule schedule_;
  Tensor prepared_;              // the buffer of the partition being launched, from prepare() to launch()
  std::vector<Tensor> buckets_;  // with buckets: the partition's gradients, filled by the hooks
  std::deque<InFlight> in_flight_;
  std::vector<int> hooks_;  // per parameter
};

}  // namespace cz::zero
