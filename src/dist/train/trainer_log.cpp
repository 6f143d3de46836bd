// The run's --log: opened on rank 0 after a resume (Note [One log across resumes] in io/log/train_log.h), and
// the record each start writes first, saying what ran where: every flag's value, the world, the device, the
// build and the time. A resumed run writes one too, naming the checkpoint, so the log shows each start.
#include <ctime>

#include <fmt/format.h>

#include "dist/comm/comms_table.h"
#include "dist/train/build_info.h"
#include "dist/train/flags.h"
#include "dist/train/trainer.h"

namespace cz::train {
namespace {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

void Trainer::open_log() {
  gpu_health_ = start_gpu_health(device_.is_cuda(), device_.index, world_.rank());  // every rank's own GPU
  if (world_.rank() == 0 && !cfg_.tensorboard.empty())
    tensorboard_ =
        std::make_unique<TensorBoardWriter>(cfg_.tensorboard, flag_name(&TrainConfig::tensorboard));
  if (world_.rank() != 0 || cfg_.log.empty()) return;
  log_ = cfg_.resume.empty() ? JsonLog::start(cfg_.log) : JsonLog::resume(cfg_.log, step_);
  if (!log_.note().empty()) console_print(stderr, log_.note() + "\n");
  nlohmann::json r = {{"event", "start"},
                      {"time", utc_now()},
                      {"version", build_version()},
                      {"world_size", world_.size()},
                      {"hosts", mesh_.hosts().num_hosts()},
                      {"device", device_.str()},
                      {"total_steps", total_steps_},
                      {"flags", flags_json(cfg_)}};
  if (!cfg_.resume.empty()) {
    r["resumed_from"] = checkpointer_->latest();
    r["resumed_step"] = step_;
  }
  log_.write(std::move(r));
}

void Trainer::write_record(nlohmann::json record) {
  note_gpu_health(gpu_health_.get(), record);  // Note [GPU health fields]
  if (tensorboard_) {
    const auto scalars = log_record_scalars(record);
    tensorboard_->write(record.value("step", int64_t(0)), scalars, unix_seconds());
  }
  log_.write(std::move(record));
}

// Rank 0's own figures, not a mean over ranks: they add up to its log's comm_s and comm_bytes (the stage 1-2
// all-gathers after the last update excepted: they are waited for after the last step, outside it).
void Trainer::report_comms(int64_t steps) {
  if (world_.rank() != 0) return;
  const std::vector<dist::CommsRow> rows = engine_->comms_table().rows();
  if (rows.empty()) {
    console_print(stdout, "# comms: no collective ran in the steps (one rank)\n");
  } else {
    const std::string title = fmt::format("comms: rank 0's collectives in the {} steps of this run", steps);
    console_print(stdout, dist::format_comms_table(rows, title));
  }
  log_.write({{"event", "comms_table"}, {"steps", steps}, {"rows", dist::comms_table_json(rows)}});
}

}  // namespace cz::train
