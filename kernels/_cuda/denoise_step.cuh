// denoise_step.cuh: one DDPM/DDIM scheduler step on one element, from the step's constants row: the denoise
// family's kernel runs it over a whole sample; unet1d's last op runs it on the outputs it stores, so that a
// denoising loop needs no launch of its own per step.
//
//   x0  = clip((x - b*eps) / a, -r, r)
//   out = c_x0 * x0 + c_x * x + c_eps * eps + sigma * z
//
// A row holds the 8 float32 columns of kernels/denoise/_schedule.py (-b, a, c_x0, c_x, c_eps, sigma, clip, t):
// diffusers' own float32 scalars of one inference step. Terms whose coefficient is 0 are skipped (use_*: uniform
// over a launch).
#pragma once

namespace dpk_denoise {

struct Row {
    float neg_b, a, c_x0, c_x, c_eps, sigma, clip, t;
};

__host__ __device__ __forceinline__ float step_element(const Row& r, float e, float x, float z, bool use_x,
                                                       bool use_eps, bool use_z) {
    const float num = fmaf(r.neg_b, e, x);  // x - b*eps rounded once: no product rounding for 1/a to amplify
    float x0 = num / r.a;                    // IEEE division (no fast-math): the reference's x0, rounded once
    x0 = x0 < -r.clip ? -r.clip : (x0 > r.clip ? r.clip : x0);  // comparisons keep NaN, like torch.clamp
    float out = r.c_x0 * x0;
    if (use_x) out = fmaf(r.c_x, x, out);
    if (use_eps) out = fmaf(r.c_eps, e, out);
    if (use_z) out = fmaf(r.sigma, z, out);
    return out;
}

}  // namespace dpk_denoise
