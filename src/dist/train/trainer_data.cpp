// The run's eval set (--eval-data, --eval-split or the source's own split), what the start line says about
// the data, and the checks that a checkpoint or a weight file was trained on the classes of this run's data
// (Note [Class names] in io/data/dataset_views.cpp).
#include <set>

#include "dist/train/flags.h"
#include "dist/train/trainer.h"
#include "io/checkpoint/weights.h"

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

// Note [Skipping bad samples] (io/data/loader.cpp): a rank's loader counts the distinct samples it replaced,
// and each rank's data set left the same ones out at open. One record of its own at the end of the run, not a
// field of every step's: the sum needs every rank's count, and the steps' one exchange is the loss's.
void Trainer::count_skipped_samples(TrainSummary& sum) {
  if (cfg_.skip_bad_samples == 0) return;
  const std::vector<double> all = control_.all_gather({double(loader_->skipped_samples())});
  sum.skipped_at_open = train_set_->bad_samples();
  sum.skipped = sum.skipped_at_open;
  sum.skipped_on_ranks.clear();
  for (double v : all) {
    sum.skipped_on_ranks.push_back(int64_t(v));
    sum.skipped += int64_t(v);
  }
  write_record({{"split", "data"},
                {"step", step_},
                {"skipped_samples", sum.skipped},
                {"skipped_at_open", sum.skipped_at_open},
                {"skipped_on_ranks", sum.skipped_on_ranks}});
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

void Trainer::open_eval_set(const DatasetOptions& options) {
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

// The names as a checkpoint or weight file would record them (class_names_to_json's round trip).
std::vector<std::string> Trainer::class_names() const {
  const std::vector<std::string> names = train_set_->class_names();
  return names.empty() ? names : class_names_from_json(class_names_to_json(names), "class names");
}

void Trainer::check_classes(const std::vector<std::string>& recorded, const std::string& what,
                            const std::string& remedy) const {
  const std::vector<std::string> now = class_names();
  if (recorded.empty() || now.empty()) return;  // one side has numbered classes only: nothing to compare
  const std::string diff = class_difference(recorded, now);
  CZ_CHECK(diff.empty(), "{} was trained on {} classes ({}) but {} has {} ({}): {}; {}", what,
           recorded.size(), join_names(recorded), flag_arg(cfg_, &TrainConfig::data), now.size(),
           join_names(now), diff, remedy);
}

}  // namespace cz::train
