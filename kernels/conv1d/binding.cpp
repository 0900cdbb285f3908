// binding.cpp: torch glue for the conv1d CUDA kernels (naive.cu, optimized.cu, stream.cu, stream_rows.cu, tiled.cu).
//
// Checks what the launchers rely on (the Python helper _checks.py has already given the user-facing
// errors: these are the last line of defence), picks the path (optimized: seed kernel for B*L <= tiled_min_bl,
// else tiled.cu; stream: stream.cu, or tiled.cu for fp32 above tiled_min_bl), allocates y (and the split
// workspace), launches on the current stream and turns a launch error into a Python exception.
// Split reductions share a per-device zeroed counter buffer kept here: each launch leaves it zero, so no memset
// is needed per call. Tuning knobs arrive as an optional list of ints (-1: the default in conv1d.h); the
// variants pass none, so their behaviour is the defaults.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "conv1d.h"

namespace {

using Knobs = std::optional<std::vector<int64_t>>;
constexpr size_t kTiledKnobs = 5, kStreamKnobs = 11;  // lengths of the knob lists (see *_config below)

Conv1dShape check_inputs(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const char* who,
                         std::initializer_list<at::ScalarType> dtypes) {
    TORCH_CHECK_VALUE(x.dim() == 3 && w.dim() == 3 && b.dim() == 1, who, ": expected x 3-D, w 3-D, b 1-D");
    TORCH_CHECK_VALUE(x.is_cuda() && w.device() == x.device() && b.device() == x.device(), who,
                      ": x, w, b must be on one CUDA device");
    TORCH_CHECK_TYPE(w.scalar_type() == x.scalar_type() && b.scalar_type() == x.scalar_type(), who,
                     ": x, w, b must have one dtype");
    bool dtype_ok = false;
    for (auto d : dtypes) dtype_ok |= x.scalar_type() == d;
    TORCH_CHECK_TYPE(dtype_ok, who, ": unsupported dtype ", x.scalar_type());
    TORCH_CHECK_VALUE(x.is_contiguous() && w.is_contiguous() && b.is_contiguous(), who, ": inputs must be contiguous");
    TORCH_CHECK_VALUE(w.size(1) == x.size(1), who, ": x has ", x.size(1), " channels, w expects ", w.size(1));
    TORCH_CHECK_VALUE(b.size(0) == w.size(0), who, ": bias length ", b.size(0), " != Cout ", w.size(0));
    TORCH_CHECK_VALUE(w.size(2) % 2 == 1, who, ": kernel size must be odd, got ", w.size(2));
    TORCH_CHECK_VALUE(x.numel() > 0 && w.numel() > 0, who, ": empty input");
    const int64_t limit = std::numeric_limits<int>::max();
    TORCH_CHECK_VALUE(x.numel() <= limit && w.numel() <= limit && x.size(0) * w.size(0) * x.size(2) <= limit, who,
                      ": tensors must have fewer than 2^31 elements");
    return Conv1dShape{static_cast<int>(x.size(0)), static_cast<int>(x.size(1)), static_cast<int>(w.size(0)),
                       static_cast<int>(x.size(2)), static_cast<int>(w.size(2))};
}

void check_launch(cudaError_t err, const char* who) {
    TORCH_CHECK(err == cudaSuccess, who, ": kernel launch failed: ", cudaGetErrorString(err));
}

// knob i of the list, or `fallback` when the list is absent or the entry is -1
int knob(const Knobs& k, size_t i, int fallback) {
    return k && i < k->size() && (*k)[i] != -1 ? static_cast<int>((*k)[i]) : fallback;
}
void check_length(const Knobs& k, size_t n, const char* who) {
    TORCH_CHECK_VALUE(!k || k->size() == n, who, ": expected ", n, " config values, got ", k ? k->size() : 0);
}

// [tile, stages, ctas_per_sm, cache_policy, mma], read from position `at`
Conv1dTiledConfig tiled_config(const Knobs& k, size_t at) {
    Conv1dTiledConfig c;
    c.tile = knob(k, at, c.tile);
    c.stages = knob(k, at + 1, c.stages);
    c.ctas_per_sm = knob(k, at + 2, c.ctas_per_sm);
    c.cache_policy = knob(k, at + 3, c.cache_policy);
    c.mma = knob(k, at + 4, c.mma);
    return c;
}

// [rows_per_warp, vecs_per_row, stages, ctas_per_sm, cache_policy, tiled_min_bl, bulk, rows, row_chunks,
//  row_threads, row_ahead]
Conv1dStreamConfig stream_config(const Knobs& k) {
    Conv1dStreamConfig c;
    c.rows_per_warp = knob(k, 0, c.rows_per_warp);
    c.vecs_per_row = knob(k, 1, c.vecs_per_row);
    c.stages = knob(k, 2, c.stages);
    c.ctas_per_sm = knob(k, 3, c.ctas_per_sm);
    c.cache_policy = knob(k, 4, c.cache_policy);
    c.tiled_min_bl = knob(k, 5, c.tiled_min_bl);
    c.bulk = knob(k, 6, c.bulk);
    c.rows = knob(k, 7, c.rows);
    c.row_chunks = knob(k, 8, c.row_chunks);
    c.row_threads = knob(k, 9, c.row_threads);
    c.row_ahead = knob(k, 10, c.row_ahead);
    return c;
}

// Multiprocessor count of a device, cached (the planners size grids to it).
int sm_count(const at::Device& device) {
    static std::mutex lock;
    static auto* cache = new std::unordered_map<int, int>();
    std::lock_guard<std::mutex> guard(lock);
    auto it = cache->find(device.index());
    if (it != cache->end()) return it->second;
    int sms = 0;
    check_launch(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index()), "conv1d: SM count");
    return (*cache)[device.index()] = sms;
}

