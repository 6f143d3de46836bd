// The walk of one training step's allocations (Note [What a step allocates] in step_replay.cpp): the
// walker's state and the ops it replays; step_replay.cpp walks the step, step_walker_ops.cpp the ops.
// Internal to src/dist/plan.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dist/plan/step_replay.h"
#include "nn/model.h"
#include "tensor/check.h"

namespace cz::plan::walk {

using Id = MemoryEvents::Id;
inline constexpr Id kNone = -1;

// CUDA figures (src/tensor/cuda): cuBLAS(Lt) workspace per stream (context.cpp: 32 MiB on Hopper and later,
// 4 MiB before; we plan for the larger), the depthwise filter gradient's partial sums (depthwise.cu, capped
// at 32 MiB; sized here for 132 SMs), and the 2 MiB pages the driver backs a cudaMalloc with. The cuDNN
// workspace: Note [The cuDNN workspace in the plan].
inline constexpr int64_t kCublasWorkspace = int64_t(32) << 20;
inline constexpr int64_t kDepthwiseFilterCap = int64_t(32) << 20;
inline constexpr int64_t kAssumedSmCount = 132;
inline constexpr int64_t kCudaPage = int64_t(2) << 20;

// depthwise.cu filter_plan: partial sums per chunk of rows.
int64_t depthwise_filter_workspace(int64_t rows, int64_t c, int64_t k);

// Note [The cuDNN workspace in the plan]: a training run never times cuDNN's algorithms (the trainer asks
// for conv_benchmark, but Note [Reproducible runs] keeps cuDNN's heuristics, and nothing in the app turns
// reproducible off), so conv.cpp's 256 MiB search block (kMaxWorkspace) is never allocated; the stream's
// workspace is allocated at the first convolution that needs one and grows to the largest need of the
// algorithms chosen (DeviceContext::cudnn_workspace: the larger block is allocated before the old one is
// freed). The plan held a fixed 256 MiB allowance from the start instead: 146-255 MiB above every measured
// CUDA peak. What cuDNN's heuristics choose, and so their need, is known only on a GPU; the walk
// takes, per patchify problem (stem and downsamplings, every direction), its input plus its output in the
// compute dtype: with it the ConvNeXt-T rows (224 px, bf16, b64 and b128) are planned within 0.2%
// (4022.0 vs 4027.9 MiB, 7467.8 vs 7467.6), from those rows' own figures; the atto rows stay 1-2% low. Each
// row is checked on a GPU by a `cuda` test (tests/dist/plan/run_cuda_plan_rows.sh), and a row that passes
// goes into checked_cuda_rows() (planner.h).
int64_t cudnn_patchify_workspace(int64_t input_bytes, int64_t output_bytes);

// A tensor of the walk: its buffer and size.
using A = nn::WalkTensor;

// Replays a step: the trainer's part here (build, batches, loss, backward, optimizer), the model's forward
// through its walk (nn::ModelSpec::walk), whose ops land in step_walker_ops.cpp.
class Walker final : public nn::OpSink {
 public:
  Walker(const StepSpec& s, MemoryEvents& m, std::vector<std::string>& labels)
      : s_(s), m_(m), labels_(labels), e_(int64_t(dtype_size(s.compute))), engine_(m, s.engine) {}

  void build();
  void step();
  std::vector<int64_t> saved_end_of_forward;

  // nn::OpSink: outputs get `out`; `keep()` is the use of tensors a recorded node keeps.
  void scope(const std::string& name, int part) override {
    scope_ = name;
    part_ = part;
  }
  int module_begin(const std::string& module) override;
  void module_end(int unit) override;
  A checkpoint(const A& x, const std::function<A(const A&, nn::WalkOut)>& body, nn::WalkOut out) override;
  void retain(const A& x) override { m_.retain(x.id); }
  void release(const A& x) override { m_.release(x.id); }
  void fork(const A&, int64_t, int64_t) override {}  // the second gradient is added in deposit()
  A depthwise(const A& x, int64_t side, int64_t c, int64_t k, const std::string& module,
              nn::WalkOut out) override;
  A patchify(const A& x, int64_t side, int64_t cin, int64_t cout, int64_t k, bool x_grad,
             const std::string& module, nn::WalkOut out) override;
  A norm(const A& x, const nn::NormOp& op, const std::string& module, nn::WalkOut out) override;
  A linear(const A& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
           nn::WalkOut out) override;
  A linear_gelu(const A& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                nn::WalkOut out) override;
  A linear_scale_residual(const A& r, const A& x, int64_t rows, int64_t in, int64_t out_f,
                          const std::string& module, const std::string& gamma, nn::WalkOut out) override;
  A mlp_scale_residual(const A& r, const A& x, int64_t rows, int64_t c, int64_t hidden,
                       const std::string& mlp, const std::string& gamma, nn::WalkOut out) override;
  A channel_scale(const A& x, int64_t rows, int64_t c, const std::string& gamma, nn::WalkOut out) override;
  A drop_path(const A& x, int64_t rows, int64_t c, nn::WalkOut out) override;
  A add(const A& a, const A& b, int64_t rows, int64_t c, nn::WalkOut out) override;
  A global_avg_pool(const A& x, int64_t rows, int64_t c, nn::WalkOut out) override;

 private:
  using Node = std::function<void()>;
  struct Graph {
    std::vector<Node> nodes;  // creation order
    std::vector<Id> held;     // tensors nodes keep until the graph dies (drop-path scales)
  };

