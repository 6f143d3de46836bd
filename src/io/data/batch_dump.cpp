// --dump-batches to HDF5 (the layout is in batch_dump.h); the picture is batch_dump_png.cpp's.
#include "io/data/batch_dump.h"

#include <fmt/format.h>

#include <cstdio>
#include <functional>

#include "io/data/model_input.h"
#include "io/h5/h5_file.h"

namespace cz {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Tensor i64_column(int64_t n, const std::function<int64_t(int64_t)>& f) {
  Tensor t = empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = f(i);
  return t;
}

}  // namespace

BatchDump::Format BatchDump::format_of(const std::string& path, const std::string& flag) {
  if (ends_with(path, ".h5") || ends_with(path, ".hdf5")) return Format::hdf5;
  CZ_CHECK(
      ends_with(path, ".png"),
      "{} {}: the file must end in .h5 or .hdf5 (every training batch, as HDF5) or .png (a picture of the "
      "first batch)",
      flag, path);
  return Format::png;
}

std::string BatchDump::rank_path(const std::string& path, int world, int rank) {
  const Format f = format_of(path, "--dump-batches");
  if (f == Format::png) return rank == 0 ? path : std::string();
  if (world == 1) return path;
  const size_t dot = path.rfind('.');
  return fmt::format("{}.rank{}{}", path.substr(0, dot), rank, path.substr(dot));
}

BatchDump::BatchDump(const std::string& path, int world, int rank, const MixConfig& mix, int64_t num_classes,
                     int64_t image_size)
    : format_(format_of(path, "--dump-batches")), path_(rank_path(path, world, rank)) {
  if (format_ != Format::hdf5 || path_.empty()) return;
  file_ = std::make_unique<h5::File>(h5::File::create(path_));
  file_->set_attr("rank", int64_t(rank));
  file_->set_attr("world", int64_t(world));
  file_->set_attr("image_size", image_size);
  file_->set_attr("num_classes", num_classes);
  file_->set_attr("mean", fmt::format("{},{},{}", kImageNetMean[0], kImageNetMean[1], kImageNetMean[2]));
  file_->set_attr("std", fmt::format("{},{},{}", kImageNetStd[0], kImageNetStd[1], kImageNetStd[2]));
  file_->set_attr("mixing", int64_t(mix.active()));
  file_->set_attr("mix_mode", std::string(mix_mode_name(mix.mode)));
  file_->set_attr("mixup", mix.mixup_alpha);
  file_->set_attr("cutmix", mix.cutmix_alpha);
  file_->set_attr("mixup_prob", mix.prob);
  file_->set_attr("mixup_switch_prob", mix.switch_prob);
  file_->set_attr("label_smoothing", mix.label_smoothing);
}

BatchDump::~BatchDump() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "--dump-batches: %s\n", e.what());
  }
}

void BatchDump::finish() {
  if (!file_) return;
  std::unique_ptr<h5::File> f = std::move(file_);
  f->commit();
}

void BatchDump::write(const Batch& b, int64_t step, int64_t micro_step) {
  if (!b.images.defined() && b.pixels.defined()) {  // what the model sees (Note [Normalising on the device])
    Batch with_images = b;
    with_images.images = model_input(b, Device::cpu());
    write(with_images, step, micro_step);
    return;
  }
  if (format_ == Format::png) {
    if (!png_written_ && !path_.empty()) write_png(b);
    png_written_ = true;
    return;
  }
  if (!file_) return;
  const int64_t n = b.images.size(0);
  file_->append("images", b.images.contiguous());
  file_->append("labels", b.labels.contiguous());
  file_->append("sources", i64_column(n, [&](int64_t i) { return b.sources[size_t(i)]; }));
  file_->append("positions", i64_column(n, [&](int64_t i) { return b.first_sample + i; }));
  file_->append("epochs", i64_column(n, [&](int64_t) { return b.epoch; }));
  file_->append("steps", i64_column(n, [&](int64_t) { return step; }));
  file_->append("micro_steps", i64_column(n, [&](int64_t) { return micro_step; }));
  if (!b.targets.defined()) return;
  const std::vector<int64_t>& src = b.sources;
  file_->append("targets", b.targets.contiguous());
  file_->append("mix_sources",
                i64_column(n, [&](int64_t i) { return src[size_t(b.mix.samples[size_t(i)].partner)]; }));
  Tensor lams = empty({n}, DType::f64), cut = empty({n}, DType::u8), boxes = empty({n, 4}, DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    const SampleMix& s = b.mix.samples[size_t(i)];
    lams.data<double>()[i] = s.lam;
    cut.data<uint8_t>()[i] = s.cutmix;
    const MixBox box = s.cutmix ? s.box : MixBox{};
    const int64_t v[4] = {box.y0, box.y1, box.x0, box.x1};
    for (int c = 0; c < 4; ++c) boxes.data<int64_t>()[i * 4 + c] = v[c];
  }
  file_->append("lams", lams);
  file_->append("cutmix", cut);
  file_->append("boxes", boxes);
}

void BatchDump::write_png(const Batch& b) {
  write_batch_png(path_, b.images, b.labels, b.targets);
}

}  // namespace cz