// Zeroed arrival counters per device, grown on demand; leaked on purpose (no destructor after CUDA teardown).
at::Tensor split_counters(const at::Device& device, int64_t needed) {
    static std::mutex lock;
    static auto* cache = new std::unordered_map<int, at::Tensor>();
    std::lock_guard<std::mutex> guard(lock);
    at::Tensor& t = (*cache)[device.index()];
    if (!t.defined() || t.numel() < needed) {
        t = at::zeros({std::max<int64_t>(needed, 4096)}, at::TensorOptions().device(device).dtype(at::kInt));
    }
    return t;
}

struct SplitBuffers {
    at::Tensor workspace, counters;
    float* ws() const { return workspace.defined() ? workspace.data_ptr<float>() : nullptr; }
    unsigned* ctr() const {
        return counters.defined() ? reinterpret_cast<unsigned*>(counters.data_ptr<int>()) : nullptr;
    }
};
SplitBuffers split_buffers(const at::Tensor& x, size_t workspace_floats, int counters) {
    SplitBuffers s;
    if (workspace_floats > 0) {
        s.workspace = at::empty({static_cast<int64_t>(workspace_floats)}, x.options().dtype(at::kFloat));
        s.counters = split_counters(x.device(), counters);
    }
    return s;
}

at::Tensor run_tiled(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Conv1dShape s,
                     const Conv1dTiledConfig& cfg, const char* who) {
    const int sms = sm_count(x.device());
    const Conv1dTiledPlan plan = conv1d_tiled_plan(s, cfg, sms);
    TORCH_CHECK_VALUE(plan.ok, who, ": tiled config out of range (tile ", cfg.tile, ", stages ", cfg.stages,
                      ", ctas_per_sm ", cfg.ctas_per_sm, ", cache_policy ", cfg.cache_policy, ", mma ", cfg.mma, ")");
    at::Tensor y = at::empty({s.B, s.Cout, s.L}, x.options());
    const SplitBuffers buf = split_buffers(x, plan.workspace_floats, plan.counters);
    check_launch(conv1d_tiled_f32(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
                                  buf.ws(), buf.ctr(), s, cfg, sms, c10::cuda::getCurrentCUDAStream()),
                 who);
    return y;
}

int64_t bl(Conv1dShape s) { return static_cast<int64_t>(s.B) * s.L; }

}  // namespace

at::Tensor naive(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    const Conv1dShape s = check_inputs(x, w, b, "conv1d.naive", {at::kFloat});
    const c10::cuda::CUDAGuard device_guard(x.device());
    at::Tensor y = at::empty({s.B, s.Cout, s.L}, x.options());
    check_launch(conv1d_naive_f32(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
                                  s, c10::cuda::getCurrentCUDAStream()),
                 "conv1d.naive");
    return y;
}

