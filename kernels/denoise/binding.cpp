// binding.cpp: torch plumbing for denoise.cu (checks, output allocation, current stream).
//
// Cheap C++ checks (a few hundred ns) guard the raw-pointer kernel; they raise TypeError / ValueError
// (TORCH_CHECK_TYPE / TORCH_CHECK_VALUE). The Python wrapper (cuda_variants.py) re-diagnoses any failure with the
// family's full Python checks, so the message names the problem the same way for every variant. Nothing
// here synchronizes: the step index, the constants table and the Philox seed/offset stay on the device.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

cudaError_t denoise_step_launch(const float* eps, const float* x, const float* z, const float* table,
                                const int64_t* step, int num_steps, float* out, int64_t n, cudaStream_t stream);
cudaError_t denoise_step_philox_launch(const float* eps, const float* x, const float* table, const int64_t* step,
                                       int num_steps, const int64_t* seed_offset, float* out, int64_t n,
                                       cudaStream_t stream);
cudaError_t philox_normal_launch(const int64_t* step, const int64_t* seed_offset, float* z, int64_t n,
                                 cudaStream_t stream);

namespace {

constexpr int64_t kColumns = 8;

void check_sample(const torch::Tensor& t, const torch::Tensor& x, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == torch::kFloat32, "denoise.cuda: ", name, " must be float32, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), "denoise.cuda: ", name, " is on ", t.device(), ", x on ", x.device());
  TORCH_CHECK_VALUE(t.sizes() == x.sizes(), "denoise.cuda: ", name, " has shape ", t.sizes(), ", x has ", x.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "denoise.cuda: ", name, " must be contiguous");
}

void check_common(const torch::Tensor& eps, const torch::Tensor& x, const torch::Tensor& table,
                  const torch::Tensor& step) {
  TORCH_CHECK_VALUE(x.is_cuda(), "denoise.cuda: x must be a CUDA tensor, got ", x.device());
  TORCH_CHECK_VALUE(x.numel() > 0, "denoise.cuda: empty sample");
  check_sample(x, x, "x");
  check_sample(eps, x, "eps");
  TORCH_CHECK_TYPE(step.scalar_type() == torch::kInt64 && step.numel() == 1,
                   "denoise.cuda: step must be an int64 tensor with one element");
  TORCH_CHECK_VALUE(step.device() == x.device(), "denoise.cuda: step is on ", step.device(), ", x on ", x.device());
  TORCH_CHECK_VALUE(table.device() == x.device() && table.scalar_type() == torch::kFloat32 && table.dim() == 2 &&
                        table.size(1) == kColumns && table.size(0) > 0 && table.is_contiguous(),
                    "denoise.cuda: constants table must be a contiguous (N, 8) float32 tensor on x's device");
}

torch::Tensor output_for(const torch::Tensor& x, const c10::optional<torch::Tensor>& out) {
  if (!out.has_value()) return torch::empty_like(x, x.options().memory_format(c10::MemoryFormat::Contiguous));
  check_sample(*out, x, "out");  // may alias x or eps: each element is read before the same thread writes it
  return *out;
}

void check_launch(cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, "denoise.cuda: kernel launch failed: ", cudaGetErrorString(err));
}

torch::Tensor step(const torch::Tensor& eps, const torch::Tensor& x, const torch::Tensor& z,
                   const torch::Tensor& table, const torch::Tensor& step_index, c10::optional<torch::Tensor> out) {
  check_common(eps, x, table, step_index);
  check_sample(z, x, "z");
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor y = output_for(x, out);
  check_launch(denoise_step_launch(eps.data_ptr<float>(), x.data_ptr<float>(), z.data_ptr<float>(),
                                   table.data_ptr<float>(), step_index.data_ptr<int64_t>(),
                                   static_cast<int>(table.size(0)), y.data_ptr<float>(), x.numel(),
                                   c10::cuda::getCurrentCUDAStream()));
  return y;
}

torch::Tensor step_philox(const torch::Tensor& eps, const torch::Tensor& x, const torch::Tensor& table,
                          const torch::Tensor& step_index, const torch::Tensor& seed_offset,
                          c10::optional<torch::Tensor> out) {
  check_common(eps, x, table, step_index);
  TORCH_CHECK_TYPE(seed_offset.scalar_type() == torch::kInt64 && seed_offset.numel() == 2 &&
                       seed_offset.is_contiguous(),
                   "denoise.cuda_philox: seed_offset must be a contiguous int64 tensor [seed, offset]");
  TORCH_CHECK_VALUE(seed_offset.device() == x.device(), "denoise.cuda_philox: seed_offset must be on x's device");
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor y = output_for(x, out);
  check_launch(denoise_step_philox_launch(eps.data_ptr<float>(), x.data_ptr<float>(), table.data_ptr<float>(),
                                          step_index.data_ptr<int64_t>(), static_cast<int>(table.size(0)),
                                          seed_offset.data_ptr<int64_t>(), y.data_ptr<float>(), x.numel(),
                                          c10::cuda::getCurrentCUDAStream()));
  return y;
}

torch::Tensor philox_normal(const torch::Tensor& step_index, const torch::Tensor& seed_offset, int64_t n) {
  TORCH_CHECK_VALUE(step_index.is_cuda() && seed_offset.device() == step_index.device(),
                    "denoise.philox_normal: step and seed_offset must be CUDA tensors on one device");
  TORCH_CHECK_TYPE(step_index.scalar_type() == torch::kInt64 && step_index.numel() == 1 &&
                       seed_offset.scalar_type() == torch::kInt64 && seed_offset.numel() == 2 &&
                       seed_offset.is_contiguous(),
                   "denoise.philox_normal: step must be one int64, seed_offset two int64 [seed, offset]");
  TORCH_CHECK_VALUE(n > 0, "denoise.philox_normal: n must be positive");
  const c10::cuda::CUDAGuard guard(step_index.device());
  torch::Tensor z = torch::empty({n}, step_index.options().dtype(torch::kFloat32));
  check_launch(philox_normal_launch(step_index.data_ptr<int64_t>(), seed_offset.data_ptr<int64_t>(),
                                    z.data_ptr<float>(), n, c10::cuda::getCurrentCUDAStream()));
  return z;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("step", &step, "one DDPM/DDIM step with noise tensor z", py::arg("eps"), py::arg("x"), py::arg("z"),
        py::arg("table"), py::arg("step"), py::arg("out") = py::none());
  m.def("step_philox", &step_philox, "one DDPM/DDIM step with in-kernel Philox noise", py::arg("eps"), py::arg("x"),
        py::arg("table"), py::arg("step"), py::arg("seed_offset"), py::arg("out") = py::none());
  m.def("philox_normal", &philox_normal, "the normals step_philox adds (before sigma)", py::arg("step"),
        py::arg("seed_offset"), py::arg("n"));
}
