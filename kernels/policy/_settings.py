"""A trained policy's sampling settings, read from its checkpoint: scheduler, steps, horizon, executed steps.

diffusion_policy .ckpt: cfg.policy.noise_scheduler (diffusers' DDPMScheduler / DDIMScheduler arguments),
cfg.policy.num_inference_steps (null: as many as training steps), cfg.horizon, cfg.n_obs_steps,
cfg.n_action_steps. LeRobot folder: config.json's noise_scheduler_type (DDPM | DDIM), num_train_timesteps,
beta_schedule, beta_start, beta_end, clip_sample, clip_sample_range, prediction_type, num_inference_steps,
horizon, n_obs_steps, n_action_steps. A plain state dict holds none of them: the caller's (or the defaults).
Both upstream and LeRobot execute actions n_obs_steps - 1 .. n_obs_steps - 1 + n_action_steps of the chunk, but
upstream's DiffusionUnetLowdimPolicy starts at n_obs_steps unless cfg.policy.oa_step_convention (Push-T's sets it).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..unet1d import _checkpoint_pickle as unpickle
from ..unet1d._checkpoint import _cfg_get, _torch_load
from ._observation_formats import DP_LOWDIM_POLICY

SCHEDULER_KEYS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "clip_sample",
                  "clip_sample_range", "prediction_type", "steps_offset", "set_alpha_to_one")
LOOP_KEYS = ("num_inference_steps", "horizon", "n_obs_steps", "n_action_steps")
TRAINING = {"num_train_timesteps": 100, "beta_schedule": "squaredcos_cap_v2", "clip_sample": True}  # Push-T's
PRESETS = {  # suites/policy.yaml's samplers, over the checkpoint's training schedule
    "ddpm100": {"scheduler": "ddpm", "num_inference_steps": 100},
    "ddim16": {"scheduler": "ddim", "num_inference_steps": 16, "eta": 0.0},
}


def checkpoint_settings(path: str | Path) -> dict[str, Any]:
    """The settings the checkpoint stores (keys of SCHEDULER_KEYS, LOOP_KEYS and `scheduler`); {} for none."""
    path = Path(path)
    if path.is_dir():
        cfg = json.loads((path / "config.json").read_text())
        out = {k: cfg[k] for k in (*SCHEDULER_KEYS, *LOOP_KEYS) if cfg.get(k) is not None}
        kind = str(cfg.get("noise_scheduler_type", "")).lower()
    elif path.suffix == ".ckpt":
        obj = _torch_load(path, [])
        cfg = unpickle.plain(obj.get("cfg")) if isinstance(obj, dict) else None
        if cfg is None:
            return {}
        sched = _cfg_get(cfg, "policy.noise_scheduler") or {}
        out = {k: sched[k] for k in SCHEDULER_KEYS if isinstance(sched, dict) and sched.get(k) is not None}
        for k in LOOP_KEYS:
            value = _cfg_get(cfg, f"policy.{k}") if k == "num_inference_steps" else _cfg_get(cfg, k)
            if value is not None:
                out[k] = value
        kind = str(sched.get("_target_", "")).rsplit(".", 1)[-1].lower() if isinstance(sched, dict) else ""
        if _cfg_get(cfg, "policy._target_") == DP_LOWDIM_POLICY:  # its class default: False
            out["oa_step_convention"] = bool(_cfg_get(cfg, "policy.oa_step_convention"))
    else:
        return {}
    if kind:
        out["scheduler"] = "ddim" if "ddim" in kind else "ddpm" if "ddpm" in kind else kind
    return out


def sampling_settings(stored: dict[str, Any], scheduler: str | dict[str, Any] | None) -> dict[str, Any]:
    """The schedule to run: the checkpoint's training schedule (Push-T's where it says nothing) with its own
    sampler (`scheduler` None; DDPM over every training step where it names none), a preset's, or a dict's."""
    train = TRAINING | {k: v for k, v in stored.items() if k in SCHEDULER_KEYS}
    if scheduler is None:
        steps = stored.get("num_inference_steps") or train["num_train_timesteps"]
        return train | {"scheduler": stored.get("scheduler", "ddpm"), "num_inference_steps": steps}
    if isinstance(scheduler, str):
        if scheduler not in PRESETS:
            raise ValueError(f"unknown scheduler preset {scheduler!r}; presets: {', '.join(PRESETS)}, or pass a dict")
        scheduler = PRESETS[scheduler]
    return train | dict(scheduler)


def executed_steps(stored: dict[str, Any], horizon: int) -> slice:
    """The chunk's steps a robot executes (all of them when the checkpoint does not say)."""
    n_obs, n_act = stored.get("n_obs_steps"), stored.get("n_action_steps")
    if not (isinstance(n_obs, int) and isinstance(n_act, int)):
        return slice(0, horizon)
    start = n_obs - 1 if stored.get("oa_step_convention", True) else n_obs
    return slice(start, min(horizon, start + n_act))
