// A model as the rest of the runtime sees it: its parameters and ZeRO-3 units, its forward (backward is
// autograd's), and a walk of its training forward op by op with shapes, which the planner's memory replay and
// the what-if's op costs follow instead of knowing the network. A new family is a ModelSpec and a Model here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace cz::nn {

// A parameter as the model registers it (Note [ConvNeXt structure]).
struct ParamInfo {
  std::string name;  // as named_parameters() names it, e.g. "stages.1.blocks.0.mlp.fc1.weight"
  Shape shape;       // PyTorch layout, as registered
  int64_t numel = 0;
  std::string unit;  // the unit holding it, e.g. "stem", "stages.i.blocks.j", "head"
};

// A tensor of a walk: a handle its sink hands out (a buffer id and its bytes for the memory replay); the
// model only passes it on.
struct WalkTensor {
  int64_t id = -1;
  int64_t bytes = 0;
};

// What becomes of an op's output: the next op's autograd node keeps it when recorded (saved), nothing does
// (transient), or a recorded node outside the module the walk runs unrecorded keeps it (held: the output of
// a checkpointed module, which OpSink::checkpoint hands its body).
enum class WalkOut : uint8_t { saved, transient, held };

// A normalization over rows x c activations with its module's per-channel weight and bias (LayerNorm, GRN;
// nn/norm_ops.h describes them): everything a sink needs to replay and to cost one, so that a new
// normalization is a description in src/nn and not a method of every sink. Forward allocates the output, then
// `saved`; its autograd node keeps its input and `saved`; backward allocates the input's gradient, then the
// weight's and the bias's (the bias's AccumulateGrad node runs first). Labels are static strings: the
// planner keeps them as they are.
struct NormOp {
  // A buffer forward allocates after its output and the node keeps until backward.
  struct Saved {
    int64_t bytes = 0;
    const char* what = "";
  };
  // The least work of a pass: FLOPs, elements read and written once in the compute dtype, and the bytes of
  // f32 statistics on top.
  struct Work {
    double flops = 0;
    double elements = 0;
    double extra_bytes = 0;
  };
  const char* name = "";           // forward's profiler name and the walk's label for it: "layer_norm"
  const char* backward_name = "";  // backward's profiler name: "LayerNormBackward"
  int64_t rows = 0, c = 0;
  std::vector<Saved> saved;  // in allocation order
  // What the output and backward's gradients of the input, the weight and the bias are called.
  const char *output = "", *input_grad = "", *weight_grad = "", *bias_grad = "";
  Work forward, backward;
};

// The ops a model's training forward is made of, in the order it calls them, each as src/tensor/ops runs it
// (its output, what its node keeps, its backward). Modules: `module` is the op's module path
// ("stages.0.blocks.1.conv_dw"), whose .weight and .bias get gradients; `gamma` names a parameter. rows x c
// activations; `side`: the input's height (= width); the sink knows the micro-batch.
class OpSink {
 public:
  using T = WalkTensor;
  virtual ~OpSink() = default;

  // Where the ops that follow are: their scope ("stages.1.blocks.0") and the network part (parts()) whose
  // saved activations they are.
  virtual void scope(const std::string& name, int part) = 0;
  // A module call: its forward-pre hook; module_end: its forward hook and, recorded, its backward-pre hook.
  virtual int module_begin(const std::string& module) = 0;
  virtual void module_end(int handle) = 0;
  // The scope's module run under activation checkpointing: `body` under no-grad now, again with grad in
  // backward; `body` makes the module call itself (module_begin/end around its ops).
  virtual T checkpoint(const T& x, const std::function<T(const T&, WalkOut)>& body, WalkOut out) = 0;
  // A C++ handle taken (retain) or let go (release): a tensor lives while a handle or a node holds it.
  virtual void retain(const T& x) = 0;
  virtual void release(const T& x) = 0;
  // `x` feeds both a residual branch and the identity: backward adds the two gradients.
  virtual void fork(const T& x, int64_t rows, int64_t c) = 0;

