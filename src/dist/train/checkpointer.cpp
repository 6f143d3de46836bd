// The run's checkpoint saves (checkpointer.h): the save in flight, `latest`, the saves' collectives over the
// training process group, and the stop record.
#include "dist/train/checkpointer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "dist/train/stop.h"
#include "io/log/train_log.h"
#include "tensor/trace.h"

namespace cz::train {
namespace {

// The save's few collectives, through the training process group (its communicator's timeouts apply).
class GroupCollective final : public ckpt::Collective {
 public:
  explicit GroupCollective(dist::ProcessGroup group) : group_(std::move(group)) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  int64_t all_reduce_max(int64_t value) override {
    double m = -INFINITY;
    for (double v : group_.all_gather({double(value)})) m = std::max(m, v);
    return int64_t(m);
  }
  std::string broadcast(const std::string& value, int root) override { return group_.broadcast(value, root); }

 private:
  dist::ProcessGroup group_;
};

}  // namespace

Checkpointer::Checkpointer(std::string dir, dist::ProcessGroup group, bool announce)
    : dir_(std::move(dir)), comm_(std::make_unique<GroupCollective>(std::move(group))), announce_(announce) {}

Checkpointer::~Checkpointer() = default;

void Checkpointer::begin(ckpt::SaveRequest req) {
  const int64_t step = req.step;
  pending_ = std::make_unique<ckpt::PendingSave>(ckpt::begin_save(std::move(req), *comm_));
  saved_step_ = step;
}

void Checkpointer::finish() {
  if (!pending_) return;
  std::unique_ptr<ckpt::PendingSave> p = std::move(pending_);
  trace::Span span("checkpoint save (finish)", "checkpoint", "checkpoint");
  const ckpt::SaveResult r = p->finish();
  latest_ = r.path;
  set_latest_checkpoint(r.path);
  if (announce_)  // Note [One console]: not onto the progress bar
    console_print(stderr, fmt::format("checkpoint {} ({:.1f} MB)\n", r.path, double(r.bytes) / 1e6));
}

bool Checkpointer::unwritten() const {
  return pending_ && !pending_->written();
}

std::string Checkpointer::save_now(ckpt::SaveRequest req) {
  return ckpt::save_checkpoint(std::move(req), *comm_).path;
}

void Checkpointer::resumed_from(const std::string& path, int64_t step) {
  saved_step_ = step;
  latest_ = path;
  set_latest_checkpoint(path);
}

void Checkpointer::write_stop_record(int sig, int64_t last_step) const {
  train::write_stop_record(dir_, latest_, sig, last_step);
}

}  // namespace cz::train
