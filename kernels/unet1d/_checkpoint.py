"""Load a trained ConditionalUnet1D's weights and config from any of its checkpoint layouts (_checkpoint_formats.py).

    loaded = load_checkpoint("latest.ckpt")            # or .pt/.pth/.safetensors, or a LeRobot folder
    unet = ConditionalUnet1D(loaded.config); unet.load_state_dict(loaded.state_dict)   # strict: checked already

Every layout ends in the same steps: find the U-Net's keys (the prefix before `final_conv.1.weight`), rename
LeRobot's names to upstream ones, read the config from the tensor shapes (`infer_config`) cross-checked against
what the file stores (cfg.policy, config.json; a disagreement is an error naming both values), then compare the
keys and shapes with ConditionalUnet1D(config) (`check_state_dict`). n_groups is the one setting no shape shows:
it comes from the file or `hints`, else 8 (upstream's default) with a note.

A diffusion_policy .ckpt is a pickle that refers to omegaconf and dill; it loads without diffusion_policy, omegaconf
or dill: the unpickler imports only torch, numpy, omegaconf (when installed) and a few standard modules, and puts
an inert stand-in in place of any other class, so the tensors load and the cfg is read from its pickled
structure. Files are read with torch.load(weights_only=True) first; only a payload that needs more is unpickled
this way, and (like any pickle) only files you trust should be loaded.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pickle
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from . import _checkpoint_formats as fmt
from . import _checkpoint_pickle as _unpickle
from ._unet import ConditionalUnet1D, UNetConfig

SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors")
ANCHOR = "final_conv.1.weight"  # the last layer: its prefix locates the U-Net inside a larger state dict
SHOWN = 10  # keys listed per kind of mismatch


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a ConditionalUnet1D; the message names the file and the problem."""


@dataclass
class Loaded:
    config: UNetConfig
    state_dict: dict[str, torch.Tensor]  # upstream key names, float32, CPU
    source: str  # "state_dict" | "diffusion_policy" | "lerobot"
    weights: str  # "ema_model" / "model" for a diffusion_policy .ckpt, else the weights file's name
    sha256: str  # of the file read (a LeRobot folder: of model.safetensors; config.json's is in the notes)
    notes: list[str] = field(default_factory=list)


def load_checkpoint(path: str | Path, prefer_ema: bool = True, hints: dict[str, Any] | None = None) -> Loaded:
    """Read a U-Net from `path`; `hints` (UNetConfig fields, e.g. {"n_groups": 4}) fill what the file lacks."""
    path, notes, given = Path(path), [], {}
    for name, value in (hints or {}).items():
        if name not in {f.name for f in fields(UNetConfig)}:
            raise CheckpointError(f"{path}: unknown config field in hints: {name!r}")
        given[name] = _hint_value(name, value)
        if given[name] is None:
            raise CheckpointError(f"{path}: hints give {name}={value!r}, not a valid value")
    if path.is_dir():
        sd, stored, origin, weights = _read_lerobot(path, notes)
        source, sha = "lerobot", _sha256(path / "model.safetensors")
        notes.append(f"config.json sha256 {_sha256(path / 'config.json')}")
    elif not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    elif path.suffix not in SUFFIXES:
        raise CheckpointError(f"{path}: unknown extension {path.suffix!r}; expected one of {', '.join(SUFFIXES)} "
                              "or a LeRobot folder (config.json + model.safetensors)")
    else:
        source, sha, weights, stored, origin = "state_dict", _sha256(path), path.name, {}, "hints"
        if path.suffix == ".safetensors":
            sd = _read_safetensors(path)
        else:
            sd, stored, source, weights = _read_torch(path, prefer_ema, notes)
            origin = "the checkpoint's cfg"
    if stored:
        notes.append(f"{origin} gives {', '.join(sorted(stored))}")
    for name, value in given.items():
        if name in stored and stored[name] != value:
            raise CheckpointError(f"{path}: hints give {name}={value!r} but {origin} says {stored[name]!r}")
        stored[name] = value
    sd = _unet_part(sd, path, notes)
    try:
        config, more = infer_config(sd, stored, origin=origin)
        check_state_dict(config, sd)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return Loaded(config, sd, source, weights, sha, notes + more)


