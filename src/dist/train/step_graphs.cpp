// The trainer's CUDA graphs (step_graphs.h; Note [CUDA graphs for the step] in graph_plan.h).
#include "dist/train/step_graphs.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <mutex>

#include "tensor/allocator.h"
#include "tensor/check.h"
#include "tensor/cuda/runtime.h"

namespace cz::train {
namespace {

constexpr int kMaxDevices = 16;
std::mutex graphs_mu;
std::array<void*, kMaxDevices> graph_streams{};  // guarded by graphs_mu
std::array<int, kMaxDevices> live_graphs{};      // StepGraphs per device; guarded by graphs_mu

// One graph stream per device for the process, never destroyed (as the copy stream: Note [Copying the next
// batch ahead]): its blocks, and the cuBLAS(Lt) and cuDNN workspaces the context keeps for it, serve every
// trainer in turn instead of piling up. Graphs of several trainers on it replay one after another, so their
// temporaries may share blocks as any graph's do.
Stream graph_stream(Device device) {
  CZ_CHECK_DEVICE(device.is_cuda() && device.index >= 0 && device.index < kMaxDevices,
                  "CUDA graphs on {}: they need a CUDA device", device.str());
  std::lock_guard<std::mutex> lock(graphs_mu);
  void*& s = graph_streams[size_t(device.index)];
  if (!s) s = cuda_runtime::stream_create(device.index);
  ++live_graphs[size_t(device.index)];
  return Stream{device, s};
}

}  // namespace

StepGraphs::StepGraphs(Device device, int warmup_steps)
    : device_(device),
      warmup_steps_(warmup_steps),
      stream_(graph_stream(device)),
      ready_(device),
      done_(device) {}

StepGraphs::~StepGraphs() {
  try {
    stream_.synchronize();
    for (Graph& g : graphs_) {
      cuda_runtime::graph_destroy(g.exec);
      g = Graph();
    }
    std::lock_guard<std::mutex> lock(graphs_mu);
    // The blocks kept for graphs are reusable once no graph of the device can run again.
    if (--live_graphs[size_t(device_.index)] == 0) cuda_runtime::graph_release_blocks(device_.index);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%sCUDA graphs: teardown failed: %s\n", log_prefix().c_str(), e.what());
  }
}

std::vector<int64_t> StepGraphs::key_of(const Tensor& images, const Tensor& targets) {
  std::vector<int64_t> k;
  for (const Tensor* t : {&images, &targets}) {
    k.push_back(int64_t(t->dtype()));
    k.push_back(int64_t(t->sizes().size()));
    for (int64_t s : t->sizes()) k.push_back(s);
  }
  return k;
}

GraphAction graph_action(bool captured, bool same_shape, int64_t steps_done, int warmup_steps) {
  if (captured) return same_shape ? GraphAction::replay : GraphAction::eager;
  return steps_done < warmup_steps ? GraphAction::warmup : GraphAction::capture;
}

Tensor StepGraphs::micro_step(bool last, const Tensor& images, const Tensor& targets, const MicroStep& body) {
  Graph& g = graphs_[last];
  const Stream caller = current_stream(device_);
  const GraphAction action =
      graph_action(g.exec != nullptr, g.exec && key_of(images, targets) == g.key, steps_, warmup_steps_);
  if (action == GraphAction::eager) {
    ++uncaptured_;
    return body(images, targets);
  }
  Tensor loss;
  const bool warmup = action == GraphAction::warmup;
  if (warmup) {
    // Warm-up on the graph stream: its pool, workspaces and algorithm choices are what the capture finds.
    // The caller frees `images` and `targets` only after done_ is queued on its stream, so their blocks are
    // not reused before this stream has read them.
    ready_.record(caller);
    ready_.wait(stream_);
    {
      StreamGuard on(stream_);
      loss = body(images, targets);
    }
  } else {
    if (action == GraphAction::capture) {
      capture(g, images, targets, body);
    } else {
      g.images.copy_(images);  // on the caller's stream, before ready_
      g.targets.copy_(targets);
      ready_.record(caller);
      ready_.wait(stream_);
    }
    cuda_runtime::graph_launch(g.exec, stream_);
    ++replays_;
  }
  done_.record(stream_);
  done_.wait(caller);
  if (warmup) return loss;
  // The next replay overwrites the graph's output: the caller gets a copy of it, on its stream.
  Tensor out = empty_like(g.loss);
  out.copy_(g.loss);
  return out;
}

void StepGraphs::capture(Graph& g, const Tensor& images, const Tensor& targets, const MicroStep& body) {
  g.images = empty(images.sizes(), images.dtype(), device_);
  g.targets = empty(targets.sizes(), targets.dtype(), device_);
  g.images.copy_(images);
  g.targets.copy_(targets);
  ready_.record(current_stream(device_));
  ready_.wait(stream_);
  record(
      g, [&] { g.loss = body(g.images, g.targets); }, "a micro-step");
  g.key = key_of(images, targets);
}

void StepGraphs::record(Graph& g, const std::function<void()>& body, const char* what) {
  StreamGuard on(stream_);
  cuda_runtime::graph_begin_capture(stream_);
  try {
    body();
  } catch (const std::exception& e) {
    try {
      cuda_runtime::graph_destroy(cuda_runtime::graph_end_capture(stream_));
    } catch (...) {  // the capture is already invalid: the first error is the one to report
    }
    throw DeviceError(
        fmt::format("CUDA graph capture of {} failed: {} (run with --cuda-graphs off)", what, e.what()));
  }
  try {
    g.exec = cuda_runtime::graph_end_capture(stream_);
  } catch (const std::exception& e) {
    throw DeviceError(fmt::format(
        "CUDA graph capture of {} failed: {} (something in it is not capturable: a host read or a "
        "synchronising call; run with --cuda-graphs off)",
        what, e.what()));
  }
  capture_peak_ = std::max(capture_peak_, allocator_for(device_).stats().peak_allocated_bytes);
}

void StepGraphs::update(const std::function<void()>& body) {
  Graph& g = graphs_[2];
  const Stream caller = current_stream(device_);
  const GraphAction action = graph_action(g.exec != nullptr, true, steps_, warmup_steps_);
  ready_.record(caller);
  ready_.wait(stream_);
  if (action == GraphAction::warmup) {
    StreamGuard on(stream_);
    body();
  } else {
    if (action == GraphAction::capture) record(g, body, "the optimizer update");
    cuda_runtime::graph_launch(g.exec, stream_);
    ++update_replays_;
  }
  done_.record(stream_);
  done_.wait(caller);
}

void StepGraphs::end_step() {
  ++steps_;
}

}  // namespace cz::train