  void micro_step(bool last, const A& images, const A& labels);
  // micro_step's parts: the batch on the device (images of `pixels` values, labels), and the loss of the
  // logits with its backward nodes.
  std::pair<A, A> model_input(int64_t pixels, const A& cpu_labels);
  struct Loss {
    A loss, scaled;
  };
  Loss loss_of(A& logits, const A& labels, const std::string& head);
  // A linear layer's backward buffers (input, weight and bias gradients), which every fused linear
  // allocates after its own.
  struct LinearGrads {
    Id dx, dw, db;
  };
  LinearGrads linear_grads(const A& x, int64_t in, int64_t out_f);
  void linear_param_grads(const LinearGrads& g, const std::string& module) {
    param_grad(g.db, module + ".bias");
    param_grad(g.dw, module + ".weight");
  }

  // The node of an op that keeps its input (and `saved`, released after it) and whose backward allocates the
  // input's gradient, then its module's weight's and bias's (handed over bias first): linear and the
  // normalizations (nn::NormOp). `n`: what the three gradients are called.
  struct GradNames {
    const char *dx, *dw, *db;
  };
  void record_x_weight_bias(const std::string& op, const A& y, const A& x, int64_t w_bytes, int64_t b_bytes,
                            std::vector<Id> saved, const std::string& module, GradNames n);

  // linear_gelu and linear_scale_residual (step_walker_ops.cpp): what the op, the GEMM's output before the
  // epilogue, the op's output and the epilogue's input gradient are called.
  struct FusedNames {
    const char *op, *inner, *output, *inner_grad;
  };
  A fused_linear(const FusedNames& n, const A& r, const A& x, int64_t rows, int64_t in, int64_t out_f,
                 const std::string& module, const std::string& gamma, nn::WalkOut o);

  Use use_of(nn::WalkOut out) const {
    return out == nn::WalkOut::held ? Use::saved : out == nn::WalkOut::saved ? keep() : Use::transient;
  }
  A buf(int64_t bytes, Use use, const char* what) {
    return {m_.alloc(bytes, use, what, use == Use::saved ? part_ : -1), bytes};
  }
  Use keep() const { return recording_ ? saved_use_ : Use::transient; }
  void at(const std::string& scope, const char* op) {
    labels_.push_back(scope + " " + op);
    m_.at(int(labels_.size()) - 1);
  }
  void at(const char* op) { at(scope_, op); }
  void record(Node n) { graph_->nodes.push_back(std::move(n)); }
  void run_backward(Graph& g) {
    for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) (*it)();
  }
  void destroy(Graph& g) {
    for (Id t : g.held) m_.release(t);
    g = Graph{};
  }

  Id& slot(Id t) {
    if (size_t(t) >= slots_.size()) slots_.resize(size_t(t) + 1, kNone);
    return slots_[size_t(t)];
  }
  Id take(Id t) {
    const Id g = slot(t);
    CZ_ASSERT(g != kNone, "planner walk: no gradient arrived for buffer {}", t);
    slot(t) = kNone;
    return g;
  }
  // The engine's accumulate(): the first gradient becomes the slot, later ones are added in place, into a
  // clone when the slot's tensor is also held elsewhere (a checkpoint's seed gradient).
  void deposit(const A& t, Id g) {
    Id& s = slot(t.id);
    if (s == kNone) {
      s = g;
      return;
    }
    if (s == shared_grad_) {
      const Id c = m_.alloc(t.bytes, Use::transient, "gradient cloned to accumulate");
      m_.release(s);
      slot(t.id) = c;
    }
    m_.release(g);
  }
  // A parameter's gradient reaches its AccumulateGrad node (which runs right after the op's node: it was
  // created when the op was recorded, so its sequence number is next; a bias's after its weight's, so the
  // bias goes first): the engine's grad-ready hook, then the gradient is freed. Inside a checkpoint's
  // grad() it is held until grad() returns instead.
  // DeviceContext::cudnn_workspace: grown to `bytes` when smaller, the new block before the old is freed.
  void cudnn_workspace(int64_t bytes) {
    if (bytes <= cudnn_ws_bytes_) return;
    const Id grown = m_.alloc(bytes, Use::workspace, "cuDNN workspace");
    if (cudnn_ws_ != kNone) m_.release(cudnn_ws_);
    cudnn_ws_ = grown;
    cudnn_ws_bytes_ = bytes;
  }
  // Backward of `residual + branch(x)`: the residual's gradient is the incoming g, passed through (held while
  // the branch input's gradient dx is deposited), then g is let go. `r` may be none (no residual).
  void pass_residual(const A& r, Id g, const A& x, Id dx) {
    if (r.id != kNone) {
      m_.retain(g);
      deposit(r, g);
    }
    deposit(x, dx);
    m_.release(g);
  }
  void param_grad(Id g, const std::string& name) {
    const size_t i = engine_.param_index(name);
    if (captured_grads_)
      captured_grads_->emplace_back(i, g);
    else
      engine_.grad_ready(i, g);
  }

  const StepSpec& s_;
  MemoryEvents& m_;
  std::vector<std::string>& labels_;
  const int64_t e_;  // bytes per compute element
  int64_t n_ = 0;    // micro-batch
  Graph main_;
  Graph* graph_ = &main_;
  std::vector<Id> slots_;
  Id cudnn_ws_ = kNone;  // the compute stream's cuDNN workspace, alive from its first use
  int64_t cudnn_ws_bytes_ = 0;
  std::vector<std::pair<size_t, Id>>* captured_grads_ = nullptr;  // (parameter, gradient)
  Id shared_grad_ = kNone;
  Id loss_sum_ = kNone;
  Id ahead_ = kNone;  // CUDA: the next step's first batch on the device (Note [Copying the next batch ahead])
  bool copied_ahead_ = false;  // this micro-step's pixels are that batch
  bool recording_ = true;
  Use saved_use_ = Use::saved;
  int part_ = 0;
  std::string scope_;
  EngineEvents engine_;
};

}  // namespace cz::plan::walk
