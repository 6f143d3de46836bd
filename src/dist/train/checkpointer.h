// The run's checkpoint saves (docs/checkpoints.md): one save in flight at a time, this rank's shard written
// on a background thread; the newest published checkpoint (`latest`); the few collectives the saves take; and
// the stop record beside them. What a checkpoint holds is the Trainer's (Trainer::checkpoint_request).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dist/comm/process_group.h"
#include "io/checkpoint/checkpoint.h"

namespace cz::train {

class Checkpointer {
 public:
  // `dir`: --checkpoint-dir ("" for none); `group`: the training ranks, whose communicator carries the saves'
  // collectives (its timeouts apply); `announce`: this rank prints a line for each published save (rank 0
  // with --progress).
  Checkpointer(std::string dir, dist::ProcessGroup group, bool announce);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: starts writing `req` in the background. The previous save must be finished (finish()).
  void begin(ckpt::SaveRequest req);
  // Collective: waits for the save in flight and publishes it (DIR/latest); nothing when none is in flight.
  void finish();
  // Whether a save is in flight whose part on this rank is not yet written.
  bool unwritten() const;
  // Collective: writes `req` now and returns its folder (the best checkpoints, Note [Best checkpoints]).
  std::string save_now(ckpt::SaveRequest req);
  // A resumed run: the checkpoint at `path`, of `step`, is the newest saved and published.
  void resumed_from(const std::string& path, int64_t step);

  int64_t saved_step() const { return saved_step_; }  // the step of the newest save begun (or resumed from)
  const std::string& latest() const { return latest_; }  // the newest published (or resumed from); "" if none
  // Note [The stop record] (stop.cpp): DIR/stopped, naming latest(), after a stop by `sig` after `last_step`.
  void write_stop_record(int sig, int64_t last_step) const;

 private:
  std::string dir_;
  std::unique_ptr<ckpt::Collective> comm_;
  bool announce_ = false;
  std::unique_ptr<ckpt::PendingSave> pending_;
  int64_t saved_step_ = -1;
  std::string latest_;
};

}  // namespace cz::train
