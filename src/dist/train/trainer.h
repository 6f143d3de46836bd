// The training loop behind `convnext_zero`. The Trainer holds its parts (the data feed, data_feed.h; the
// checkpointer, checkpointer.h; the stop agreement, stop.h) and the ZeRO engine (dist/zero), which owns the
// parameters, gradients, optimizer state and their collectives. Its methods: trainer_setup.cpp (building it),
// trainer.cpp (the step, the run), trainer_checkpoints.cpp, trainer_ranks.cpp and trainer_log.cpp.
#pragma once

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <span>

#include "dist/comm/bootstrap.h"
#include "dist/comm/communicator.h"
#include "dist/comm/mesh.h"
#include "dist/comm/process_group.h"
#include "dist/train/checkpointer.h"
#include "dist/train/config.h"
#include "dist/train/data_feed.h"
#include "dist/train/gpu_health.h"
#include "dist/train/graph_plan.h"
#include "dist/train/rank_stats.h"
#include "dist/train/step_graphs.h"
#include "dist/train/step_tracer.h"
#include "dist/train/stop.h"
#include "dist/zero/engine.h"
#include "io/checkpoint/checkpoint.h"
#include "io/log/tensorboard.h"
#include "io/log/train_log.h"
#include "nn/convnext.h"
#include "optim/loss_scaler.h"
#include "optim/schedule.h"

namespace cz::train {

// One step's statistics: the engine fills in its figures, the trainer the rest (zero/step_stats.h).
using StepStats = zero::StepStats;

struct EvalResult {
  double loss = 0;  // mean cross-entropy (no label smoothing)
  double top1 = 0;  // fraction correct
  // Fraction with the label among the 5 largest logits; NaN (null in the log) when the model has fewer than
  // 5 classes, where every label would be among them.
  double top5 = 0;
  int64_t examples = 0;
};

// The best evaluation of the run so far, of the weights or of the EMA (--keep-best).
struct BestEval {
  double top1 = -1;  // below any real top-1: the first evaluation is the best so far
  int64_t step = 0;
  std::string checkpoint;  // where --keep-best keeps it; "" without
};

struct TrainSummary {
  int64_t steps = 0;
  double seconds = 0;
  double img_per_s = 0;
  double final_loss = 0;
  std::optional<EvalResult> eval, eval_ema;
  BestEval best, best_ema;  // step 0: no evaluation
  int64_t peak_mem_bytes = 0;
  int64_t model_state_bytes = 0;
  double comm_s = 0, comm_exposed_s = 0;  // summed over the steps
  // Note [Data wait] (io/log/train_log.h): this rank's wait for data summed over the steps, and its fraction
  // of the step time of the steps after the first (NaN with fewer than two steps).
  double data_wait_s = 0;
  double data_wait_fraction = NAN;
  int stop_signal = 0;     // non-zero: stopped on request by this signal (Note [Stopping on request])
  int64_t last_step = 0;   // optimizer steps done when the run ended
  std::string checkpoint;  // the newest checkpoint of this run on disk (saved or resumed from); "" if none
  // --skip-bad-samples (-1 without it): the training samples this run left out at open (the same on every
  // rank, counted once) and those each rank's loader replaced because they failed to decode; `skipped` is the
  // first plus the sum of the second.
  int64_t skipped = -1, skipped_at_open = 0;
  std::vector<int64_t> skipped_on_ranks;

