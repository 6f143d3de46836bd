// Host wrapper of the model-input kernel (model_input.cu): argument checks, device guard, launch status.
#include "tensor/cuda/host_utils.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.h"
#include "tensor/cuda/model_input_element.h"

namespace cz::cuda {

void model_input(const batch_input::BatchView& b, Tensor& out, Stream stream) {
  detail::check_operand("model_input", "out", out, DType::f32, stream);
  CZ_CHECK_SHAPE(out.dim() == 4 && out.size(1) == b.height && out.size(2) == b.width && out.size(3) == 3,
                 "cuda::model_input: out has shape {}, the batch's images are {}x{}x3",
                 shape_str(out.sizes()), b.height, b.width);
  if (out.numel() == 0) return;
  DeviceGuard guard(stream.device.index);
  CZ_CHECK_STATUS(launch::model_input(detail::config_of(stream), b, out.size(0), out.data<float>()));
}

}  // namespace cz::cuda