// knobs: [tiled_min_bl, tile, stages, ctas_per_sm, cache_policy, mma]
at::Tensor optimized(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Knobs& knobs) {
    const Conv1dShape s = check_inputs(x, w, b, "conv1d.optimized", {at::kFloat});
    check_length(knobs, 1 + kTiledKnobs, "conv1d.optimized");
    const c10::cuda::CUDAGuard device_guard(x.device());
    if (bl(s) > knob(knobs, 0, kConv1dOptimizedTiledMinBL)) return run_tiled(x, w, b, s, tiled_config(knobs, 1),
                                                                             "conv1d.optimized");
    Conv1dOptimizedConfig cfg;
    TORCH_CHECK_VALUE(conv1d_optimized_config(s, &cfg), "conv1d.optimized: unsupported shape Cin=", s.Cin, " K=", s.K,
                      " (supports K in {1, 3, 5, 7} and Cin <= 2048)");
    at::Tensor y = at::empty({s.B, s.Cout, s.L}, x.options());
    check_launch(conv1d_optimized_f32(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                      y.data_ptr<float>(), s, c10::cuda::getCurrentCUDAStream()),
                 "conv1d.optimized");
    return y;
}

// knobs: [rows_per_warp, vecs_per_row, stages, ctas_per_sm, cache_policy, tiled_min_bl, bulk, rows, row_chunks,
//         row_threads, row_ahead, tile, tiled_stages, tiled_ctas_per_sm, tiled_cache_policy, tiled_mma]
at::Tensor stream(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Knobs& knobs) {
    const Conv1dShape s = check_inputs(x, w, b, "conv1d.stream", {at::kFloat, at::kBFloat16, at::kHalf});
    check_length(knobs, kStreamKnobs + kTiledKnobs, "conv1d.stream");
    const c10::cuda::CUDAGuard device_guard(x.device());
    Conv1dStreamConfig cfg = stream_config(knobs);
    if (reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) cfg.rows = 0;  // bulk copies need an aligned w
    if (x.scalar_type() == at::kFloat && bl(s) > cfg.tiled_min_bl)
        return run_tiled(x, w, b, s, tiled_config(knobs, kStreamKnobs), "conv1d.stream");
    const Conv1dDtype dt = x.scalar_type() == at::kFloat ? kConv1dF32
                           : x.scalar_type() == at::kBFloat16 ? kConv1dBF16 : kConv1dF16;
    const int sms = sm_count(x.device());
    const Conv1dStreamPlan plan = conv1d_stream_plan(s, static_cast<int>(x.element_size()), cfg, sms);
    TORCH_CHECK_VALUE(plan.ok, "conv1d.stream: config out of range (stages ", cfg.stages, ", ctas_per_sm ",
                      cfg.ctas_per_sm, ", cache_policy ", cfg.cache_policy, ", bulk ", cfg.bulk, ", rows ", cfg.rows,
                      ", row_chunks ", cfg.row_chunks, ", row_threads ", cfg.row_threads,
                      ", row_ahead ", cfg.row_ahead, ")");
    at::Tensor y = at::empty({s.B, s.Cout, s.L}, x.options());
    const SplitBuffers buf = split_buffers(x, plan.workspace_floats, plan.counters);
    check_launch(conv1d_stream(dt, x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), buf.ws(), buf.ctr(), s,
                               cfg, sms, c10::cuda::getCurrentCUDAStream()),
                 "conv1d.stream");
    return y;
}

std::vector<int64_t> stream_plan(int64_t B, int64_t Cin, int64_t Cout, int64_t L, int64_t K, int64_t elem_bytes,
                                 const Knobs& knobs, int64_t num_sms) {
    check_length(knobs, kStreamKnobs, "stream_plan");
    const Conv1dStreamPlan p = conv1d_stream_plan(
        Conv1dShape{static_cast<int>(B), static_cast<int>(Cin), static_cast<int>(Cout), static_cast<int>(L),
                    static_cast<int>(K)},
        static_cast<int>(elem_bytes), stream_config(knobs), static_cast<int>(num_sms));
    return {p.ok, p.rows_per_warp, p.vecs_per_row, p.outputs_per_pass, p.passes, p.splits, p.row_groups, p.chunks,
            p.chunks_per_cta, p.stages, static_cast<int64_t>(p.smem_bytes), static_cast<int64_t>(p.workspace_floats),
            p.counters, p.bulk, p.rows};
}

