// The data feed (data_feed.h): this rank's CPU threads, the training and eval sets with the checks that a
// checkpoint or a weight file was trained on this data's classes (Note [Class names] in
// io/data/dataset_views.cpp), and the training loader's batches, taken ahead on CUDA.
#include "dist/train/data_feed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "dist/train/flags.h"
#include "io/checkpoint/weights.h"
#include "io/data/model_input.h"
#include "io/log/train_log.h"
#include "tensor/omp_wait_policy.h"
#include "tensor/parallel.h"
#include "tensor/trace.h"

namespace cz::train {
namespace {

// "'dog' is new, 'coffee' is missing": how `now` differs from `before`; "" when they are the same list.
std::string class_difference(const std::vector<std::string>& before, const std::vector<std::string>& now) {
  if (before == now) return "";
  const std::set<std::string> a(before.begin(), before.end()), b(now.begin(), now.end());
  std::vector<std::string> added, missing;
  for (const std::string& n : now)
    if (!a.count(n)) added.push_back("'" + n + "'");
  for (const std::string& n : before)
    if (!b.count(n)) missing.push_back("'" + n + "'");
  std::vector<std::string> parts;
  if (!added.empty())
    parts.push_back(fmt::format("{} {}", join_names(added), added.size() == 1 ? "is new" : "are new"));
  if (!missing.empty())
    parts.push_back(
        fmt::format("{} {}", join_names(missing), missing.size() == 1 ? "is missing" : "are missing"));
  if (parts.empty()) parts.push_back("the same names in another order, so other labels");
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

bool take_data_classes(TrainConfig& c, const Dataset& data) {
  if (c.num_classes != kClassesOfTheData) return false;
  c.num_classes = data.num_classes();
  CZ_CHECK(c.num_classes > 0, "{} has no classes: give {}", flag_arg(c, &TrainConfig::data),
           flag_name(&TrainConfig::num_classes));
  return true;
}

DatasetOptions dataset_options(const TrainConfig& c) {
  DatasetOptions dopt;
  dopt.image_size = c.image_size;
  dopt.skip_bad_samples = c.skip_bad_samples;
  dopt.index_dir = c.data_index_dir;
  return dopt;
}

void resolve_num_classes(TrainConfig& c) {
  if (c.num_classes != kClassesOfTheData) return;
  const DatasetOptions dopt = dataset_options(c);
  std::shared_ptr<const Dataset> data;
  try {
    data = open_dataset(c.data, Split::train, dopt);
  } catch (const Error& e) {
    throw IoError(
        fmt::format("{} is not given, so it is the classes of {}, which cannot be read: {} (give {} N)",
                    flag_name(&TrainConfig::num_classes), flag_arg(c, &TrainConfig::data), e.what(),
                    flag_name(&TrainConfig::num_classes)));
  }
  take_data_classes(c, *data);
}

LoaderOptions run_loader_options(const TrainConfig& cfg, Split split, int world, int rank) {
  const bool train = split == Split::train;
  LoaderOptions lo;
  lo.batch_size = cfg.micro_batch * world;
  lo.image_size = cfg.image_size;
  lo.shuffle = train && cfg.shuffle;
  lo.augment = train && cfg.augment;
  lo.interpolation = parse_interpolation(cfg.interpolation);
  if (train) {
    lo.rand_augment = parse_rand_augment(cfg.aa);
    lo.erasing = {cfg.reprob, parse_erase_mode(cfg.remode), int(cfg.recount)};
  }
  lo.drop_last = train;
  lo.seed = cfg.seed;
  lo.world = world;
  lo.rank = rank;
  lo.threads = cfg.loader_threads;
  if (train) lo.mix = cfg.mix_config();  // Note [Mixing within a micro-batch]
  // Note [Normalising on the device]: the step makes the model's input from the 8-bit pixels (model_input).
  lo.pixels_only = true;
  lo.pinned = parse_device(cfg.device).is_cuda();
  lo.endless = train;  // Note [Running ahead]: no stall at an epoch's end; evaluation is one pass
  lo.skip_bad_samples = cfg.skip_bad_samples;
  return lo;
}

DataFeed::DataFeed(TrainConfig& cfg, const dist::World& world, const Device& device)
    : cfg_(cfg), world_(world), device_(device) {
  place_cpu_threads();
  const DatasetOptions dopt = dataset_options(cfg_);
  train_set_ = open_dataset(cfg_.data, Split::train, dopt);
  classes_from_data_ = take_data_classes(cfg_, *train_set_);
  const std::string data = flag_arg(cfg_, &TrainConfig::data);
  CZ_CHECK(train_set_->num_classes() <= cfg_.num_classes, "{} is smaller than the {} classes of {}",
           flag_arg(cfg_, &TrainConfig::num_classes), train_set_->num_classes(), data);
  open_eval_set(dopt);  // --eval-split takes its part out of train_set_

  const LoaderOptions lo = loader_options(Split::train);
  loader_ = std::make_unique<Loader>(train_set_, lo);
  CZ_CHECK(steps_per_epoch() > 0 || cfg_.epochs == 0,
           "{} has {} examples, fewer than one global batch of {} ({} x {} x ranks)", data,
           train_set_->size(), cfg_.global_batch(world_.size()), flag_name(&TrainConfig::micro_batch),
           flag_name(&TrainConfig::grad_accum));
  CZ_CHECK(loader_->steps_per_epoch() > 0,
           "{} has {} examples, fewer than one micro-batch of {} across {} rank(s)", data, train_set_->size(),
           lo.batch_size, world_.size());
  if (!cfg_.dump_batches.empty())
    dump_ = std::make_unique<BatchDump>(cfg_.dump_batches, world_.size(), world_.rank(), lo.mix,
                                        cfg_.num_classes, cfg_.image_size);
}

// --loader-threads' default and OpenMP's threads (Note [CPU threads on a CUDA rank]) from this rank's share
// of its node's CPUs (Note [A rank's CPUs on a node]): the share's cores on a CPU rank; on a CUDA rank its
// CPUs less the launching thread's, which stays on the share (near the GPU where the share allows, so that
// the pinned buffers it takes are too) while the loaders take the rest. Resolved before the log's start
// record, which shows the numbers used.
void DataFeed::place_cpu_threads() {
  CpuThreadsRequest req = cpu_threads_request(device_.is_cuda(), cfg_.offload_optimizer, cfg_.loader_threads,
                                              world_.local_size());
  req.share = world_.cpu_share();
  req.gathered = true;
  const CpuThreads threads = decide_cpu_threads(req);
  cfg_.loader_threads = threads.loader_threads;
  if (req.omp_threads_env == 0) {
    set_omp_threads_per_rank(threads.omp_threads);
    configure_cpu_threads(threads.omp_threads);
  }
  ThreadCpus cpus;
  if (device_.is_cuda()) {
    cpus = thread_cpus(req.share, world_.node_cpus().at(size_t(world_.local_rank())).near);
    if (!cpus.loaders.empty()) pin_current_thread(req.share.cpus);
  }
  loader_cpus_ = cpus.loaders;
  cpu_threads_note_ = describe_cpu_threads(req, threads, cpus);
  node_cpus_note_ = describe_node_shares(world_.node_cpus(), world_.node_shares());
}

void DataFeed::open_eval_set(const DatasetOptions& options) {
  const std::string data = flag_arg(cfg_, &TrainConfig::data);
  if (cfg_.eval_split > 0) {
    // Note [Held-out split]: the training set becomes the rest.
    HeldOutSplit s =
        hold_out(train_set_, cfg_.eval_split, cfg_.seed, flag_arg(cfg_, &TrainConfig::eval_split));
    train_set_ = std::move(s.train);
    eval_set_ = std::move(s.eval);
  } else if (!cfg_.eval_data.empty() || has_eval_split(cfg_.data)) {
    eval_set_ = open_eval_dataset(cfg_.data, cfg_.eval_data, options, train_set_.get());
  }
  CZ_CHECK(eval_set_ != nullptr || cfg_.eval_every == 0,
           "{} needs an eval set, and {} has no eval split of its own: give {} SPEC, or {} F to hold out a "
           "fraction F of it (docs/data.md)",
           flag_arg(cfg_, &TrainConfig::eval_every), data, flag_name(&TrainConfig::eval_data),
           flag_name(&TrainConfig::eval_split));
  data_notes_.push_back("data " + train_set_->describe());
  if (eval_set_) data_notes_.push_back("eval " + eval_set_->describe());
  const int64_t classes = train_set_->num_classes();
  if (classes < cfg_.num_classes)
    data_notes_.push_back(
        fmt::format("warning: {} but {} has {} classes: the classifier's outputs {}..{} are "
                    "never a label",
                    flag_arg(cfg_, &TrainConfig::num_classes), data, classes, classes, cfg_.num_classes - 1));
}

// Both splits read this rank's share of global batches of micro-batch x ranks; evaluation reads every example
// once, in file order, unaugmented.
LoaderOptions DataFeed::loader_options(Split split) const {
  LoaderOptions lo = run_loader_options(cfg_, split, world_.size(), world_.rank());
  lo.cpus = loader_cpus_;
  return lo;
}

Batch DataFeed::next() {
  std::optional<Batch> b = ahead_ ? std::exchange(ahead_, std::nullopt) : loader_->next();
  CZ_ASSERT(b.has_value(), "the training loader's stream ended after epoch {}", epoch_);
  // Note [Running ahead] (io/data/loader.h): the loader crosses epochs by itself; the batch says where it is.
  epoch_ = b->epoch;
  samples_in_epoch_ = b->next_position;
  return std::move(*b);
}

void DataFeed::arm_ahead() {
  take_ahead_ = true;
  ahead_wait_s_ = 0;
}

double DataFeed::disarm_ahead() {
  take_ahead_ = false;
  return ahead_wait_s_;
}

void DataFeed::take_ahead() {
  if (!take_ahead_ || ahead_ || !device_.is_cuda()) return;
  const auto t0 = std::chrono::steady_clock::now();
  ahead_ = loader_->next();
  const auto t1 = std::chrono::steady_clock::now();
  ahead_wait_s_ = std::chrono::duration<double>(t1 - t0).count();
  trace::complete("data wait (next step's batch)", "data", t0, t1, "data wait");
  if (ahead_) copy_ahead(*ahead_, device_);
}

void DataFeed::dump(std::span<const Batch> micro_batches, int64_t step) {
  for (size_t a = 0; dump_ && a < micro_batches.size(); ++a) dump_->write(micro_batches[a], step, int64_t(a));
}

void DataFeed::finish_dump() {
  if (dump_) dump_->finish();
}

void DataFeed::start_at(int64_t epoch, int64_t position) {
  epoch_ = epoch;
  samples_in_epoch_ = position;
  loader_->start_at(epoch, position);
}

// The names as a checkpoint or weight file would record them (class_names_to_json's round trip).
std::vector<std::string> DataFeed::class_names() const {
  const std::vector<std::string> names = train_set_->class_names();
  return names.empty() ? names : class_names_from_json(class_names_to_json(names), "class names");
}

void DataFeed::check_classes(const std::vector<std::string>& recorded, const std::string& what,
                             const std::string& remedy) const {
  const std::vector<std::string> now = class_names();
  if (recorded.empty() || now.empty()) return;  // one side has numbered classes only: nothing to compare
  const std::string diff = class_difference(recorded, now);
  CZ_CHECK(diff.empty(), "{} was trained on {} classes ({}) but {} has {} ({}): {}; {}", what,
           recorded.size(), join_names(recorded), flag_arg(cfg_, &TrainConfig::data), now.size(),
           join_names(now), diff, remedy);
}

// A rank whose loader holds its steps back says so once, with the CPUs it would need: its loader threads
// made a batch per step_time (the wait is the part the step could not use), and the step alone takes
// step_time - wait, so the threads that would keep up are threads x step_time / (step_time - wait), and one
// CPU more for the launching thread on a CUDA rank.
void DataFeed::warn_if_loader_bound(double wait_s, double time_s, int64_t step) const {
  if (time_s <= 0 || wait_s <= cz::kLoaderBoundFraction * time_s || cfg_.loader_threads <= 0) return;
  const double compute_s = std::max(time_s - wait_s, 1e-9);
  const int threads = int(std::ceil(double(cfg_.loader_threads) * time_s / compute_s));
  const CpuShare& share = world_.cpu_share();
  console_print(
      stderr,
      fmt::format("{}warning: the loader holds this rank back: data wait {:.0f}% of its steps {}-{} "
                  "with {} loader thread{} on {} CPU{} ({} on {}); keeping up would take about {} "
                  "loader threads{} (give the rank more CPUs: srun --cpus-per-task, mpirun --map-by "
                  "...:PE=N; docs/data.md has the cores per GPU the whole recipe needs)\n",
                  world_.size() > 1 ? fmt::format("[rank {}] ", world_.rank()) : "", 100 * wait_s / time_s,
                  step - kLoaderCheckSteps + 2, step, cfg_.loader_threads,
                  cfg_.loader_threads == 1 ? "" : "s", share.cpus.size(), share.cpus.size() == 1 ? "" : "s",
                  cpu_list(share.cpus), world_.hostname(), threads,
                  device_.is_cuda() ? fmt::format(", {} CPUs with the launching thread", threads + 1) : ""));
}

}  // namespace cz::train
