// denoise.cu: one DDPM/DDIM scheduler step x_{t-1} = step(eps, x_t, z) in one launch, any shape.
//
//   x0  = clip((x - b*eps) / a, -r, r)
//   out = c_x0 * x0 + c_x * x + c_eps * eps + sigma * z
//
// eps, x, z, out: n contiguous float32 (any B x T x D flattened). `table`: N rows of 8 float32 (columns of
// _schedule.py: -b, a, c_x0, c_x, c_eps, sigma, clip, t), one row per inference step: diffusers' own float32
// scalars, built once per schedule on the host. `step`: the inference-step index, read from device memory so the
// launch can sit in a CUDA graph and be advanced there; an index outside [0, N) makes every output NaN.
//
// Mapping: one thread per group of 4 consecutive elements (grid-stride loop); a float4 load/store per
// tensor when all pointers are 16-byte aligned and the group is full, scalar accesses otherwise. The row is
// the same for every thread (a broadcast __ldg). Terms whose coefficient is 0 for this step are skipped with
// uniform branches (no z traffic on noise-free steps: DDPM t = 0, DDIM eta = 0).
//
// Noise: NOISE_TENSOR reads z (element-for-element the z diffusers draws); NOISE_PHILOX draws it in the
// kernel from Philox4x32-10 (key = seed, counter = (group, step, offset_lo, offset_hi)) and Box-Muller,
// seed/offset read from device memory, so a whole denoising loop can be captured. philox_normal_kernel
// writes the same normals to memory (tests compare them with a Python reimplementation of the stream).
// step_element and philox_normal4 are __host__ __device__: tests/cuda/denoise_host.cu runs them on the CPU (no
// GPU needed) and tests/test_denoise.py checks them against the float64 reference and the Python Philox.
//
// Versus the seed's part-7 kernel: any shape and batch (not 1 x 2 x 16), any schedule (prev_t from the
// schedule, not t - 1), DDIM, noise in the sample's own layout, x - b*eps with one rounding (fma): at t = 99 of
// Push-T 1/a = 2029 amplifies the rounding of a separate product b*eps (see NOTES.md).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxBlocks = 8192;  // grid-stride beyond this (8192 * 256 * 4 = 8M elements per sweep)
enum NoiseMode { NOISE_TENSOR = 0, NOISE_PHILOX = 1 };

struct Row {
  float neg_b, a, c_x0, c_x, c_eps, sigma, clip, t;
};

