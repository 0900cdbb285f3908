// Torch binding of gn_mish_ladder.cu: forward(x, y, gb, level, variant, cluster, threads) launches on the current stream.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/extension.h>

cudaError_t ladder_launch(int level, int variant, int cluster, const void* x, void* y, const float* gb, int blocks,
                          int threads, int slice, cudaStream_t stream);

// gb: 512 fp32 (gamma/beta stand-ins for L6)
void forward(const torch::Tensor& x, torch::Tensor& y, const torch::Tensor& gb, int64_t level, int64_t variant,
             int64_t cluster, int64_t threads) {
  const int64_t vecs = x.numel() / 4;
  const int slice = int(threads) * 4;
  TORCH_CHECK(vecs % slice == 0, "ladder: size");
  const cudaError_t err = ladder_launch(int(level), int(variant), int(cluster), x.data_ptr(), y.data_ptr(),
                                        gb.data_ptr<float>(), int(vecs / slice),
                                        int(threads), slice, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "ladder: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