  void add(const StepStats& s);  // a step's loss, peak memory, model state and communication
};

class Trainer {
 public:
  Trainer(TrainConfig cfg, dist::World& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The whole run: total_steps() steps, evaluations, logs, export. Returns the summary (every rank).
  TrainSummary run();

  StepStats step();  // one optimizer step on the next micro-batches of the training set
  // The same on given micro-batches (this rank's share each, --grad-accum of them): bench_train_step times
  // the app's step on fixed device tensors this way.
  StepStats step(std::span<const Batch> micro_batches);
  EvalResult evaluate();  // over the eval set (or --eval-batches of it), every rank together
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_done() const { return step_; }
  // Micro-batches per rank in an epoch of the training set (its loader's).
  int64_t batches_per_epoch() const { return feed_->batches_per_epoch(); }

  nn::Model& model() { return *model_; }
  zero::ZeroEngine& engine() { return *engine_; }
  const TrainConfig& config() const { return cfg_; }
  const Device& device() const { return device_; }
  int world_size() const { return world_.size(); }
  const dist::Mesh& mesh() const { return mesh_; }
  // What moves the collectives and why (Note [Choosing the comm backend]): "nccl (auto: ...)"; "" at one rank
  // with --comm-backend auto (no communicator).
  const std::string& comm_backend_note() const { return comm_note_; }
  // Lines for the start of the run: what the training and eval sets hold (a folder's images, classes and
  // skipped files) and warnings about them ("warning: ...").
  const std::vector<std::string>& data_notes() const { return feed_->data_notes(); }
  // Whether --num-classes came from the training data (not given): config().num_classes is its count.
  bool classes_from_data() const { return feed_->classes_from_data(); }
  // "CPU threads per rank ...": what OpenMP and the loader got (Note [CPU threads on a CUDA rank]).
  const std::string& cpu_threads_note() const { return feed_->cpu_threads_note(); }
  // "local rank 0: mask 0-111 -> 0-6,56-62 (...)": each rank of this host, its mask and its share of the
  // host's CPUs (Note [A rank's CPUs on a node]).
  const std::string& node_cpus_note() const { return feed_->node_cpus_note(); }
  // --cpu-gemm: which library runs which GEMM shape, and what choosing cost ("" on a CUDA run); warnings
  // about the cache file ("warning: ..."), rank 0's.
  const std::string& cpu_gemm_note() const { return cpu_gemm_note_; }
  const std::vector<std::string>& cpu_gemm_warnings() const { return cpu_gemm_warnings_; }
  // --precision bf16 on the CPU: what it means and what runs it (the ISA, oneDNN's kernel); "" otherwise.
  const std::string& precision_note() const { return precision_note_; }
  // The training set's class names as checkpoints and weight files record them; empty for numbered classes.
  std::vector<std::string> class_names() const { return feed_->class_names(); }
  // What --init-weights loaded ("--init-weights w.h5: 180 tensors (27.82M values) with timm keys; ..."); ""
  // without.
  const std::string& init_weights_note() const { return init_weights_note_; }
  // --cuda-graphs: what the run captures and replays, or why it does not (Note [CUDA graphs for the step]).
  const GraphPlan& cuda_graph_plan() const { return graph_plan_; }
  // Micro-steps replayed from a CUDA graph so far, and those run eagerly beside them (another shape).
  int64_t graph_replays() const { return graphs_ ? graphs_->replays() : 0; }
  int64_t graph_uncaptured() const { return graphs_ ? graphs_->uncaptured() : 0; }
  int64_t graph_update_replays() const { return graphs_ ? graphs_->update_replays() : 0; }
  // Collective: starts writing a checkpoint of the current state into --checkpoint-dir (this rank's shard is
  // copied to host memory and written on a background thread); the previous save is finished first.
  void save_checkpoint();
  // Collective: waits for the save in flight and makes it visible (docs/checkpoints.md).
  void finish_pending_save();
  // Collective, at a step boundary: whether the run is to stop on request, and the save in flight published
  // if every rank has written its file (Note [Stopping on request]). Returns the stop signal, 0 to go on.
  int step_boundary();
  // --end-margin: the job's end time (Unix seconds), on rank 0; the step boundary stops the run once the
  // next step would end within the margin of it (Note [Stopping before the job's end]).
  void set_job_end_time(std::optional<int64_t> end_time) { boundary_.set_job_end_time(end_time); }
  // Continues from a checkpoint (Note [Resuming]); the constructor calls it for --resume.
  void resume(const std::string& path);

  // The full fp32 master weights under the model's parameter names (what --export-weights writes).
  // Collective at stages 1-3: every rank must call it.
  nn::NamedParameters master_parameters();

 private:
  // Setup, in the constructor's order.
  void choose_device();
  std::string connect();  // returns the world communicator's kind: "nccl", "mpi", "" without one
  std::string connect_ranks(bool comm_of_one);
  void build_model();
  void choose_cpu_gemms();
  void build_schedule();
  void check_ranks_agree();
  dist::Backend choose_backend();  // collective over control_
  void check_comm_impl(dist::Backend backend) const;
  zero::StepPlan make_plan(const dist::HostMap& hosts) const;
  void check_outputs() const;
  // After an evaluation at step_: whether `r` beats `best`; with --keep-best, a checkpoint of now is kept in
  // DIR/<folder> (Note [Best checkpoints]).
  void track_best(BestEval& best, const EvalResult& r, const char* folder);
  ckpt::SaveRequest checkpoint_request();  // this rank's state and the run's scalars, for DIR/step_<step_>
  // resume()'s parts: `resuming` names the checkpoint in errors.
  void check_resume_identity(const ckpt::Checkpoint& ck, const std::string& resuming) const;
  void resume_best(const ckpt::Checkpoint& ck);
  void open_log();  // rank 0: --log, continued after a resumed step (Note [One log across resumes])
  void write_record(nlohmann::json record);  // to --log, and its scalars to --tensorboard (trainer_log.cpp)
  void report_comms(int64_t steps);          // --comms-table, at the end of run() (trainer_log.cpp)
  // --skip-bad-samples, at the end of run(): every rank's skipped samples into `sum` and the log. Collective
  // over control_.
  void count_skipped_samples(TrainSummary& sum);
  ProgressMode progress_mode() const;
  using Clock = std::chrono::steady_clock;
  StepStats run_step(std::span<const Batch> micro_batches, Clock::time_point t0);
  Tensor forward_backward(std::span<const Batch> micro_batches, int64_t step);
  // The step's communication, named where the loop causes it (Note [Where a step communicates]).
  void backward_and_reduce(const Tensor& loss, bool last_micro_step);
  double mean_loss(const Tensor& loss_sum);
  void gather_rank_stats(int64_t step);  // Note [Every rank's step]
  void update_and_gather(StepStats& s);
  // run()'s figures over the steps this process ran (Note [Data wait]: the wait and time after the first).
  struct RunTotals {
    int64_t steps = 0, images = 0;
    double time_in_steps = 0, wait_after_first = 0, time_after_first = 0;
  };
  void account_step(const StepStats& s, RunTotals& t, TrainSummary& sum);
  void evaluate_and_log(int64_t at_step, TrainSummary& sum);
  void save_final_checkpoint(int stop_signal);
  void export_final_weights();

  TrainConfig cfg_;
  dist::World& world_;
  Device device_;
  DType compute_dtype_ = DType::f32;
  dist::Mesh mesh_;           // the communicators, owned here; used through their groups
  dist::ProcessGroup group_;  // the world: the engine, the checkpoints' and the step's exchanges
  // Note [Control communicator]: the flags' agreement and the step boundary's exchange, on their own.
  std::unique_ptr<dist::Communicator> control_comm_;
  std::string comm_note_;
  zero::StepPlan plan_;  // Note [Step plan], Note [Two-hop choice] in zero/step_plan.h
  std::string init_weights_note_;
  dist::ProcessGroup control_;

  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<zero::ZeroEngine> engine_;

  std::unique_ptr<DataFeed> feed_;
  std::string cpu_gemm_note_;
  std::vector<std::string> cpu_gemm_warnings_;
  std::string precision_note_;
  std::unique_ptr<StepTracer> tracer_;  // --trace
  std::unique_ptr<Checkpointer> checkpointer_;

  GraphPlan graph_plan_;
  // Declared after the engine and the model: destroyed first, while the buffers its graphs use still exist.
  std::unique_ptr<StepGraphs> graphs_;

  std::unique_ptr<LrSchedule> schedule_;
  LossScaler scaler_ = LossScaler::disabled();
  Tensor loss_scale_;  // fp16: the loss scale on the device, () f32, written at each step's start

  BestEval best_, best_ema_;
  int64_t total_steps_ = 0;
  int64_t step_ = 0;
  StepBoundary boundary_;  // the ranks' stop agreement (stop.h)
  // Note [Every rank's step]: this rank's sums between gathers, and the step's input copy and loss wait.
  RankStats rank_stats_{0};
  double input_s_ = 0, loss_wait_s_ = 0;
  JsonLog log_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // rank 0, --tensorboard
  std::unique_ptr<GpuHealth> gpu_health_;           // CUDA ranks: Note [GPU health fields]
};

}  // namespace cz::train
