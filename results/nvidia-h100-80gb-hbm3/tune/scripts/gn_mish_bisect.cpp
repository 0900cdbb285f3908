// Torch binding of gn_mish_bisect.cu: forward(x, gamma, beta, y, variant, C, L, k, threads) on the current stream.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

cudaError_t bisect_launch(int variant, const float* x, const float* gamma, const float* beta, float* y, int C, int L,
                          int k, int threads, cudaStream_t stream);

void forward(const torch::Tensor& x, const torch::Tensor& gamma, const torch::Tensor& beta, torch::Tensor& y,
             int64_t variant, int64_t C, int64_t L, int64_t k, int64_t threads) {
  const cudaError_t err = bisect_launch(int(variant), x.data_ptr<float>(), gamma.data_ptr<float>(),
                                        beta.data_ptr<float>(), y.data_ptr<float>(), int(C), int(L), int(k),
                                        int(threads), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "bisect: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