std::vector<int64_t> tiled_plan(int64_t B, int64_t Cin, int64_t Cout, int64_t L, int64_t K, const Knobs& knobs,
                                int64_t num_sms) {
    check_length(knobs, kTiledKnobs, "tiled_plan");
    const Conv1dTiledPlan p = conv1d_tiled_plan(
        Conv1dShape{static_cast<int>(B), static_cast<int>(Cin), static_cast<int>(Cout), static_cast<int>(L),
                    static_cast<int>(K)},
        tiled_config(knobs, 0), static_cast<int>(num_sms));
    return {p.ok, p.tile, p.bm, p.bn, p.bk, p.tm, p.tn, p.threads, p.n_tiles, p.m_tiles, p.splits, p.k_steps,
            p.stages, static_cast<int64_t>(p.smem_bytes), static_cast<int64_t>(p.workspace_floats), p.counters,
            p.cache_policy, p.mma};
}

std::vector<int64_t> optimized_config(int64_t B, int64_t Cin, int64_t Cout, int64_t L, int64_t K) {
    Conv1dOptimizedConfig c{};
    const bool ok = conv1d_optimized_config(Conv1dShape{static_cast<int>(B), static_cast<int>(Cin),
                                                        static_cast<int>(Cout), static_cast<int>(L),
                                                        static_cast<int>(K)},
                                            &c);
    if (!ok) return {};
    return {c.cpt, c.lt, c.threads, static_cast<int64_t>(c.smem_bytes)};
}

std::vector<int64_t> default_knobs(const std::string& which) {
    const Conv1dStreamConfig s;
    const Conv1dTiledConfig t;
    const std::vector<int64_t> tiled{t.tile, t.stages, t.ctas_per_sm, t.cache_policy, t.mma};
    std::vector<int64_t> out;
    if (which == "stream") {
        out = {s.rows_per_warp, s.vecs_per_row, s.stages, s.ctas_per_sm, s.cache_policy, s.tiled_min_bl, s.bulk,
               s.rows, s.row_chunks, s.row_threads, s.row_ahead};
    } else {
        TORCH_CHECK_VALUE(which == "optimized", "default_knobs: 'stream' or 'optimized', got ", which);
        out = {kConv1dOptimizedTiledMinBL};
    }
    out.insert(out.end(), tiled.begin(), tiled.end());
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    const auto none = pybind11::none();
    m.def("naive", &naive, "conv1d, seed Part IV design (fp32)");
    m.def("optimized", &optimized, "conv1d, seed Part V design generalised, tiled GEMM above tiled_min_bl (fp32)",
          pybind11::arg("x"), pybind11::arg("w"), pybind11::arg("b"), pybind11::arg("knobs") = none);
    m.def("stream", &stream, "conv1d, weight-streaming split-reduction kernel (fp32/bf16/fp16)", pybind11::arg("x"),
          pybind11::arg("w"), pybind11::arg("b"), pybind11::arg("knobs") = none);
    m.def("optimized_config", &optimized_config,
          "(cpt, lt, threads, smem_bytes) of the seed kernel, [] if the shape is unsupported");
    m.def("stream_plan", &stream_plan,
          "(ok, rows_per_warp, vecs_per_row, outputs_per_pass, passes, splits, row_groups, chunks, chunks_per_cta,"
          " stages, smem_bytes, workspace_floats, counters, bulk) of the stream kernel",
          pybind11::arg("B"), pybind11::arg("Cin"), pybind11::arg("Cout"), pybind11::arg("L"), pybind11::arg("K"),
          pybind11::arg("elem_bytes"), pybind11::arg("knobs") = none, pybind11::arg("num_sms") = 132);
    m.def("tiled_plan", &tiled_plan,
          "(ok, tile, bm, bn, bk, tm, tn, threads, n_tiles, m_tiles, splits, k_steps, stages, smem_bytes,"
          " workspace_floats, counters, cache_policy, mma) of the tiled kernel",
          pybind11::arg("B"), pybind11::arg("Cin"), pybind11::arg("Cout"), pybind11::arg("L"), pybind11::arg("K"),
          pybind11::arg("knobs") = none, pybind11::arg("num_sms") = 132);
    m.def("default_knobs", &default_knobs, "the knob list a variant runs with ('stream' or 'optimized')");
}