  virtual T patchify(const T& x, int64_t side, int64_t cin, int64_t cout, int64_t k, bool x_grad,
                     const std::string& module, WalkOut out) = 0;
  virtual T depthwise(const T& x, int64_t side, int64_t c, int64_t k, const std::string& module,
                      WalkOut out) = 0;
  // A normalization of `module` (its .weight and .bias get gradients), as `op` describes it.
  virtual T norm(const T& x, const NormOp& op, const std::string& module, WalkOut out) = 0;
  virtual T linear(const T& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                   WalkOut out) = 0;
  virtual T linear_gelu(const T& x, int64_t rows, int64_t in, int64_t out_f, const std::string& module,
                        WalkOut out) = 0;
  // fc2, gamma and the residual r in one op.
  virtual T linear_scale_residual(const T& r, const T& x, int64_t rows, int64_t in, int64_t out_f,
                                  const std::string& module, const std::string& gamma, WalkOut out) = 0;
  // A whole MLP branch (`mlp`: "....mlp", whose fc1 and fc2 get gradients), gamma and the residual r.
  virtual T mlp_scale_residual(const T& r, const T& x, int64_t rows, int64_t c, int64_t hidden,
                               const std::string& mlp, const std::string& gamma, WalkOut out) = 0;
  virtual T channel_scale(const T& x, int64_t rows, int64_t c, const std::string& gamma, WalkOut out) = 0;
  virtual T drop_path(const T& x, int64_t rows, int64_t c, WalkOut out) = 0;
  virtual T add(const T& a, const T& b, int64_t rows, int64_t c, WalkOut out) = 0;
  virtual T global_avg_pool(const T& x, int64_t rows, int64_t c, WalkOut out) = 0;
};

// The step a walk describes.
struct WalkShape {
  int64_t batch = 0;  // the micro-batch
  int64_t image = 0;  // square images of image x image pixels
  bool cuda = false;  // the CUDA backend's op choices (the CPU fuses more, mlp_as_one_op)
  bool checkpointing = false;
};

// A model family from its configuration alone: the planner and the what-if ask it without building the
// model (xlarge would allocate and initialise 350M parameters).
class ModelSpec {
 public:
  virtual ~ModelSpec() = default;
  virtual const std::string& name() const = 0;
  virtual int64_t in_chans() const = 0;
  virtual int64_t num_classes() const = 0;
  // The network's total stride: images smaller than it are refused.
  virtual int64_t stride() const = 0;
  // In registration order (the order of the flat buffer).
  virtual std::vector<ParamInfo> parameters() const = 0;
  // The modules ZeRO stage 3 gathers and releases whole, in that order; every parameter lies in one.
  std::vector<std::string> units() const;
  // The parts saved activations are attributed to, e.g. "stem", "stages.0", ..., "head" (the loss's too).
  virtual std::vector<std::string> parts() const = 0;
  // The training forward from (N, H, W, in_chans) images to (N, num_classes) logits, op by op; `logits_out`:
  // what the caller's next op does with them. The last part is the head's.
  virtual WalkTensor walk(OpSink& ops, const WalkShape& shape, const WalkTensor& images,
                          WalkOut logits_out) const = 0;
};

// A built model: a Module whose forward maps images to logits, with its spec.
class Model : public Module {
 public:
  using Module::Module;
  virtual const ModelSpec& spec() const = 0;
  std::vector<std::string> units() const { return spec().units(); }
  virtual void init_weights(uint64_t seed) = 0;
  // Re-initialises the classifier (fine-tuning on another number of classes).
  virtual void reset_head(uint64_t seed) = 0;
  // Recompute the checkpointed modules' activations in backward instead of keeping them.
  virtual void set_activation_checkpointing(bool on) = 0;
  // Stochastic depth's randomness for the next forward (Note [Drop-path masks]).
  virtual void set_drop_path_context(uint64_t seed, uint64_t step, int64_t sample_offset) = 0;
};

}  // namespace cz::nn
