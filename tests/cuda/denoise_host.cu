// Host program of tests/test_denoise.py (host_kernel fixture): denoise.cu's __host__ __device__ step_element and
// philox_normal4 compiled for the CPU (no GPU needed), run on the inputs of one step read from argv[1]; the test
// compares the outputs with the float64 reference, the float32 emulation and the Python Philox (_philox.py).
#include "denoise.cu"
#include <cstdio>
#include <vector>
int main(int argc, char** argv) {  // in: n, row[8], seed, offset, step, eps[n], x[n], z[n]; out: y[n], normals[n]
  FILE* f = fopen(argv[1], "rb");
  int64_t n, step; uint64_t seed, offset; float c[8];
  if (fread(&n, 8, 1, f) != 1 || fread(c, 4, 8, f) != 8 || fread(&seed, 8, 1, f) != 1 ||
      fread(&offset, 8, 1, f) != 1 || fread(&step, 8, 1, f) != 1) return 1;
  std::vector<float> e(n), x(n), z(n), y(n), w(n);
  if (fread(e.data(), 4, n, f) != (size_t)n || fread(x.data(), 4, n, f) != (size_t)n ||
      fread(z.data(), 4, n, f) != (size_t)n) return 1;
  const Row r{c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
  for (int64_t j = 0; j < n; ++j)
    y[j] = step_element(r, e[j], x[j], z[j], r.c_x != 0.f, r.c_eps != 0.f, r.sigma != 0.f);
  for (int64_t g = 0; 4 * g < n; ++g) {
    const float4 v = philox_normal4(seed, offset, step, g);
    for (int k = 0; k < 4 && 4 * g + k < n; ++k) w[4 * g + k] = lane(v, k);
  }
  FILE* o = fopen(argv[2], "wb");
  fwrite(y.data(), 4, n, o);
  fwrite(w.data(), 4, n, o);
  return fclose(o);
}
