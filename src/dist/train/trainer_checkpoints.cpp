// The trainer's checkpoints (docs/checkpoints.md): what a run saves beside the engine's sharded state, and
// resuming from it at any world size and stage.
//
// Note [Resuming]: a checkpoint holds the fp32 master weights, the optimizer state and the EMA as full
// tensors (each rank wrote the ranges it owns: ZeroEngine::owned_state), and the scalars that, with the
// run's flags, fix everything else: the step (the LR schedule and drop-path masks follow from it), the epoch
// and how many samples of it were consumed (sampling and augmentation are functions of seed, epoch and
// position: Note [Sampling]), the optimizer's step count and the loss scaler. There is no other random
// state to save. A resumed run reads its own ranges of each tensor (any world size, any stage), restarts the
// loader at the saved position, and continues bit for bit at the same configuration.
//
// Note [Best checkpoints]: with --keep-best, DIR/best holds one checkpoint (step_N and its own `latest`) of
// the run's state at the evaluation whose top-1 of the weights was the highest so far, and DIR/best_ema the
// same for the EMA's top-1, as the official ConvNeXt main.py keeps checkpoint-best and checkpoint-best-ema.
// Each is a whole checkpoint (master weights, optimizer state, EMA, the eval's figures in its scalars), so
// it resumes (--resume DIR/best) and exports (cz_weights DIR/best) like any other. A strictly higher top-1
// replaces it (a tie keeps the earlier one, as the official code's `<` does); the first evaluation always
// makes one. The save is synchronous, right after the evaluation and after publishing any save in flight:
// evaluations are rare, and a save in the background would have to share the single in-flight slot with the
// periodic ones. --keep-checkpoints' rotation and DIR/latest see only DIR's own step_N folders, so a best
// checkpoint stays however old it gets. Every checkpoint records the best top-1s so far, so a resumed run
// replaces a best checkpoint only with a better evaluation (than those and than the one DIR/best holds).
#include <chrono>
#include <cmath>
#include <filesystem>

#include "dist/train/trainer.h"

#include "dist/train/flags.h"
#include "dist/train/stop.h"
#include "io/checkpoint/checkpoint.h"
#include "io/log/output_paths.h"
#include "tensor/ops.h"
#include "tensor/trace.h"

