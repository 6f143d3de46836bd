// `--data` specs: which source a string names, and the choice of the evaluation set.
#include "io/data/dataset.h"

#include "io/data/dataset_sources.h"
#include "tensor/check.h"

namespace cz {
namespace {

struct Spec {
  std::string kind, arg;
};

// `flag` is the option the spec came from, for messages.
Spec parse_spec(const std::string& spec, const char* flag) {
  const size_t colon = spec.find(':');
  Spec s{spec.substr(0, colon), colon == std::string::npos ? "" : spec.substr(colon + 1)};
  CZ_CHECK(
      s.kind == "synthetic" || s.kind == "h5" || s.kind == "cifar10" || s.kind == "folder" || s.kind == "wds",
      "{} '{}': unknown kind '{}' (expected synthetic[:k=v,...], h5:FILE, cifar10:DIR, folder:DIR or "
      "wds:PATTERN)",
      flag, spec, s.kind);
  CZ_CHECK(s.kind == "synthetic" || !s.arg.empty(), "{} '{}': {} needs a path: {}:PATH", flag, spec, s.kind,
           s.kind);
  return s;
}

std::shared_ptr<const Dataset> open_from(const std::string& spec, Split split, const DatasetOptions& options,
                                         const char* flag) {
  const Spec s = parse_spec(spec, flag);
  if (s.kind == "synthetic") return open_synthetic(fmt::format("{} '{}'", flag, spec), s.arg, split, options);
  if (s.kind == "h5") return open_h5(s.arg);
  if (s.kind == "cifar10") return open_cifar10(s.arg, split);
  if (s.kind == "wds") return open_wds(s.arg, options);
  return open_folder(s.arg);
}

}  // namespace

const char* split_name(Split split) {
  return split == Split::train ? "train" : "eval";
}

void LeftOut::add(const std::string& reason, const std::string& where) {
  Group& g = groups_[reason];
  if (g.examples.size() < 3) g.examples.push_back(where);
  ++g.count;
  ++total_;
  if (first_.empty()) first_ = where + ": " + reason;
}

std::string LeftOut::describe(const std::string& noun) const {
  std::vector<std::string> parts;
  for (const auto& [reason, g] : groups_)
    parts.push_back(fmt::format("{} {} ({}{})", g.count, reason, fmt::join(g.examples, ", "),
                                g.count > int64_t(g.examples.size()) ? ", ..." : ""));
  return fmt::format("skipped {}{}: {}", total_, noun, fmt::join(parts, "; "));
}

std::shared_ptr<const Dataset> open_dataset(const std::string& spec, Split split,
                                            const DatasetOptions& options) {
  return open_from(spec, split, options, "--data");
}

bool has_eval_split(const std::string& spec) {
  const std::string kind = parse_spec(spec, "--data").kind;
  return kind == "synthetic" || kind == "cifar10";
}

std::shared_ptr<const Dataset> open_eval_dataset(const std::string& train_spec, const std::string& eval_spec,
                                                 const DatasetOptions& options, const Dataset* train) {
  CZ_CHECK(!eval_spec.empty() || has_eval_split(train_spec),
           "--data '{}' has no eval split of its own; give --eval-data", train_spec);
  const std::string& spec = eval_spec.empty() ? train_spec : eval_spec;
  const char* flag = eval_spec.empty() ? "--data" : "--eval-data";
  auto eval = open_from(spec, Split::eval, options, flag);
  if (train == nullptr) return eval;
  // Note [Class names]: by name where both sides have names, else by number.
  if (!train->class_names().empty() && !eval->class_names().empty())
    return relabel_by_name(std::move(eval), *train, fmt::format("{} '{}'", flag, spec),
                           fmt::format("--data '{}'", train_spec));
  CZ_CHECK(eval->num_classes() <= train->num_classes(), "{} '{}' has {} classes but --data '{}' only {}",
           flag, spec, eval->num_classes(), train_spec, train->num_classes());
  return eval;
}

}  // namespace cz