__device__ __forceinline__ Row load_row(const float4* __restrict__ table, const int64_t* __restrict__ step,
                                        int num_steps) {
  const int64_t i = __ldg(step);
  if (i < 0 || i >= num_steps) {
    const float q = __int_as_float(0x7fffffff);  // NaN everywhere: a bad step shows, never another step's answer
    return Row{q, q, q, q, q, q, q, q};
  }
  const float4 a = __ldg(table + 2 * i), b = __ldg(table + 2 * i + 1);
  return Row{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
}

__host__ __device__ __forceinline__ float step_element(const Row& r, float e, float x, float z, bool use_x, bool use_eps,
                                              bool use_z) {
  const float num = fmaf(r.neg_b, e, x);  // x - b*eps rounded once: no product rounding for 1/a to amplify
  float x0 = num / r.a;                    // IEEE division (no fast-math): the reference's x0, rounded once
  x0 = x0 < -r.clip ? -r.clip : (x0 > r.clip ? r.clip : x0);  // comparisons keep NaN, like torch.clamp
  float out = r.c_x0 * x0;
  if (use_x) out = fmaf(r.c_x, x, out);
  if (use_eps) out = fmaf(r.c_eps, e, out);
  if (use_z) out = fmaf(r.sigma, z, out);
  return out;
}

// ---- Philox4x32-10 (Salmon et al., SC'11; the Random123 / cuRAND constants) ----------------------------
struct U4 {
  uint32_t x, y, z, w;
};

__host__ __device__ inline uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

__host__ __device__ inline U4 philox4x32_10(U4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = mulhi32(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = U4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// Four standard normals for group g: two Box-Muller pairs from 24-bit uniforms u1 in (0, 1], u2 in [0, 1)
// (exact in float32, so a float64 reimplementation sees the same uniforms).
__host__ __device__ __forceinline__ float4 philox_normal4(uint64_t seed, uint64_t offset, int64_t step, int64_t g) {
  const U4 r = philox4x32_10(U4{static_cast<uint32_t>(g), static_cast<uint32_t>(step),
                                static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                             static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const float scale = 5.9604644775390625e-08f;  // 2^-24
  float s0, c0, s1, c1;
  const float rad0 = sqrtf(-2.0f * logf(static_cast<float>((r.x >> 8) + 1u) * scale));
  const float rad1 = sqrtf(-2.0f * logf(static_cast<float>((r.z >> 8) + 1u) * scale));
  sincospif(2.0f * static_cast<float>(r.y >> 8) * scale, &s0, &c0);
  sincospif(2.0f * static_cast<float>(r.w >> 8) * scale, &s1, &c1);
  return make_float4(rad0 * c0, rad0 * s0, rad1 * c1, rad1 * s1);
}

__host__ __device__ __forceinline__ float lane(const float4& v, int k) {
  return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
}

template <int MODE, bool VEC>
__global__ void __launch_bounds__(kMaxThreads)
denoise_step_kernel(const float* __restrict__ eps,     // (n,)
                    const float* __restrict__ x,       // (n,)
                    const float* __restrict__ z,       // (n,) NOISE_TENSOR only
                    const float4* __restrict__ table,  // (N, 2) float4 = (N, 8) float
                    const int64_t* __restrict__ step,  // ()  inference-step index
                    int num_steps,
                    const int64_t* __restrict__ seed_offset,  // (2,) NOISE_PHILOX only: seed, offset
                    float* __restrict__ out,                  // (n,)
                    int64_t n) {
  const Row r = load_row(table, step, num_steps);
  const bool use_x = r.c_x != 0.0f, use_eps = r.c_eps != 0.0f, use_z = r.sigma != 0.0f;  // NaN row: all true
  uint64_t seed = 0, offset = 0;
  int64_t step_index = 0;
  if (MODE == NOISE_PHILOX && use_z) {
    seed = static_cast<uint64_t>(__ldg(seed_offset));
    offset = static_cast<uint64_t>(__ldg(seed_offset + 1));
    step_index = __ldg(step);
  }
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = 4 * g;
    float4 zz = make_float4(0.f, 0.f, 0.f, 0.f);
    if (MODE == NOISE_PHILOX && use_z) zz = philox_normal4(seed, offset, step_index, g);
    if (VEC && base + 4 <= n) {
      const float4 e = __ldg(reinterpret_cast<const float4*>(eps) + g);
      const float4 xv = __ldg(reinterpret_cast<const float4*>(x) + g);
      if (MODE == NOISE_TENSOR && use_z) zz = __ldg(reinterpret_cast<const float4*>(z) + g);
      float4 o;
      o.x = step_element(r, e.x, xv.x, zz.x, use_x, use_eps, use_z);
      o.y = step_element(r, e.y, xv.y, zz.y, use_x, use_eps, use_z);
      o.z = step_element(r, e.z, xv.z, zz.z, use_x, use_eps, use_z);
      o.w = step_element(r, e.w, xv.w, zz.w, use_x, use_eps, use_z);
      reinterpret_cast<float4*>(out)[g] = o;
    } else {
      for (int k = 0; k < 4 && base + k < n; ++k) {
        const int64_t j = base + k;
        const float zj = MODE == NOISE_TENSOR ? (use_z ? __ldg(z + j) : 0.0f) : lane(zz, k);
        out[j] = step_element(r, __ldg(eps + j), __ldg(x + j), zj, use_x, use_eps, use_z);
      }
    }
  }
}

__global__ void __launch_bounds__(kMaxThreads)
philox_normal_kernel(const int64_t* __restrict__ step,         // ()
                     const int64_t* __restrict__ seed_offset,  // (2,)
                     float* __restrict__ z,                    // (n,)
                     int64_t n) {
  const uint64_t seed = static_cast<uint64_t>(__ldg(seed_offset));
  const uint64_t offset = static_cast<uint64_t>(__ldg(seed_offset + 1));
  const int64_t step_index = __ldg(step);
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = philox_normal4(seed, offset, step_index, g);
    for (int k = 0; k < 4 && 4 * g + k < n; ++k) z[4 * g + k] = lane(v, k);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline void launch_shape(int64_t n, dim3* grid, dim3* block) {
  const int64_t groups = (n + 3) / 4;
  int threads = static_cast<int>(((groups + 31) / 32) * 32);  // tiny samples: one warp, not 256 idle threads
  threads = threads > kMaxThreads ? kMaxThreads : threads;
  int64_t blocks = (groups + threads - 1) / threads;
  *block = dim3(threads);
  *grid = dim3(static_cast<unsigned>(blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

template <int MODE>
cudaError_t launch(const float* eps, const float* x, const float* z, const float* table, const int64_t* step,
                   int num_steps, const int64_t* seed_offset, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0 || num_steps <= 0) return cudaErrorInvalidValue;
  dim3 grid, block;
  launch_shape(n, &grid, &block);
  const float4* table4 = reinterpret_cast<const float4*>(table);
  const bool vec = aligned16(eps) && aligned16(x) && aligned16(out) && (MODE != NOISE_TENSOR || aligned16(z));
  if (vec)
    denoise_step_kernel<MODE, true><<<grid, block, 0, stream>>>(eps, x, z, table4, step, num_steps, seed_offset,
                                                                out, n);
  else
    denoise_step_kernel<MODE, false><<<grid, block, 0, stream>>>(eps, x, z, table4, step, num_steps, seed_offset,
                                                                 out, n);
  return cudaGetLastError();
}

}  // namespace

// Launchers (no torch types): table must be 16-byte aligned, all pointers on the current device.
cudaError_t denoise_step_launch(const float* eps, const float* x, const float* z, const float* table,
                                const int64_t* step, int num_steps, float* out, int64_t n, cudaStream_t stream) {
  return launch<NOISE_TENSOR>(eps, x, z, table, step, num_steps, nullptr, out, n, stream);
}

cudaError_t denoise_step_philox_launch(const float* eps, const float* x, const float* table, const int64_t* step,
                                       int num_steps, const int64_t* seed_offset, float* out, int64_t n,
                                       cudaStream_t stream) {
  return launch<NOISE_PHILOX>(eps, x, nullptr, table, step, num_steps, seed_offset, out, n, stream);
}

cudaError_t philox_normal_launch(const int64_t* step, const int64_t* seed_offset, float* z, int64_t n,
                                 cudaStream_t stream) {
  if (n <= 0) return cudaErrorInvalidValue;
  dim3 grid, block;
  launch_shape(n, &grid, &block);
  philox_normal_kernel<<<grid, block, 0, stream>>>(step, seed_offset, z, n);
  return cudaGetLastError();
}
