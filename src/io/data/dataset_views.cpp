// Datasets made from other datasets: an eval set relabelled by class name into the training set's labels, and
// the two parts of a held-out split (Note [Held-out split], dataset.h).
//
// Note [Class names]: a folder's labels are the positions of its class folders in sorted order, so two
// folders agree on a label only when they hold the same classes: an eval folder with cat and rocket but not
// coffee would give rocket the label 1, coffee's in training, and score the model against the wrong labels
// without a word. Sources that name their classes (Dataset::class_names) are therefore matched by name:
// the eval set's label for a class is the training set's label of that name, and an eval class the training
// set lacks is an error naming it. The training set's names also go into checkpoints (scalar `class_names`)
// and exported weights (attribute `class_names`), so that a resumed run and a fine-tune (--init-weights
// without
// --reset-head) can refuse a training folder whose classes differ (dist/train/trainer_checkpoints.cpp,
// trainer.cpp).
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "io/data/dataset_sources.h"
#include "io/data/sampler.h"
#include "tensor/check.h"

namespace cz {
namespace {

// `inner` with label l read as map[l].
class RelabeledDataset final : public Dataset {
 public:
  RelabeledDataset(std::shared_ptr<const Dataset> inner, std::vector<int64_t> map,
                   std::vector<std::string> names)
      : inner_(std::move(inner)), map_(std::move(map)), names_(std::move(names)) {}
  int64_t size() const override { return inner_->size(); }
  int64_t num_classes() const override { return int64_t(names_.size()); }
  int64_t label(int64_t index) const override { return map_[size_t(inner_->label(index))]; }
  void read(int64_t index, Image& out) const override { inner_->read(index, out); }
  void read_crop(int64_t index, const CropChooser& choose, int64_t out_size, Image& out,
                 CropBox& box) const override {
    inner_->read_crop(index, choose, out_size, out, box);
  }
  std::string describe() const override {
    return fmt::format("{}; labelled by name as {} of the {} training classes", inner_->describe(),
                       inner_->num_classes(), names_.size());
  }
  std::vector<std::string> class_names() const override { return names_; }
  int64_t bad_samples() const override { return inner_->bad_samples(); }

 private:
  std::shared_ptr<const Dataset> inner_;
  std::vector<int64_t> map_;
  std::vector<std::string> names_;
};

// The examples `indices` (ascending) of `inner`, described as `description`.
class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> inner, std::vector<int64_t> indices, std::string description)
      : inner_(std::move(inner)), indices_(std::move(indices)), description_(std::move(description)) {}
  int64_t size() const override { return int64_t(indices_.size()); }
  int64_t num_classes() const override { return inner_->num_classes(); }
  int64_t label(int64_t index) const override { return inner_->label(at(index)); }
  void read(int64_t index, Image& out) const override { inner_->read(at(index), out); }
  void read_crop(int64_t index, const CropChooser& choose, int64_t out_size, Image& out,
                 CropBox& box) const override {
    inner_->read_crop(at(index), choose, out_size, out, box);
  }
  std::string describe() const override { return description_; }
  std::vector<std::string> class_names() const override { return inner_->class_names(); }
  int64_t bad_samples() const override { return inner_->bad_samples(); }

 private:
  int64_t at(int64_t index) const {
    CZ_CHECK(index >= 0 && index < size(), "{}: index {} out of range [0, {})", description_, index, size());
    return indices_[size_t(index)];
  }
  std::shared_ptr<const Dataset> inner_;
  std::vector<int64_t> indices_;
  std::string description_;
};

}  // namespace

std::string join_names(const std::vector<std::string>& names, size_t shown) {
  if (names.size() <= shown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)", fmt::join(names.begin(), names.begin() + ptrdiff_t(shown), ", "),
                     names.size());
}

