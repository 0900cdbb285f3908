"""Every module-level cache a long-running process fills per schedule, config, shape, encoder or case is bounded
(dpk.lru.LRU): each is swapped for an LRU of 2 and fed three keys; two must be left, a repeat reused."""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dpk import registry
from dpk.lru import LRU
from dpk.runner import Session

from ._helpers import ROOT

REG = registry.load([ROOT / "kernels"], strict=True)
SCHEDULE = importlib.import_module("dpk.families.denoise._schedule")
STEPS = importlib.import_module("dpk.families.denoise._steps")
NET = importlib.import_module("dpk.families.unet1d._net")
UNET = importlib.import_module("dpk.families.unet1d._unet")
POLICY = importlib.import_module("dpk.families.policy.reference")
ENCODING = importlib.import_module("dpk.families.policy._encoding")
GN_MISH = importlib.import_module("dpk.families.gn_mish.torch_variants")
CPU = torch.device("cpu")


def _schedule(n: int):
    return SCHEDULE.Schedule.from_params({"scheduler": "ddim", "num_train_timesteps": 100, "num_inference_steps": n})


def _checkpoints(tmp_path: Path, monkeypatch) -> list[Path]:
    """Three files whose loading returns a config of its own (the loader counted, not run)."""
    made = []

    def fake_load(path):
        made.append(path)
        return SimpleNamespace(config=UNET.UNetConfig.from_params({"input_dim": 2, "global_cond_dim": len(made)}))
    # the loader as case_config imports it at call time (a later registry load may have re-imported the module)
    monkeypatch.setattr(importlib.import_module(f"{NET.__package__}._checkpoint"), "load_checkpoint", fake_load)
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"w{i}.pt")
        paths[-1].write_bytes(bytes([i]))
    return paths


def _policy_cases() -> list:
    case = Session(strict=True, device=CPU).find_case("policy", "tiny_k3_b1_ddim16.fp32", "smoke")
    return [dataclasses.replace(case, params=tuple((dict(case.params) | {"weights_seed": s}).items()))
            for s in range(3)]


CACHES = ["device_tables", "schedulers", "unet1d_configs", "policy_oracle", "policy_encoders", "gn_mish_compiled"]


@pytest.mark.parametrize("cache", CACHES)
def test_module_caches_are_bounded(cache, tmp_path, monkeypatch):
    if cache == "device_tables":
        module, name, keys = SCHEDULE, "_device_tables", [_schedule(n) for n in (4, 5, 10)]
        def use(k):
            return SCHEDULE.device_table(k, CPU)
    elif cache == "schedulers":
        pytest.importorskip("diffusers")
        module, name, keys = STEPS, "_schedulers", [_schedule(n) for n in (4, 5, 10)]
        use = STEPS.scheduler_for
    elif cache == "unet1d_configs":
        module, name, keys = NET, "_configs", _checkpoints(tmp_path, monkeypatch)
        def use(k):
            return NET.case_config({"checkpoint": str(k)})
    elif cache == "policy_oracle":
        module, name, keys = POLICY, "_clean", _policy_cases()
        monkeypatch.setattr(POLICY, "loop64", lambda chunk, *inputs: object())
        monkeypatch.setattr(POLICY, "propagated_tolerance", lambda chunk, inputs, clean, *rest: clean)
        def use(k):
            return POLICY.tolerance(k, "float32")
    elif cache == "policy_encoders":  # ResNet-18s on the meta device (the work model's), one per seed
        module, name, keys = ENCODING, "_encoders", [0, 1, 2]
        def use(k):
            return ENCODING.encoder_for({"encoder": "resnet18_gn", "weights_seed": k}, 1028, None)
    else:
        module, name, keys = GN_MISH, "_compiled", [(1, 8, L) for L in (3, 4, 5)]
        def use(k):
            x = torch.randn(*k)
            GN_MISH.compiled_gn_mish(x, torch.ones(k[1]), torch.zeros(k[1]), 4, 1e-5, backend="eager")
            return next(reversed(GN_MISH._compiled.values()))
    monkeypatch.setattr(module, name, LRU(2))
    first = [use(k) for k in keys]
    kept = getattr(module, name)
    assert len(kept) == 2, f"{name} keeps {len(kept)} entries, not its bound"
    assert use(keys[2]) is first[2], f"{name} remade an entry it holds"
