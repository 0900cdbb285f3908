"""unet1d family: one forward of Diffusion Policy's ConditionalUnet1D, sample (B, T, input_dim) -> (B, T, input_dim).

Inputs (make_inputs): sample ~ N(0, 1) (B, T, input_dim); timestep (B,) int64 in [0, num_train_timesteps);
global_cond ~ N(0, 1) (B, global_cond_dim); obs (B, F) = W_g mish(global_cond) + b (_film.py: the once-per-
observation FiLM part, computed in float32 from the same weights); and a `Call` (_net.py: the weights, the
form, the table length). Case parameters: the config fields (_unet.UNetConfig) or `checkpoint: PATH`;
`weights_seed`; B; T (the horizon); `form` (plain | step); `num_train_timesteps`.
  plain: the module's forward(sample, timestep, global_cond), FiLM computed from the step encoder;
  step:  the denoising-step form: FiLM = table[timestep] + obs, no FiLM or step-encoder weights read.
Both compute the same function; the oracle is the float64 module on (sample, timestep, global_cond).
"""
from __future__ import annotations

import torch

import dpk
from dpk.tolerance import torch_dtype

from ._film import observe
from ._net import Call, case_config, find_net, get_net
from ._net import conv_bytes as _conv_bytes
from ._rounding import forward_tolerance

FORMS = ("plain", "step")


def _form(case: dpk.Case) -> str:
    form = case.get("form", "step")
    if form not in FORMS:
        raise ValueError(f"unet1d case {case.id}: form must be one of {FORMS}, got {form!r}")
    return form


def make_inputs(case: dpk.Case, device: torch.device) -> tuple:
    """(sample, timestep, global_cond, obs, call) on `device`, drawn from the case seed."""
    dt = torch_dtype(case.dtype)
    net = get_net(case.p, device, dt)
    cfg, B, T = net.config, int(case["B"]), int(case["T"])
    if T % cfg.horizon_multiple:
        raise ValueError(f"unet1d case {case.id}: T = {T} is not a multiple of 2^(levels-1) = {cfg.horizon_multiple}")
    num_t = int(case.get("num_train_timesteps", 100))
    g = torch.Generator().manual_seed(case.seed)
    sample = torch.randn(B, T, cfg.input_dim, generator=g).to(device, dt)
    timestep = torch.randint(0, num_t, (B,), generator=g).to(device)
    global_cond = torch.randn(B, cfg.global_cond_dim, generator=g).to(device, dt)
    obs = observe(net.module, global_cond, B).to(dt)
    return sample, timestep, global_cond, obs, Call(net, _form(case), num_t)


def tolerance(case: dpk.Case, compute: str) -> dpk.Tolerance:
    """Rounding error of the whole forward, from the computation (`_rounding.forward_tolerance`; NOTES.md)."""
    net = find_net(case.p)
    if net is None:
        net = get_net(case.p, torch.device("cpu"), torch_dtype(case.dtype))
    t_max = int(case.get("num_train_timesteps", 100)) if _form(case) == "plain" else 0
    return forward_tolerance(net.module, compute, case.dtype, t_max)


def work(case: dpk.Case) -> dpk.Work:
    """The floor's bytes: every parameter a step-form forward streams (convs + GroupNorm), read once."""
    cfg = case_config(case.p)
    B, L, k = int(case["B"]), int(case["T"]), cfg.kernel_size
    macs, dims = 0, (cfg.input_dim, *cfg.down_dims)
    for i in range(cfg.levels):  # down path of the step-form convs; the up path mirrors it: about 2x
        cin, cout = dims[i], dims[i + 1]
        macs += (cin * k + 3 * cout * k + (cin if cin != cout else 0)) * cout * L
        L = L // 2 if i < cfg.levels - 1 else L
    return dpk.Work(bytes=_conv_bytes(cfg, torch_dtype(case.dtype)), flops=2 * 2 * B * macs)


@dpk.family("unet1d", make_inputs=make_inputs, tolerance=tolerance, work=work,
            params=("checkpoint", "weights_seed", "num_train_timesteps", "T"))
def reference(sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor, obs: torch.Tensor,
              call: Call) -> torch.Tensor:
    """The float64 module on (sample, timestep, global_cond): both forms compute this function."""
    ref = call.net.reference_module()
    gc = global_cond if call.net.config.global_cond_dim else None
    with torch.no_grad():
        return ref(sample.to(torch.float64), timestep.to(torch.float64), gc)
