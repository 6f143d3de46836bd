// --trace FILE --trace-steps A:B: a timeline of steps A..B as Chrome Trace Event JSON, which Perfetto
// (https://ui.perfetto.dev) and chrome://tracing open. Each rank records into memory (tensor/trace.h), writes
// its part when step B ends, and rank 0 merges the parts into FILE: one process (pid) per rank, one thread
// (tid) per lane (Note [Trace lanes]), spans as "X" events in microseconds. A run that fails inside A:B
// leaves each surviving rank's events as a whole trace of their own (Note [Trace after a failure]).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/comm/process_group.h"
#include "nn/module.h"

namespace cz::train {

struct TraceSteps {
  int64_t first = 0, last = 0;  // 1-based, inclusive
};
// "A:B" with 1 <= A <= B; a clear error naming `flag` otherwise.
TraceSteps parse_trace_steps(const std::string& value, const std::string& flag);

class StepTracer {
 public:
  // Collective over `control` (every rank constructs it, on the training thread): checks that every rank
  // can write its part next to `file` (an error naming --trace and the rank otherwise) and aligns the ranks'
  // clocks (Note [Trace clocks]).
  StepTracer(std::string file, TraceSteps steps, const dist::ProcessGroup& control, int rank, int world,
             Device device);
  ~StepTracer();
  StepTracer(const StepTracer&) = delete;
  StepTracer& operator=(const StepTracer&) = delete;
  // Names the block of the ops that run inside each of `units` (the model's units, Note [ConvNeXt
  // structure]), forward and backward, through the modules' hooks (Note [Trace blocks]); `numbered`: say
  // "unit u" too (stage 3, where the units are the engine's).
  void watch_blocks(nn::Module& model, const std::vector<std::string>& units, bool numbered);
  // The device's allocated bytes as a counter sample (while tracing).
  void memory_sample(int64_t allocated_bytes) const;
  // Before step `step` runs: recording starts at steps.first.
  void before_step(int64_t step);
  // After step `step` has finished: at steps.last recording stops and the file is written (collective).
  void after_step(int64_t step);
  // At the end of the run: writes the file if the run ended inside A:B (collective). Idempotent.
  void finish();

 private:
  void write();
  void write_alone();  // Note [Trace after a failure]
  nlohmann::json take_events() const;
  std::string part_path(int rank) const;

  std::string file_;
  TraceSteps steps_;
  const dist::ProcessGroup& control_;
  int rank_, world_;
  Device device_;
  bool written_ = false;
  bool started_ = false;
  std::vector<std::pair<nn::Module*, int>> hooks_;
};

}  // namespace cz::train
