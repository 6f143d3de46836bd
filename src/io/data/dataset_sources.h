// The data sources behind open_dataset(), one file each (dataset_<kind>.cpp). Their IoErrors name the file;
// `what` ("--data 'synthetic:n=8'") names the flag and spec in the synthetic source's option errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/data/dataset.h"

namespace cz {

// `options`: the text after "synthetic:" ("n=4096,classes=10"), possibly empty.
std::shared_ptr<const Dataset> open_synthetic(const std::string& spec, const std::string& options,
                                              Split split, const DatasetOptions& dataset_options);
// Sources without an eval split of their own (h5, folder) serve the whole source for either split.
std::shared_ptr<const Dataset> open_h5(const std::string& path);
std::shared_ptr<const Dataset> open_cifar10(const std::string& dir, Split split);
std::shared_ptr<const Dataset> open_folder(const std::string& dir);
// `pattern`: the text after "wds:" (dataset_wds.cpp, Note [Sharded tar data]).
std::shared_ptr<const Dataset> open_wds(const std::string& pattern, const DatasetOptions& options);

// A stored JPEG's or PNG's crop as Dataset::read_crop hands it out (folder: and wds: images); `name` is what
// errors name.
void decode_crop(const uint8_t* bytes, size_t size, const std::string& name,
                 const Dataset::CropChooser& choose, int64_t out_size, Image& out, CropBox& box);

const char* split_name(Split split);

// Why entries of a source were left out (folder: files, wds: samples): a count and a few named per reason.
class LeftOut {
 public:
  void add(const std::string& reason, const std::string& where);
  int64_t total() const { return total_; }
  const std::string& first() const { return first_; }  // "WHERE: REASON" of the first one
  // "skipped 3<noun>: 1 .bmp, not JPEG or PNG (a/b.bmp); 1 hidden (cat/._x.jpg); 1 ..."
  std::string describe(const std::string& noun = "") const;

 private:
  struct Group {
    int64_t count = 0;
    std::vector<std::string> examples;
  };
  std::map<std::string, Group> groups_;
  int64_t total_ = 0;
  std::string first_;
};

// `eval` with its labels taken from `train`'s class of the same name (Note [Class names]); `eval` itself when
// the names are the same. Both must name their classes. ValueError naming `eval_what` and the missing
// classes.
std::shared_ptr<const Dataset> relabel_by_name(std::shared_ptr<const Dataset> eval, const Dataset& train,
                                               const std::string& eval_what, const std::string& train_what);

}  // namespace cz
