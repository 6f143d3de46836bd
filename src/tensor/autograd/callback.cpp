// The identity node behind with_backward_callback.
#include "tensor/autograd/callback.h"

#include "tensor/autograd/node.h"

namespace cz {
namespace {

class CallbackBackward final : public Node {
 public:
  explicit CallbackBackward(std::function<void()> fn) : fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& g) override {
    fn_();
    return {std::move(g[0])};
  }
  std::string name() const override { return "CallbackBackward"; }

 private:
  std::function<void()> fn_;
};

}  // namespace

Tensor with_backward_callback(const Tensor& x, std::function<void()> on_grad) {
  if (!should_record({&x})) return x;
  Tensor out = x.detach();
  record(std::make_shared<CallbackBackward>(std::move(on_grad)), {&x}, {&out});
  return out;
}

}  // namespace cz
