// The training run's data feed: where this rank's loader threads run, the training and eval sets, the
// training loader with the batch it takes ahead and its position (what a checkpoint records), and
// --dump-batches. The Trainer holds one and asks it for each step's micro-batches.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/comm/bootstrap.h"
#include "dist/comm/process_group.h"
#include "dist/train/config.h"
#include "io/data/batch_dump.h"
#include "io/data/dataset.h"
#include "io/data/loader.h"

namespace cz::train {

// The loader options of a run's training or eval set for `rank` of `world` (--loader-threads resolved); the
// trainer's and --loader-only's (loader_only.h).
LoaderOptions run_loader_options(const TrainConfig& cfg, Split split, int world, int rank);

// --num-classes left at kClassesOfTheData becomes `data`'s class count; true when it did. For the programs'
// paths that open no Trainer (--plan, --print-param-groups, --loader-only), resolve_num_classes opens
// --data for it (an error naming --num-classes as the way round when the data cannot be opened).
bool take_data_classes(TrainConfig& c, const Dataset& data);
// The data set options of a run's --data and --eval-data (--image-size, --skip-bad-samples,
// --data-index-dir).
DatasetOptions dataset_options(const TrainConfig& c);
void resolve_num_classes(TrainConfig& c);

class DataFeed {
 public:
  // Places this rank's CPU threads (OpenMP's and the loader's: cfg.loader_threads resolved), opens --data and
  // the eval set (cfg.num_classes resolved from the data when not given) and makes the training loader, whose
  // stream starts at epoch 0 at the first batch taken, or where start_at() says. Keeps `cfg`, `world` and
  // `device` by reference: they outlive the feed.
  DataFeed(TrainConfig& cfg, const dist::World& world, const Device& device);
  DataFeed(const DataFeed&) = delete;
  DataFeed& operator=(const DataFeed&) = delete;

  // The next micro-batch of this rank (the one taken ahead, if any); its epoch and position become the
  // feed's.
  Batch next();
  // CUDA, between arm_ahead() and disarm_ahead(): the next step's first batch taken from the loader and
  // copied to the device while this step's backward runs (Note [Copying the next batch ahead] in
  // io/data/model_input.h). Nothing elsewhere.
  void take_ahead();
  void arm_ahead();
  double disarm_ahead();  // the wait for the loader while taking a batch ahead (Note [Data wait])
  // --dump-batches: a step's micro-batches exactly as the model received them.
  void dump(std::span<const Batch> micro_batches, int64_t step);
  void finish_dump();

  // Continues the stream at `position` of `epoch`'s order (Note [Resuming at another global batch]).
  void start_at(int64_t epoch, int64_t position);
  // The position of the last batch a step used (Note [Running ahead] in io/data/loader.h: the loader's
  // workers are further on), which a checkpoint records.
  int64_t epoch() const { return epoch_; }
  int64_t samples_in_epoch() const { return samples_in_epoch_; }

  const Dataset& train_set() const { return *train_set_; }
  const std::shared_ptr<const Dataset>& eval_set() const { return eval_set_; }  // null without one
  LoaderOptions loader_options(Split split) const;  // this rank's, with the loader threads' CPUs
  int64_t batches_per_epoch() const { return loader_->steps_per_epoch(); }  // micro-batches per rank
  int64_t steps_per_epoch() const { return loader_->steps_per_epoch() / cfg_.grad_accum; }  // optimizer steps
  int64_t skipped_samples() const { return loader_->skipped_samples(); }

  // See Trainer::data_notes, classes_from_data, cpu_threads_note and node_cpus_note.
  const std::vector<std::string>& data_notes() const { return data_notes_; }
  bool classes_from_data() const { return classes_from_data_; }
  const std::string& cpu_threads_note() const { return cpu_threads_note_; }
  const std::string& node_cpus_note() const { return node_cpus_note_; }

  // The training set's class names as checkpoints and weight files record them; empty for numbered classes.
  std::vector<std::string> class_names() const;
  // ValueError when `recorded` (what `what` was trained on) and this run's class names differ, naming the
  // difference and `remedy`; nothing when either side has no names.
  void check_classes(const std::vector<std::string>& recorded, const std::string& what,
                     const std::string& remedy) const;

  // After kLoaderCheckSteps steps (the last `step`): a warning when the data wait passed
  // cz::kLoaderBoundFraction of the steps after the first (io/log/train_log.h).
  static constexpr int64_t kLoaderCheckSteps = 10;
  void warn_if_loader_bound(double wait_s, double time_s, int64_t step) const;

 private:
  void place_cpu_threads();
  void open_eval_set(const DatasetOptions& options);

  TrainConfig& cfg_;
  const dist::World& world_;
  const Device& device_;
  std::string cpu_threads_note_;
  std::string node_cpus_note_;
  std::vector<int> loader_cpus_;  // CUDA: the loader threads' CPUs (LoaderOptions::cpus)
  std::shared_ptr<const Dataset> train_set_, eval_set_;
  std::vector<std::string> data_notes_;
  bool classes_from_data_ = false;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<BatchDump> dump_;  // --dump-batches
  int64_t epoch_ = 0;
  // The position in this epoch's order after the loader's global batches consumed so far (what a checkpoint
  // records: Note [Resuming at another global batch], io/data/loader.h).
  int64_t samples_in_epoch_ = 0;
  std::optional<Batch> ahead_;  // taken ahead (CUDA), not yet used
  bool take_ahead_ = false;     // armed: take_ahead() takes the next batch
  double ahead_wait_s_ = 0;     // this step's wait for the loader while taking it
};

}  // namespace cz::train