namespace cz::train {

ckpt::SaveRequest Trainer::checkpoint_request() {
  ckpt::SaveRequest req;
  req.dir = cfg_.checkpoint_dir;
  req.step = step_;
  req.stage = cfg_.stage;
  req.keep = cfg_.keep_checkpoints;
  const FlatLayout& layout = engine_->layout().flat;
  for (const FlatSegment& s : layout.segments) req.tensors.push_back({s.name, s.shape});
  for (auto& [kind, chunks] : engine_->owned_state(true)) {
    ckpt::StateGroup g{kind, {}};
    for (const auto& c : chunks)
      for (auto& slice : ckpt::slices_of_flat_range(layout, c.range.begin, c.range.end, c.values))
        g.slices.push_back(std::move(slice));
    req.groups.push_back(std::move(g));
  }
  auto& sc = req.scalars;
  sc.ints["epoch"] = feed_->epoch();  // the step, world size and stage the checkpoint records itself
  sc.ints["samples_in_epoch"] = feed_->samples_in_epoch();
  sc.ints["optimizer_steps"] = engine_->optimizer().step_count();
  sc.ints["loss_scale_clean_steps"] = scaler_.state().clean_steps;
  sc.floats["loss_scale"] = scaler_.state().scale;
  for (const auto& [flag, value] : resume_identity(cfg_)) sc.strings["flag" + flag] = value;
  sc.strings["config"] = config_json(cfg_, world_.size());
  if (const std::vector<std::string> names = class_names(); !names.empty())
    sc.strings["class_names"] = class_names_to_json(names);  // Note [Class names]
  sc.floats["best_top1"] = best_.top1;
  sc.ints["best_step"] = best_.step;
  sc.floats["best_ema_top1"] = best_ema_.top1;
  sc.ints["best_ema_step"] = best_ema_.step;
  return req;
}

void Trainer::save_checkpoint() {
  CZ_CHECK(!cfg_.checkpoint_dir.empty(), "save_checkpoint needs {}", flag_name(&TrainConfig::checkpoint_dir));
  checkpointer_->finish();  // one save in flight at a time
  trace::Span span("checkpoint save (begin)", "checkpoint", "checkpoint");
  checkpointer_->begin(checkpoint_request());
}

void Trainer::finish_pending_save() {
  checkpointer_->finish();
}

void Trainer::track_best(BestEval& best, const EvalResult& r, const char* folder) {
  if (!(r.top1 > best.top1)) return;  // a NaN top-1 (no examples) is never the best
  best.top1 = r.top1;
  best.step = step_;
  if (!cfg_.keep_best) return;
  checkpointer_->finish();
  ckpt::SaveRequest req = checkpoint_request();
  req.dir = cfg_.checkpoint_dir + "/" + folder;
  req.keep = 1;
  req.scalars.strings["best_of"] = std::string(folder) == "best" ? "weights" : "ema";
  req.scalars.floats["eval_top1"] = r.top1;
  req.scalars.floats["eval_top5"] = r.top5;
  req.scalars.floats["eval_loss"] = r.loss;
  best.checkpoint = checkpointer_->save_now(std::move(req));
  if (world_.rank() != 0) return;
  // A resumed run that took another path may have left a best of a later step; only the new one stands.
  std::error_code ec;
  const std::string keep = std::filesystem::path(best.checkpoint).filename().string();
  for (const auto& e : std::filesystem::directory_iterator(cfg_.checkpoint_dir + "/" + folder, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name != keep) std::filesystem::remove_all(e.path(), ec);
  }
  if (world_.rank() == 0 && cfg_.progress)  // one line for the job, not onto the bar (Note [One console])
    console_print(stderr, fmt::format("best {} top1 {:.2f}% at step {}: {}\n",
                                      folder == std::string("best") ? "weights'" : "EMA's", 100 * r.top1,
                                      step_, best.checkpoint));
}

// Every path the run will write, on every rank that writes it, before any data is read or any step taken.
void Trainer::check_outputs() const {
  if (!cfg_.checkpoint_dir.empty())
    check_writable_dir(cfg_.checkpoint_dir, flag_name(&TrainConfig::checkpoint_dir));
  const std::string dump = cfg_.dump_batches.empty()
                               ? std::string()
                               : BatchDump::rank_path(cfg_.dump_batches, world_.size(), world_.rank());
  if (!dump.empty()) check_writable_file(dump, flag_name(&TrainConfig::dump_batches));
  if (world_.rank() != 0) return;
  if (!cfg_.export_weights.empty())
    check_writable_file(cfg_.export_weights, flag_name(&TrainConfig::export_weights));
  if (!cfg_.log.empty()) check_writable_file(cfg_.log, flag_name(&TrainConfig::log));
  if (!cfg_.tensorboard.empty()) check_writable_dir(cfg_.tensorboard, flag_name(&TrainConfig::tensorboard));
}

// The checkpoint was trained with this run's resume_identity flags and on its classes.
void Trainer::check_resume_identity(const ckpt::Checkpoint& ck, const std::string& resuming) const {
  const auto& sc = ck.scalars();
  const auto identity = resume_identity(cfg_), defaults = resume_identity(TrainConfig{});
  for (size_t i = 0; i < identity.size(); ++i) {
    const auto& [flag, value] = identity[i];
    const auto it = sc.strings.find("flag" + flag);
    // A flag the checkpoint does not record is younger than the checkpoint, which was trained with its
    // default.
    CZ_CHECK_IO(it != sc.strings.end() || value == defaults[i].second,
                "{}: the checkpoint does not record {} (it was saved before the flag existed, so with its "
                "default {}) but this run has {} {}",
                resuming, flag, defaults[i].second, flag, value);
    if (it == sc.strings.end()) continue;
    CZ_CHECK_IO(it->second == value, "{}: the checkpoint was saved with {} {} but this run has {} {}",
                resuming, flag, it->second, flag, value);
  }
  // The same --data spec may name a folder whose classes changed since (Note [Class names]).
  if (const auto it = sc.strings.find("class_names"); it != sc.strings.end())
    feed_->check_classes(
        class_names_from_json(it->second, ck.path() + ": scalar 'class_names'"), resuming,
        "resume with the classes it was trained on (a folder's labels are its classes' places in "
        "sorted order)");
}

// The best evaluations so far (Note [Best checkpoints]) as the checkpoint and DIR/best record them.
void Trainer::resume_best(const ckpt::Checkpoint& ck) {
  const auto& sc = ck.scalars();
  // Checkpoints from before --keep-best have no best figures: every evaluation from here is compared afresh.
  if (const auto b = sc.floats.find("best_top1"); b != sc.floats.end()) best_.top1 = b->second;
  if (const auto b = sc.floats.find("best_ema_top1"); b != sc.floats.end()) best_ema_.top1 = b->second;
  if (const auto b = sc.ints.find("best_step"); b != sc.ints.end()) best_.step = b->second;
  if (const auto b = sc.ints.find("best_ema_step"); b != sc.ints.end()) best_ema_.step = b->second;
  // The checkpoint was saved before its step's evaluation (the last one of a run among them), so a best kept
  // after it is not in its figures: what DIR/best holds counts too, or a later, worse evaluation would
  // replace it.
  if (cfg_.keep_best) {
    for (auto [best, folder] : {std::pair{&best_, "best"}, std::pair{&best_ema_, "best_ema"}}) {
      const std::string dir = cfg_.checkpoint_dir + "/" + folder;
      if (!std::filesystem::exists(dir + "/latest")) continue;
      const ckpt::Checkpoint kept = ckpt::Checkpoint::open(dir);
      const auto top1 = kept.scalars().floats.find("eval_top1");
      if (top1 == kept.scalars().floats.end() || !(top1->second > best->top1)) continue;
      *best = BestEval{top1->second, kept.step(), kept.path()};
    }
  }
}

void Trainer::resume(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  const ckpt::Checkpoint ck = ckpt::Checkpoint::open(path);
  const auto& sc = ck.scalars();
  const std::string resuming = fmt::format("{} {}", flag_name(&TrainConfig::resume), ck.path());
  check_resume_identity(ck, resuming);
  auto get = [&](const char* key) {
    const auto it = sc.ints.find(key);
    CZ_CHECK_IO(it != sc.ints.end(), "{}: the checkpoint has no '{}'", resuming, key);
    return it->second;
  };
  // Any global batch continues from the position (Note [Resuming at another global batch], loader.h).
  const int64_t samples = get("samples_in_epoch");
  CZ_CHECK_IO(samples >= 0 && samples <= feed_->train_set().size(),
              "{}: the checkpoint stopped {} samples into its epoch, but the training data has {}", resuming,
              samples, feed_->train_set().size());
  const FlatLayout& layout = engine_->layout().flat;
  for (auto& [kind, chunks] : engine_->owned_state(false)) {
    CZ_CHECK_IO(ck.has(kind, layout.segments.front().name),
                "{}: the checkpoint has no '{}' state (saved with another {} or without {}?)", resuming, kind,
                flag_name(&TrainConfig::optimizer), flag_name(&TrainConfig::ema_decay));
    for (const auto& c : chunks)
      ck.read_slices(kind, ckpt::slices_of_flat_range(layout, c.range.begin, c.range.end, c.values));
  }
  engine_->after_load(get("optimizer_steps"));
  step_ = ck.step();
  checkpointer_->resumed_from(ck.path(), step_);
  feed_->start_at(get("epoch"), samples);
  resume_best(ck);
  LossScaler::State ls;
  ls.scale = sc.floats.count("loss_scale") ? sc.floats.at("loss_scale") : 1.0;
  ls.clean_steps = get("loss_scale_clean_steps");
  if (scaler_.enabled()) scaler_.load_state(ls);
  CZ_CHECK(step_ <= total_steps_, "{}: the checkpoint is at step {}, past this run's {} steps", resuming,
           step_, total_steps_);
  if (world_.rank() == 0 && cfg_.progress)
    console_print(stderr,
                  fmt::format("resumed from {} at step {} (saved by {} rank(s) at stage {}) in {:.2f} s\n",
                              ck.path(), step_, ck.world_size(), ck.stage(),
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

}  // namespace cz::train
