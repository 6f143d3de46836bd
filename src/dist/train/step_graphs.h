// The trainer's CUDA graphs: a GraphPlan (graph_plan.h) carried out. Each kind of micro-step (the last of a
// step, the others) and the optimizer update is run eagerly on the device's graph stream for the warm-up
// steps, then captured once into a graph (the micro-steps with static input buffers), then replayed with one
// launch each.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace cz::train {

// What a micro-step does (StepGraphs::micro_step), by whether its kind's graph was captured, whether its
// input has the captured shapes, and how many steps ran before: a pure function, tested on the CPU.
enum class GraphAction {
  warmup,   // eagerly on the graph stream (before the capture)
  capture,  // captured, then replayed
  replay,   // the batch copied into the static buffers, the graph replayed
  eager,    // another shape than the captured one: eagerly on the caller's stream, as without graphs
};
GraphAction graph_action(bool captured, bool same_shape, int64_t steps_done, int warmup_steps);

class StepGraphs {
 public:
  // One micro-step: forward, loss and backward on (images, targets); returns the unscaled loss, detached.
  using MicroStep = std::function<Tensor(const Tensor& images, const Tensor& targets)>;

  StepGraphs(Device device, int warmup_steps);
  ~StepGraphs();  // waits for the device, then frees the graphs and the memory kept for them; never throws
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `body` for this micro-step, on the caller's current stream's data: eagerly on the graph stream in
  // the warm-up steps, then captured (the first time) and replayed. A micro-step whose images or targets have
  // other shapes or dtypes than the captured ones (an epoch's partial last batch) runs eagerly on the
  // caller's stream, as without graphs. `last`: the step's last micro-step (a graph of its own). The loss
  // returned is ordered on the caller's stream and valid until the next call with the same `last`.
  Tensor micro_step(bool last, const Tensor& images, const Tensor& targets, const MicroStep& body);
  // Runs the step's optimizer update (`body`: device work only, reading its per-step values from device
  // memory: Note [The optimizer's device scalars]) the same way: warm-up, capture, replay, ordered after the
  // caller's stream and back.
  void update(const std::function<void()>& body);
  void end_step();  // after each step's update: counts the warm-up

  int64_t replays() const { return replays_; }                // micro-steps replayed from a graph
  int64_t update_replays() const { return update_replays_; }  // updates replayed from a graph
  int64_t uncaptured() const { return uncaptured_; }          // micro-steps of another shape, run eagerly
  bool captured(bool last) const { return graphs_[last].exec != nullptr; }
  // The device allocator's peak at the end of the captures (since the step's reset_peak): the memory a
  // replay uses, which the allocator no longer counts as allocated once the capture has freed its blocks
  // into the graph stream's pool.
  int64_t capture_peak() const { return capture_peak_; }

 private:
  struct Graph {
    void* exec = nullptr;
    Tensor images, targets, loss;  // static buffers: the graph's input and output addresses
    std::vector<int64_t> key;      // shapes and dtypes of (images, targets)
  };
  static std::vector<int64_t> key_of(const Tensor& images, const Tensor& targets);
  void capture(Graph& g, const Tensor& images, const Tensor& targets, const MicroStep& body);
  // Captures `body` on the graph stream into g.exec (the stream already waits for the caller's work).
  void record(Graph& g, const std::function<void()>& body, const char* what);

  Device device_;
  int warmup_steps_;
  int64_t steps_ = 0;
  // The device's graph stream (one for the process): warm-ups, captures and replays only (Note [Allocations
  // during capture]).
  Stream stream_;
  Event ready_, done_;           // caller's stream -> graph stream before a micro-step, back after it
  std::array<Graph, 3> graphs_;  // [0] a micro-step, [1] the step's last micro-step, [2] the update
  int64_t replays_ = 0, uncaptured_ = 0, update_replays_ = 0;
  int64_t capture_peak_ = 0;
};

}  // namespace cz::train
