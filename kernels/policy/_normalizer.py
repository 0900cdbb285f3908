"""A trained policy's observation / action normalisation, so an entry point takes raw observations and returns
actions in the environment's units.

    norm = Normalizer.from_diffusion_policy(policy_state_dict)      # or from_lerobot(...), or identity()
    image, agent_pos = norm.normalize_obs(image, agent_pos)          # raw -> what the encoder was trained on
    action = norm.unnormalize_action(naction)                        # U-Net sample -> environment units

Each field keeps the arithmetic of the code that stored it, operation for operation:
  affine    upstream diffusion_policy LinearNormalizer (model/common/normalizer.py `_normalize`): x is viewed as
            (-1, n) for the n entries of `scale`; normalize x * scale + offset, unnormalize (x - offset) / scale.
            Push-T image: image scale 2, offset -1 (get_image_range_normalizer: [0, 1] -> [-1, 1]); agent_pos
            and action fitted in 'limits' mode to [-1, 1].
  mean_std  LeRobot Normalize / Unnormalize (policies/normalize.py): (x - mean) / (std + 1e-8); x * std + mean.
  min_max   LeRobot: ((x - min) / (max - min + 1e-8)) * 2 - 1; ((x + 1) / 2) * (max - min) + min.
  range     LeRobot's processor pipelines (processor/normalize_processor.py; MIN_MAX, QUANTILES, QUANTILE10 with
            (lo, hi) = (min, max), (q01, q99), (q10, q90)): d = hi - lo, or eps where that is 0;
            2 * (x - lo) / d - 1; (x + 1) / 2 * d + lo. Their MEAN_STD is mean_std's arithmetic.
  identity  nothing stored (identity(), random-weight benchmarks; a LeRobot feature mapped to IDENTITY).
Results come out in the buffers' dtype (float32), as upstream casts x to scale's dtype and LeRobot promotes.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..unet1d._checkpoint import SHOWN, CheckpointError

EPS = 1e-8  # LeRobot's
DP_PREFIX = "normalizer.params_dict."
DP_ENTRIES = ("scale", "offset", "input_stats.min", "input_stats.max", "input_stats.mean", "input_stats.std")
LEROBOT_INPUTS, LEROBOT_OUTPUTS = "normalize_inputs.", "unnormalize_outputs."
LEROBOT_STATS = {"mean_std": ("mean", "std"), "min_max": ("min", "max")}
# a processor pipeline's NormalizationMode -> (Field mode, its two statistics)
PROCESSOR_STATS = {"MEAN_STD": ("mean_std", ("mean", "std")), "MIN_MAX": ("range", ("min", "max")),
                   "QUANTILES": ("range", ("q01", "q99")), "QUANTILE10": ("range", ("q10", "q90"))}


class Field(nn.Module):
    """One normalised quantity: `mode` and its two tensors (scale/offset, mean/std or min/max)."""

    def __init__(self, mode: str, a: torch.Tensor | None = None, b: torch.Tensor | None = None, eps: float = EPS):
        super().__init__()
        if mode not in ("affine", "mean_std", "min_max", "range", "identity"):
            raise ValueError(f"unknown normalisation mode {mode!r}")
        self.mode, self.eps = mode, eps
        if mode == "range":  # (lo, hi) -> (lo, d): d computed once, as the pipeline computes it per call
            a, b = a.detach().float(), b.detach().float()
            d = b - a
            b = torch.where(d == 0, torch.tensor(eps, dtype=d.dtype), d)
        self.register_buffer("a", None if a is None else a.detach().float().clone())
        self.register_buffer("b", None if b is None else b.detach().float().clone())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a, self.b
        if self.mode == "affine":
            return (x.reshape(-1, a.shape[0]) * a + b).reshape(x.shape)
        if self.mode == "mean_std":
            return (x - a) / (b + self.eps)
        if self.mode == "min_max":
            return (x - a) / (b - a + self.eps) * 2 - 1
        if self.mode == "range":
            return 2 * (x - a) / b - 1
        return x

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a, self.b
        if self.mode == "affine":
            return ((x.reshape(-1, a.shape[0]) - b) / a).reshape(x.shape)
        if self.mode == "mean_std":
            return x * b + a
        if self.mode == "min_max":
            return (x + 1) / 2 * (b - a) + a
        if self.mode == "range":
            return (x + 1) / 2 * b + a
        return x


class Normalizer(nn.Module):
    """The image (one per camera), low-dim state and action fields of one policy, under its checkpoint's names."""

    def __init__(self, fields: dict[str, Field], image_key: str | Sequence[str], state_key: str, action_key: str,
                 source: str, env_key: str | None = None):
        super().__init__()
        self.image_keys, self.has_env = _keys(image_key), env_key is not None
        self.keys = (*self.image_keys, state_key, *((env_key,) if env_key else ()), action_key)
        missing = [k for k in self.keys if k not in fields]
        if missing:
            raise CheckpointError(f"normalizer has no field for {missing} (has {sorted(fields)})")
        self.source = source
        self.fields = nn.ModuleList(fields[k] for k in self.keys)  # ModuleDict keys may not hold LeRobot's dots

    @property
    def modes(self) -> dict[str, str]:
        return {k: f.mode for k, f in zip(self.keys, self.fields)}

    def field(self, key: str) -> Field:
        if key not in self.keys:
            raise KeyError(f"no normalizer field {key!r}; fields: {list(self.keys)}")
        return self.fields[self.keys.index(key)]

    def normalize_obs(self, image: torch.Tensor, agent_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw observations -> the encoder's inputs; several cameras as (B, n_obs, n_cameras, 3, H, W), each with
        its own statistics (as LeRobot normalises each camera's key before stacking them)."""
        n = len(self.image_keys)
        if n == 1:
            image = self.fields[0].normalize(image)
        else:
            image = torch.stack([self.fields[c].normalize(image[:, :, c]) for c in range(n)], dim=2)
        return image, self.fields[n].normalize(agent_pos)

    def normalize_state(self, state: torch.Tensor, env_state: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The low-dim state (and, where the policy has one, the environment state) -> the conditioning's."""
        n = len(self.image_keys)
        env = self.fields[n + 1].normalize(env_state) if env_state is not None and self.has_env else env_state
        return self.fields[n].normalize(state), env

    def normalize_action(self, action: torch.Tensor) -> torch.Tensor:
        return self.fields[-1].normalize(action)

    def unnormalize_action(self, action: torch.Tensor) -> torch.Tensor:
        """The U-Net's denoised sample -> actions in the environment's units."""
        return self.fields[-1].unnormalize(action)

    @classmethod
    def identity(cls, image_key: str = "image", state_key: str = "agent_pos", action_key: str = "action"
                 ) -> Normalizer:
        """No normalisation: for random-weight benchmarks."""
        return cls({k: Field("identity") for k in (image_key, state_key, action_key)}, image_key, state_key,
                   action_key, "identity")

    @classmethod
    def from_diffusion_policy(cls, state_dict: dict[str, torch.Tensor], image_key: str | Sequence[str] = "image",
                              state_key: str | Sequence[str] = "agent_pos", action_key: str = "action"
                              ) -> Normalizer:
        """From a diffusion_policy policy state dict: `normalizer.params_dict.<key>.{scale, offset, input_stats.*}`
        (image_key () for a low-dim policy: its `obs` and `action` fields; several state keys, as a hybrid policy's
        low-dim keys, become one field `a+b+...` of their concatenation)."""
        problems: dict[str, list[str]] = {"missing": [], "unexpected": [], "misshaped": []}
        fields, state_keys = {}, _keys(state_key)
        for key in (*_keys(image_key), *state_keys, action_key):
            base = f"{DP_PREFIX}{key}."
            problems["missing"] += [base + e for e in DP_ENTRIES if base + e not in state_dict]
            problems["unexpected"] += [k for k in state_dict if k.startswith(base) and k[len(base):] not in DP_ENTRIES]
            scale = state_dict.get(base + "scale")
            if scale is None:
                continue
            if scale.dim() != 1:
                problems["misshaped"].append(f"{base}scale (expected 1-d, found {tuple(scale.shape)})")
                continue
            present = {e: state_dict[base + e] for e in DP_ENTRIES[1:] if base + e in state_dict}
            problems["misshaped"] += [f"{base}{e} (expected {tuple(scale.shape)}, found {tuple(t.shape)})"
                                      for e, t in present.items() if t.shape != scale.shape]
            if "offset" in present:
                fields[key] = Field("affine", scale, present["offset"])
        key_problems(problems, "diffusion_policy normalizer keys do not fit")
        state = "+".join(state_keys)
        if len(state_keys) > 1:  # several low-dim keys, concatenated: one affine field (elementwise, so the same)
            parts = [fields.pop(k) for k in state_keys]
            fields[state] = Field("affine", torch.cat([f.a for f in parts]), torch.cat([f.b for f in parts]))
        return cls(fields, image_key, state, action_key, "diffusion_policy")

    @classmethod
    def from_lerobot(cls, state_dict: dict[str, torch.Tensor], modes: dict[str, str],
                     image_key: str | Sequence[str] = "observation.image", state_key: str = "observation.state",
                     action_key: str = "action", env_key: str | None = None) -> Normalizer:
        """From a LeRobot DiffusionPolicy's buffers: `normalize_inputs.buffer_<key, dots as _>.{mean,std|min,max}`
        for the image and state, `unnormalize_outputs.buffer_action.*` for the action. `modes`: key -> mean_std,
        min_max or identity (LeRobot's normalization_mapping applied to each feature's type)."""
        problems: dict[str, list[str]] = {"missing": [], "unexpected": [], "misshaped": []}
        fields = {}
        images = _keys(image_key)
        inputs = (*images, state_key, *((env_key,) if env_key else ()))
        for key, where in (*((k, LEROBOT_INPUTS) for k in inputs), (action_key, LEROBOT_OUTPUTS)):
            mode, base = modes.get(key, "identity"), f"{where}buffer_{key.replace('.', '_')}."
            if mode == "identity":
                fields[key] = Field("identity")
                continue
            if mode not in LEROBOT_STATS:
                raise CheckpointError(f"LeRobot normalisation mode {mode!r} of {key!r} is not supported "
                                      f"(mean_std, min_max, identity are)")
            names = LEROBOT_STATS[mode]
            problems["missing"] += [base + n for n in names if base + n not in state_dict]
            problems["unexpected"] += [k for k in state_dict if k.startswith(base) and k[len(base):] not in names]
            if all(base + n in state_dict for n in names):
                a, b = (state_dict[base + n] for n in names)
                if a.shape != b.shape:
                    shapes = f"expected {tuple(a.shape)}, found {tuple(b.shape)}"
                    problems["misshaped"].append(f"{base}{names[1]} ({shapes})")
                fields[key] = Field(mode, a, b)
        key_problems(problems, "LeRobot normalisation buffers do not fit")
        return cls(fields, images, state_key, action_key, "lerobot", env_key)


    @classmethod
    def from_lerobot_processors(cls, pre: tuple[dict, dict[str, torch.Tensor]],
                                post: tuple[dict, dict[str, torch.Tensor]], image_key: str | Sequence[str],
                                state_key: str = "observation.state", action_key: str = "action",
                                env_key: str | None = None) -> Normalizer:
        """From a LeRobot processor pipeline pair: the normalizer step of the preprocessor and the unnormalizer step
        of the postprocessor, each (its config: features {key: {type, shape}}, norm_map {type: mode}, eps; its
        state file's tensors `<key>.<stat>`). A visual feature's (C,) statistics broadcast as (C, 1, 1)."""
        problems: dict[str, list[str]] = {"missing": [], "unexpected": [], "misshaped": []}
        fields = {}
        images = _keys(image_key)
        lows = (state_key, *((env_key,) if env_key else ()))
        for key, (config, state) in (*((k, pre) for k in (*images, *lows)), (action_key, post)):
            feature = (config.get("features") or {}).get(key)
            mode = str((config.get("norm_map") or {}).get((feature or {}).get("type"), "IDENTITY")).upper()
            if feature is None or mode == "IDENTITY":
                fields[key] = Field("identity")
                continue
            if mode not in PROCESSOR_STATS:
                raise CheckpointError(f"LeRobot normalisation mode {mode!r} of {key!r} is not supported "
                                      f"({', '.join(PROCESSOR_STATS)}, IDENTITY are)")
            kind, names = PROCESSOR_STATS[mode]
            problems["missing"] += [f"{key}.{n}" for n in names if f"{key}.{n}" not in state]
            if all(f"{key}.{n}" in state for n in names):
                a, b = (state[f"{key}.{n}"] for n in names)
                if a.shape != b.shape:
                    shapes = f"expected {tuple(a.shape)}, found {tuple(b.shape)}"
                    problems["misshaped"].append(f"{key}.{names[1]} ({shapes})")
                    continue
                if feature.get("type") == "VISUAL" and a.dim() == 1:
                    a, b = a.reshape(-1, 1, 1), b.reshape(-1, 1, 1)
                shape = list(feature.get("shape") or [])
                want = [shape[0], 1, 1] if feature.get("type") == "VISUAL" and shape else shape
                if want and list(a.shape) != want:
                    problems["misshaped"].append(f"{key}.{names[0]} (the feature's {tuple(shape)} wants "
                                                 f"{tuple(want)}, found {tuple(a.shape)})")
                    continue
                fields[key] = Field(kind, a, b, eps=float(config.get("eps", EPS)))
        key_problems(problems, "LeRobot processor statistics do not fit")
        return cls(fields, images, state_key, action_key, "lerobot", env_key)


def _keys(key: str | Sequence[str]) -> tuple[str, ...]:
    """One image key or several (one per camera) as a tuple."""
    return (key,) if isinstance(key, str) else tuple(key)


def key_problems(problems: dict[str, list[str]], what: str) -> None:
    """Raise one CheckpointError listing the {"missing": [...], "unexpected": [...], "misshaped": [...]} keys."""
    if any(problems.values()):
        lines = [f"  {kind} ({len(keys)}): {', '.join(keys[:SHOWN])}" + (" ..." if len(keys) > SHOWN else "")
                 for kind, keys in problems.items() if keys]
        raise CheckpointError(f"{what}:\n" + "\n".join(lines))
