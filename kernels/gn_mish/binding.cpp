// Torch binding of the fused GroupNorm+Mish kernels (gn_mish.cu): allocates y, launches on the current stream.
// Python validates first (_checks.py, cuda_variants.Tuning) with clear messages; the TORCH_CHECKs here are the
// safety net.
// `knobs` is the gn_mish::Limits in field order (cuda_variants.Tuning.as_list()); empty = the defaults.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "gn_mish.cuh"

namespace {

gn_mish::DType dtype_of(const torch::Tensor& x) {
  switch (x.scalar_type()) {
    case torch::kFloat32:
      return gn_mish::DType::kFloat32;
    case torch::kFloat16:
      return gn_mish::DType::kFloat16;
    case torch::kBFloat16:
      return gn_mish::DType::kBFloat16;
    default:
      TORCH_CHECK(false, "gn_mish: unsupported dtype ", x.scalar_type());
  }
}

gn_mish::Problem problem_of(const torch::Tensor& x, int64_t groups, double eps) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 3 && x.is_contiguous(), "gn_mish: x must be a contiguous 3-D CUDA tensor");
  TORCH_CHECK(groups >= 1 && x.size(1) % groups == 0, "gn_mish: C=", x.size(1), " not divisible by groups=", groups);
  gn_mish::Problem p;
  p.batch = x.size(0);
  p.channels = x.size(1);
  p.length = x.size(2);
  p.groups = static_cast<int>(groups);
  p.eps = static_cast<float>(eps);
  p.dtype = dtype_of(x);
  return p;
}

gn_mish::Limits limits_of(const std::vector<int64_t>& knobs) {
  gn_mish::Limits lim;
  int* fields[] = {&lim.max_threads, &lim.max_cluster, &lim.t0_threads,     &lim.t0_groups_per_cta,
                   &lim.t1_threads,  &lim.t1_items,     &lim.t1_ctas_per_sm, &lim.t1_persistent,
                   &lim.t1_stash,    &lim.t2,           &lim.t2_ctas,        &lim.t1_smem,
                   &lim.t3,          &lim.t3_ctas,      &lim.t3_reducers,    &lim.t3_depth};
  constexpr size_t kFields = sizeof(fields) / sizeof(fields[0]);
  TORCH_CHECK(knobs.empty() || knobs.size() == kFields, "gn_mish: expected ", kFields, " knobs, got ", knobs.size());
  for (size_t i = 0; i < knobs.size(); ++i) *fields[i] = static_cast<int>(knobs[i]);
  TORCH_CHECK(gn_mish::check_limits(lim) == cudaSuccess, "gn_mish: knobs out of range");
  return lim;
}

gn_mish::Plan plan_of(const gn_mish::Problem& p, const torch::Tensor& x, const void* y, const gn_mish::Limits& lim) {
  gn_mish::Plan pl;
  const cudaError_t err = gn_mish::make_plan(p, x.data_ptr(), y, lim, &pl);
  TORCH_CHECK(err == cudaSuccess, "gn_mish: planning failed: ", cudaGetErrorString(err));
  return pl;
}

// Tier 2 and 3's buffers. Outside a stream capture: one per (device, stream, kind), grown by replacing it (the old one
// is freed in stream order); the counters are zeroed when made, every launch leaves them at zero, and they never hold
// anything else. While the stream is captured: fresh ones per call, so the graph owns them (the counters' memset is
// a node before the kernel; a cached buffer would be shared between replays and eager calls on another stream).
torch::Tensor scratch(const torch::Tensor& x, int64_t bytes, bool counters, cudaStream_t stream) {
  const auto opts = torch::TensorOptions().dtype(torch::kUInt8).device(x.device());
  auto make = [&](int64_t n) { return counters ? torch::zeros({n}, opts) : torch::empty({n}, opts); };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream, &capture) == cudaSuccess, "gn_mish: cudaStreamIsCapturing failed");
  if (capture != cudaStreamCaptureStatusNone) return make(bytes);
  static std::mutex mu;
  using Key = std::tuple<int, cudaStream_t, bool>;
  static auto* cache = new std::map<Key, torch::Tensor>();  // never destroyed: it may outlive the CUDA context
  const std::lock_guard<std::mutex> lock(mu);
  torch::Tensor& buf = (*cache)[Key{x.get_device(), stream, counters}];
  if (!buf.defined() || buf.numel() < bytes) buf = make(std::max<int64_t>(bytes, 16 * 1024));
  return buf;
}

torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& gamma, const torch::Tensor& beta, int64_t groups,
                      double eps, const std::vector<int64_t>& knobs) {
  const gn_mish::Problem p = problem_of(x, groups, eps);
  for (const torch::Tensor* t : {&gamma, &beta}) {
    TORCH_CHECK(t->device() == x.device() && t->scalar_type() == x.scalar_type() && t->dim() == 1 &&
                    t->size(0) == x.size(1) && t->is_contiguous(),
                "gn_mish: gamma and beta must be contiguous (C,) tensors like x");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor y = torch::empty_like(x);  // x is contiguous, so y is
  const gn_mish::Plan pl = plan_of(p, x, y.data_ptr(), limits_of(knobs));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  torch::Tensor counters, partials;  // held until the launch is queued
  gn_mish::Workspace ws;
  if (pl.tier >= 2) {
    counters = scratch(x, pl.counter_bytes, true, stream);
    if (pl.partial_bytes > 0) partials = scratch(x, pl.partial_bytes, false, stream);
    ws = {counters.data_ptr(), partials.defined() ? partials.data_ptr() : nullptr};
  }
  const cudaError_t err = gn_mish::launch(p, pl, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(), ws,
                                          stream);
  TORCH_CHECK(err == cudaSuccess, "gn_mish: launch failed: ", cudaGetErrorString(err));
  return y;
}

// The launch plan for x (y assumed 16-byte aligned, as a fresh allocation is) and how many of its CTAs can be
// resident at once: for tests, notes and tuning.
std::map<std::string, int64_t> plan(const torch::Tensor& x, int64_t groups, const std::vector<int64_t>& knobs) {
  const gn_mish::Problem p = problem_of(x, groups, 1e-5);
  const c10::cuda::CUDAGuard guard(x.device());
  const gn_mish::Plan pl = plan_of(p, x, x.data_ptr(), limits_of(knobs));
  int resident = 0;
  const cudaError_t err = gn_mish::resident_ctas(p, pl, &resident);
  TORCH_CHECK(err == cudaSuccess, "gn_mish: occupancy query failed: ", cudaGetErrorString(err));
  return {{"tier", pl.tier},
          {"vec", pl.vec},
          {"threads", pl.threads},
          {"group_threads", pl.group_threads},
          {"groups_per_cta", pl.groups_per_cta},
          {"cluster", pl.cluster},
          {"items", pl.items},
          {"grid", pl.grid},
          {"slice_vecs", pl.slice_vecs},
          {"chunks", pl.chunks},
          {"persistent", pl.persistent},
          {"stage", pl.stage},
          {"smem_bytes", pl.smem_bytes},
          {"stash", pl.stash},
          {"counter_bytes", pl.counter_bytes},
          {"partial_bytes", pl.partial_bytes},
          {"smem_slice", pl.smem_slice},
          {"reducers", pl.reducers},
          {"depth", pl.depth},
          {"resident_ctas", resident}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "y = mish(group_norm(x) * gamma + beta)", py::arg("x"), py::arg("gamma"),
        py::arg("beta"), py::arg("groups"), py::arg("eps"), py::arg("knobs") = std::vector<int64_t>{});
  m.def("plan", &plan, "launch plan for x", py::arg("x"), py::arg("groups"),
        py::arg("knobs") = std::vector<int64_t>{});
}