def infer_config(state_dict: dict[str, torch.Tensor], hints: dict[str, Any] | None = None,
                 origin: str = "hints") -> tuple[UNetConfig, list[str]]:
    """UNetConfig from tensor shapes (upstream names); `hints` must agree with them and supply n_groups."""
    sd, hints, notes = state_dict, dict(hints or {}), []
    if "down_dims" in hints:
        hints["down_dims"] = tuple(hints["down_dims"])
    unknown = sorted(set(hints) - {f.name for f in fields(UNetConfig)})
    if unknown:
        raise CheckpointError(f"unknown config fields in {origin}: {unknown}")
    if any(k.startswith("local_cond_encoder.") for k in sd):
        raise CheckpointError("local conditioning (local_cond_encoder.*) is not supported by ConditionalUnet1D")

    def shape(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise CheckpointError(f"cannot infer the config: {key!r} is missing ({len(sd)} U-Net keys)")
        return tuple(sd[key].shape)

    first = shape("down_modules.0.0.blocks.0.block.0.weight")  # (down_dims[0], input_dim, kernel_size)
    down_dims = []
    while f"down_modules.{len(down_dims)}.0.blocks.0.block.0.weight" in sd:
        down_dims.append(shape(f"down_modules.{len(down_dims)}.0.blocks.0.block.0.weight")[0])
    cond_out, cond_in = shape("down_modules.0.0.cond_encoder.1.weight")  # (C or 2C, dsed + global_cond_dim)
    dsed = shape("diffusion_step_encoder.1.weight")[1]  # Linear(dsed, 4 dsed)
    if cond_out not in (down_dims[0], 2 * down_dims[0]) or cond_in < dsed:
        raise CheckpointError(f"down_modules.0.0.cond_encoder.1.weight has shape {(cond_out, cond_in)}: expected "
                              f"({down_dims[0]} or {2 * down_dims[0]}, >= {dsed})")
    found = {"input_dim": shape(ANCHOR)[0], "global_cond_dim": cond_in - dsed, "diffusion_step_embed_dim": dsed,
             "down_dims": tuple(down_dims), "kernel_size": first[-1], "cond_predict_scale": cond_out != down_dims[0]}
    for name, value in found.items():
        if name in hints and hints[name] != value:
            raise CheckpointError(f"{origin} says {name}={hints[name]!r} but the tensor shapes say {value!r}")
    n_groups = hints.get("n_groups")
    if n_groups is None:
        n_groups = 8
        notes.append("n_groups not stored: assumed 8 (upstream's default); pass hints={'n_groups': G} if not")
    bad = [c for c in down_dims if c % n_groups]
    if bad:
        raise CheckpointError(f"n_groups={n_groups} does not divide the channel counts {bad} of down_dims {down_dims}")
    if down_dims[0] % 8:
        raise CheckpointError(f"down_dims[0]={down_dims[0]} is not a multiple of 8 (the final Conv1dBlock's groups)")
    return UNetConfig(n_groups=n_groups, **found), notes


def check_state_dict(config: UNetConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise CheckpointError listing the missing, unexpected and misshaped keys against ConditionalUnet1D(config)."""
    ref = _reference_shapes(config)
    problems = {
        "missing": [k for k in ref if k not in state_dict],
        "unexpected": [k for k in state_dict if k not in ref],
        "misshaped": [f"{k} (expected {ref[k]}, found {tuple(state_dict[k].shape)})"
                      for k in ref if k in state_dict and tuple(state_dict[k].shape) != ref[k]],
    }
    if any(problems.values()):
        lines = [f"  {kind} ({len(keys)}): {', '.join(keys[:SHOWN])}" + (" ..." if len(keys) > SHOWN else "")
                 for kind, keys in problems.items() if keys]
        raise CheckpointError(f"state dict does not fit ConditionalUnet1D({config}):\n" + "\n".join(lines))


@functools.lru_cache(maxsize=16)
def _reference_shapes(config: UNetConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return {k: tuple(v.shape) for k, v in ConditionalUnet1D(config).state_dict().items()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as e:
        raise CheckpointError(f"{path}: reading .safetensors needs the safetensors package") from e
    try:
        return load_file(str(path), device="cpu")
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def _read_torch(path: Path, prefer_ema: bool, notes: list[str]) -> tuple[dict, dict, str, str]:
    obj = _torch_load(path, notes)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a dict of tensors")
    if "state_dicts" in obj:  # diffusion_policy's BaseWorkspace.save_checkpoint payload
        sds = obj["state_dicts"]
        weights = "ema_model" if prefer_ema and "ema_model" in sds else "model"
        if weights not in sds:
            raise CheckpointError(f"{path}: state_dicts has no 'model' or 'ema_model' (has {sorted(sds)})")
        if prefer_ema and weights == "model":
            notes.append("no ema_model in state_dicts (training ran without EMA): loaded model")
        return sds[weights], _cfg_hints(obj.get("cfg"), notes), "diffusion_policy", weights
    if "state_dict" in obj:  # {"state_dict": sd}: a wrapped state dict, or a Lightning checkpoint
        return obj["state_dict"], {}, "state_dict", path.name
    if path.suffix == ".ckpt":
        raise CheckpointError(f"{path}: a .ckpt without 'state_dicts' (diffusion_policy) or 'state_dict' "
                              f"(Lightning); top-level keys: {sorted(map(str, obj))[:SHOWN]}")
    return obj, {}, "state_dict", path.name


def _torch_load(path: Path, notes: list[str]) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        pass  # holds more than tensors and containers (an OmegaConf cfg, dill-pickled bytes): the permissive route
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read by torch.load ({type(e).__name__}: {e})") from None
    try:
        obj, missing = _unpickle.load_permissive(path)
    except Exception as e:  # not a torch file at all, or a payload even stand-ins cannot rebuild
        raise CheckpointError(f"{path}: cannot be read by torch.load ({type(e).__name__}: {e})") from None
    if missing:
        notes.append(f"stand-ins for the classes it does not import: {', '.join(sorted(missing))}")
    return obj


def _read_lerobot(folder: Path, notes: list[str]) -> tuple[dict, dict, str, str]:
    absent = [name for name in ("config.json", "model.safetensors") if not (folder / name).is_file()]
    if absent:
        has = sorted(p.name for p in folder.iterdir())[:SHOWN]
        raise CheckpointError(f"{folder}: not a LeRobot pretrained-policy folder: no {' and no '.join(absent)} "
                              f"(it holds {has})")
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: not readable JSON ({e})") from None
    if cfg.get("type", "diffusion") != "diffusion":
        raise CheckpointError(f"{folder / 'config.json'}: a {cfg['type']!r} policy, not 'diffusion'")
    action = ((cfg.get("output_features") or {}).get("action") or {}).get("shape")
    action = action or (cfg.get("output_shapes") or {}).get("action")  # config.json of older LeRobot releases
    stored = {}
    for theirs, ours in [*fmt.LEROBOT_FIELDS.items(), ("output_features.action.shape[0]", "input_dim")]:
        raw = action[0] if ours == "input_dim" and action else cfg.get(theirs)
        if raw is not None:
            stored[ours] = _hint_value(ours, raw)
            if stored[ours] is None:
                raise CheckpointError(f"{folder / 'config.json'}: {theirs} = {raw!r} is not a valid value")
    if "n_groups" not in cfg:
        stored["n_groups"] = 8
        notes.append("config.json has no n_groups: LeRobot's default 8")
    return _read_safetensors(folder / "model.safetensors"), stored, "config.json", "model.safetensors"


def _unet_part(sd: Any, path: Path, notes: list[str]) -> dict[str, torch.Tensor]:
    """The U-Net's tensors under upstream names: prefix found and stripped, LeRobot names mapped, float32."""
    if not isinstance(sd, dict):
        raise CheckpointError(f"{path}: the state dict is a {type(sd).__name__}, not a dict")
    prefixes = sorted({str(k)[: -len(ANCHOR)] for k in sd if k == ANCHOR or str(k).endswith("." + ANCHOR)})
    if len(prefixes) != 1:
        what = f"several U-Nets (prefixes {prefixes})" if prefixes else f"no key ending in {ANCHOR!r}"
        raise CheckpointError(f"{path}: no single U-Net found: {what} among {len(sd)} keys "
                              f"(e.g. {sorted(map(str, sd))[:5]})")
    prefix = prefixes[0]
    if prefix:
        notes.append(f"U-Net keys under {prefix!r}; {sum(not k.startswith(prefix) for k in sd)} other keys ignored")
    sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    if any(fmt.LEROBOT_NAMED.match(k) for k in sd):
        sd = {fmt.from_lerobot(k): v for k, v in sd.items()}
        notes.append("LeRobot key names (conv1/conv2, bare down/up-sampling convs) mapped to upstream names")
    bad = sorted(k for k, v in sd.items() if not (torch.is_tensor(v) and v.is_floating_point()))
    if bad:
        raise CheckpointError(f"{path}: U-Net entries that are not float tensors: {bad[:SHOWN]}")
    dtypes = sorted({str(v.dtype) for v in sd.values()} - {"torch.float32"})
    if dtypes:
        notes.append(f"weights stored as {', '.join(dtypes)}: converted to float32")
    return {k: v.to(torch.float32).contiguous() for k, v in sd.items()}


def _hint_value(name: str, raw: Any) -> Any:
    """A stored setting as UNetConfig holds it, or None when it is not one (an interpolation string, a null)."""
    if name == "down_dims":
        ok = isinstance(raw, (list, tuple)) and raw and all(isinstance(c, int) and not isinstance(c, bool) for c in raw)
        return tuple(raw) if ok else None
    if name == "cond_predict_scale":
        return raw if isinstance(raw, bool) else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _cfg_hints(cfg: Any, notes: list[str]) -> dict[str, Any]:
    """U-Net settings from a diffusion_policy cfg: cfg.policy.* (image policies) or cfg.policy.model.* (lowdim)."""
    cfg, hints = _unpickle.plain(cfg), {}
    for section, names in fmt.DP_CFG_SECTIONS.items():
        for name in names:
            raw = _cfg_get(cfg, f"{section}.{name}")
            if raw is None or name in hints:
                continue
            value = _hint_value(name, raw)
            if value is None:
                notes.append(f"cfg {section}.{name} = {raw!r} not used")
            else:
                hints[name] = value
    if not hints:
        notes.append(f"no U-Net settings readable from the cfg ({type(cfg).__name__}): config from tensor shapes")
    return hints


def _cfg_get(cfg: Any, dotted: str) -> Any:
    if type(cfg).__module__.startswith("omegaconf."):  # the real cfg: resolve interpolations where they resolve
        from omegaconf import OmegaConf
        value = OmegaConf.select(cfg, dotted, default=None, throw_on_resolution_failure=False)
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg
