"""The weights a case runs on, built once per (config, weights, device, dtype) and shared by every variant.

A case names either a config (seeded weights, initialised as PyTorch initialises the modules: labelled
`random(seed)`) or a checkpoint (`checkpoint: PATH`, any of _checkpoint.py's formats: its config is inferred
and replaces the case's). `Net` keeps the module on the device, its float64 copy for the reference, the
denoising-step table, and each variant's prepared state (graphs, compiled module, kernel programs), so a
variant prepares once and every later call (parity, timing) reuses it.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dpk.lru import LRU

from ._film import step_film, step_table
from ._unet import ConditionalUnet1D, UNetConfig, build, conv_param_count

DTYPES = ("float32", "bfloat16")  # a net's weights (cases of dtype bfloat16: the bf16 net), for every variant
KEEP = 2  # nets kept alive (a Push-T image net is 1 GB in fp32 plus 2 GB for its float64 copy)
CONFIGS = 16  # checkpoint configs kept (each small; finding one reads the whole checkpoint)


@dataclass
class Net:
    config: UNetConfig
    module: ConditionalUnet1D
    weights: str  # "random(seed)" or "<format>:<file> sha256:<12 hex>"
    device: torch.device
    dtype: torch.dtype
    prepared: dict[Any, Any] = field(default_factory=dict)
    prepare_s: dict[Any, float] = field(default_factory=dict)
    _ref: ConditionalUnet1D | None = None
    _tables: dict[int, torch.Tensor] = field(default_factory=dict)

    def reference_module(self) -> ConditionalUnet1D:
        """A float64 copy of the weights as the variants hold them (bf16 weights upcast exactly)."""
        if self._ref is None:
            ref = ConditionalUnet1D(self.config).to(self.device, torch.float64)
            ref.load_state_dict({k: v.to(torch.float64) for k, v in self.module.state_dict().items()})
            self._ref = ref.eval()
        return self._ref

    def table(self, num_t: int) -> torch.Tensor:
        """(num_t, F) float32 FiLM table of the denoising-step form (from the float64 weights)."""
        if num_t not in self._tables:
            self._tables[num_t] = step_table(self.reference_module(), num_t).float()
        return self._tables[num_t]

    def prepare(self, key: Any, make: Callable[[], Any]) -> Any:
        """A variant's state for `key`, made once; the time it took is in `prepare_s[key]`."""
        if key not in self.prepared:
            t0 = time.perf_counter()
            self.prepared[key] = make()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.prepare_s[key] = time.perf_counter() - t0
        return self.prepared[key]

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())


@dataclass(frozen=True)
class Call:
    """The non-tensor input of every variant: which net, which form of the forward, which schedule length."""

    net: Net
    form: str  # "plain": FiLM from (timestep, global_cond); "step": FiLM = table[t] + obs
    num_t: int  # table rows (the scheduler's num_train_timesteps)

    def __repr__(self) -> str:  # shown in error messages: keep it short
        return f"Call({self.net.weights}, {self.form}, num_t={self.num_t})"

    def torch_forward(self, module: torch.nn.Module, sample: torch.Tensor, timestep: torch.Tensor,
                      global_cond: torch.Tensor | None, obs: torch.Tensor) -> torch.Tensor:
        if self.form == "plain":
            return module(sample, timestep, global_cond)
        return module(sample, timestep, film=step_film(self.net.table(self.num_t), obs, timestep))


_nets: LRU[Net] = LRU(KEEP)


def weights_key(p: Mapping[str, Any]) -> tuple:
    """("random", seed) or ("checkpoint", path, size, mtime): a changed file is a different net."""
    if p.get("checkpoint"):
        path = Path(str(p["checkpoint"])).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        st = path.stat()
        return ("checkpoint", str(path), st.st_size, st.st_mtime_ns)
    return ("random", int(p.get("weights_seed", 0)))


def find_net(params: Mapping[str, Any]) -> Net | None:
    """A cached net of these parameters on any device and dtype (the tolerance reads its output layer)."""
    wkey = weights_key(params)
    for (cfg, w, _, _), net in reversed(_nets.items()):
        if w == wkey and (wkey[0] == "checkpoint" or cfg == UNetConfig.from_params(params)):
            return net
    return None


_configs: LRU[UNetConfig] = LRU(CONFIGS)


def case_config(params: Mapping[str, Any]) -> UNetConfig:
    """The config of a case: its fields, or its checkpoint's (read once per file version)."""
    wkey = weights_key(params)
    if wkey[0] != "checkpoint":
        return UNetConfig.from_params(params)
    from ._checkpoint import load_checkpoint

    return _configs.get_or_make(wkey, lambda: load_checkpoint(wkey[1]).config)


def get_net(params: Mapping[str, Any], device: torch.device, dtype: torch.dtype) -> Net:
    """The net of a case's parameters on `device` in `dtype`, cached."""
    if device.type == "cuda" and device.index is None:  # tensors report cuda:N
        device = torch.device("cuda", torch.cuda.current_device())
    wkey = weights_key(params)
    cfg = None if wkey[0] == "checkpoint" else UNetConfig.from_params(params)
    return _nets.get_or_make((cfg, wkey, str(device), dtype), lambda: _make_net(params, cfg, wkey, device, dtype))


def _make_net(params: Mapping[str, Any], cfg: UNetConfig | None, wkey: tuple, device: torch.device,
              dtype: torch.dtype) -> Net:
    if wkey[0] == "checkpoint":
        from ._checkpoint import load_checkpoint

        loaded = load_checkpoint(str(params["checkpoint"]))
        cfg = loaded.config
        module = ConditionalUnet1D(cfg)
        module.load_state_dict(loaded.state_dict, strict=True)
        label = f"{loaded.source}:{loaded.weights} sha256:{loaded.sha256[:12]}"
    else:
        module = build(cfg, wkey[1])
        label = f"random({wkey[1]})"
    module = module.to(device, dtype).eval()
    module.requires_grad_(False)
    module.nvtx_ranges = True
    return Net(cfg, module, label, device, dtype)


RECOMPILE_LIMIT = 64  # compiled graphs per code object (torch's default: 8)


def compile_reduce_overhead(fn: Callable) -> Callable:
    """torch.compile(fn, mode="reduce-overhead"), as LeRobot's compile_model. Every net (config, form, dtype) compiles
    the module's shared code objects again: past torch's default of 8 graphs per code object, later cases of one
    process would run eager without a word, so the limit is raised."""
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 16 * RECOMPILE_LIMIT)
    return torch.compile(fn, mode="reduce-overhead")


def conv_bytes(cfg: UNetConfig, dtype: torch.dtype) -> int:
    """Bytes of every parameter a step-form forward streams (convs, biases, GroupNorm affines)."""
    with torch.device("meta"):
        n = conv_param_count(ConditionalUnet1D(cfg))
    return n * torch.empty((), dtype=dtype).element_size()
