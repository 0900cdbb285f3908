"""Make .whl/ab_trace: a copy of kernels/gn_mish whose tier-3 kernel stamps %globaltimer per CTA into a __device__
array (read back by the binding's trace()), for gn_mish_trace_spread.py. Run from the repository root."""
import shutil
from pathlib import Path

src, d = Path("kernels/gn_mish"), Path(".whl/ab_trace")
d.mkdir(parents=True, exist_ok=True)
for f in [*src.glob("*.cu"), *src.glob("*.cuh"), *src.glob("*.cpp")]:
    shutil.copy(f, d / f.name)


def patch(name: str, pairs: list[tuple[str, str]]) -> None:
    p = d / name
    s = p.read_text()
    for old, new in pairs:
        assert s.count(old) == 1, (name, old)
        s = s.replace(old, new)
    p.write_text(s)


patch("gn_mish_spread.cuh", [
    ("namespace gn_mish::detail {\n", """namespace gn_mish::detail {

__device__ unsigned long long g_trace[256][48];
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
#define STAMP(i) (g_trace[blockIdx.x][(i)] = now_ns())
"""),
    ("  if (threadIdx.x == 0) {\n    for (int g = 0; g < a.t.num_groups; ++g) spread_bar_init",
     "  if (threadIdx.x == 0) STAMP(0);\n  if (threadIdx.x == 0) {\n    for (int g = 0; g < a.t.num_groups; ++g) spread_bar_init"),
    ("      for (int g = 0; g < min(a.depth, a.t.num_groups); ++g) request(g);\n",
     "      for (int g = 0; g < min(a.depth, a.t.num_groups); ++g) request(g);\n      STAMP(1);\n"),
    ("      spread_wait(&landed[g]);\n      if (lane == 0 && g + a.depth",
     "      spread_wait(&landed[g]);\n      if (lane == 0 && g < 8) STAMP(2 + g);\n      if (lane == 0 && g + a.depth"),
    ("      if (lane == 0) spread_publish(a, g, ctas, rank, mine);\n",
     "      if (lane == 0) spread_publish(a, g, ctas, rank, mine);\n"
     "      if (lane == 0 && g < 8) STAMP(10 + g);\n"),
    ("        spread_arrive(&ready[g]);\n      }", "        spread_arrive(&ready[g]);\n        if (g < 8) STAMP(18 + g);\n      }"),
    ("        if (lane == 0) atomicExch(departed, 0u);\n      }\n",
     "        if (lane == 0) atomicExch(departed, 0u);\n      }\n      if (lane == 0) STAMP(42);\n"),
    ("""    asm volatile("bar.sync 2, %0;" ::"r"(storers * kWarp) : "memory");\n  }""",
     """    asm volatile("bar.sync 2, %0;" ::"r"(storers * kWarp) : "memory");\n  }\n  if (sw == 0 && lane == 0) STAMP(43);"""),
    ("    spread_wait(&landed[g]);\n    const float2 st = stats[g];",
     "    spread_wait(&landed[g]);\n    if (sw == 0 && lane == 0 && g < 8) STAMP(26 + g);\n    const float2 st = stats[g];"),
    ("                                       af.beta_g, st.x, st.y);\n      }\n    }\n  }\n}",
     "                                       af.beta_g, st.x, st.y);\n      }\n    }\n"
     "    if (sw == 0 && lane == 0 && g < 8) STAMP(34 + g);\n  }\n}"),
])
patch("gn_mish.cu", [("cudaError_t check_limits(const Limits& limits)", """cudaError_t read_trace(void* host) {
  return cudaMemcpyFromSymbol(host, detail::g_trace, sizeof(detail::g_trace));
}

cudaError_t check_limits(const Limits& limits)""")])
patch("gn_mish_binding.cpp", [
    ("namespace {\n", """namespace gn_mish { cudaError_t read_trace(void* host); }
namespace {
torch::Tensor trace() {
  torch::Tensor t = torch::empty({256, 48}, torch::kInt64);
  TORCH_CHECK(gn_mish::read_trace(t.data_ptr()) == cudaSuccess, "trace");
  return t;
}
"""),
    ("""  m.def("plan", &plan,""", """  m.def("trace", &trace);\n  m.def("plan", &plan,"""),
])
print("made", d)