std::shared_ptr<const Dataset> relabel_by_name(std::shared_ptr<const Dataset> eval, const Dataset& train,
                                               const std::string& eval_what, const std::string& train_what) {
  const std::vector<std::string> train_names = train.class_names(), eval_names = eval->class_names();
  std::map<std::string, int64_t> label_of;
  for (size_t i = 0; i < train_names.size(); ++i) label_of.emplace(train_names[i], int64_t(i));
  std::vector<int64_t> map;
  std::vector<std::string> missing;
  for (const std::string& name : eval_names) {
    const auto it = label_of.find(name);
    if (it == label_of.end()) missing.push_back("'" + name + "'");
    map.push_back(it == label_of.end() ? -1 : it->second);
  }
  CZ_CHECK(missing.empty(),
           "{}: {} {} {} not among the {} classes of {} ({}); an eval set may only hold classes "
           "the model is trained on",
           eval_what, missing.size() == 1 ? "class" : "classes", join_names(missing),
           missing.size() == 1 ? "is" : "are", train_names.size(), train_what, join_names(train_names));
  // Identical names: nothing to map.
  if (eval_names == train_names) return eval;
  return std::make_shared<RelabeledDataset>(std::move(eval), std::move(map), train_names);
}

std::vector<int64_t> held_out_indices(const Dataset& data, double fraction, uint64_t seed) {
  std::vector<std::vector<int64_t>> by_class(size_t(std::max<int64_t>(data.num_classes(), 0)));
  for (int64_t i = 0; i < data.size(); ++i) {
    const int64_t label = data.label(i);
    if (label >= int64_t(by_class.size())) by_class.resize(size_t(label) + 1);
    by_class[size_t(label)].push_back(i);
  }
  std::vector<int64_t> out;
  const uint64_t key = rng_key(seed, RngDomain::holdout);
  for (size_t c = 0; c < by_class.size(); ++c) {
    std::vector<int64_t>& members = by_class[c];
    const int64_t n = int64_t(members.size());
    const int64_t take = std::min<int64_t>(std::llround(fraction * double(n)), std::max<int64_t>(n - 1, 0));
    // A partial Fisher-Yates shuffle: its first `take` places are a uniform draw without replacement.
    CounterRng rng(key, uint64_t(c) << 40);
    for (int64_t i = 0; i < take; ++i) std::swap(members[size_t(i)], members[size_t(i + rng.below(n - i))]);
    out.insert(out.end(), members.begin(), members.begin() + take);
  }
  std::sort(out.begin(), out.end());
  return out;
}

HeldOutSplit hold_out(std::shared_ptr<const Dataset> data, double fraction, uint64_t seed,
                      const std::string& what) {
  CZ_CHECK(std::isfinite(fraction) && fraction >= 0 && fraction < 1, "{}: the fraction must be in [0, 1)",
           what);
  const std::vector<int64_t> eval = held_out_indices(*data, fraction, seed);
  CZ_CHECK(!eval.empty(),
           "{}: holds out no example of {}: the fraction is rounded per class, and each class keeps at least "
           "one example for training; give a larger fraction",
           what, data->describe());
  std::vector<int64_t> train;
  train.reserve(size_t(data->size()) - eval.size());
  size_t e = 0;
  for (int64_t i = 0; i < data->size(); ++i) {
    if (e < eval.size() && eval[e] == i)
      ++e;
    else
      train.push_back(i);
  }
  HeldOutSplit s;
  const std::string whole = data->describe();
  const std::string train_text = fmt::format("training part of {}: {} examples, the other {} held out by {}",
                                             whole, train.size(), eval.size(), what);
  const std::string eval_text = fmt::format("held-out part of {}: {} examples ({})",
                                            whole.substr(0, whole.find(" (")), eval.size(), what);
  s.train = std::make_shared<SubsetDataset>(data, std::move(train), train_text);
  s.eval = std::make_shared<SubsetDataset>(std::move(data), eval, eval_text);
  return s;
}

}  // namespace cz
