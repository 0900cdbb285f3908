"""The policy a robot's control loop calls: weights loaded once, the fastest variant that runs here picked and
checked, its graphs captured at load; conditioning in, action chunk out (dpk.load_policy builds it).

The variant (pick="measure", the default): every candidate that is available on this device and prepares for
these weights (a variant raising dpk.Unavailable while preparing, e.g. kernels_loop on a shape it has no kernel
for, drops out) is timed at load by the timing engine's latency loop, all of them in turn (`Timer.latencies`:
host wall time from the call to the actions on the host), and the fastest wins. No single order is right:
kernels_loop leads every stored run where it runs (7-8x graph_loop at B = 1, 1.5-2.5x at B = 8), but it needs
sm_90 and nvcc, and without it compiled beats graph_loop on 16 DDIM steps (kernels/policy/NOTES.md). The
default candidates leave out `compiled` (its torch.compile costs minutes at load on the larger configs): name it in
`candidates` to race it.
pick="order" takes the first of PREFERENCE that prepares, untimed. With `verify`, the family's parity engine
checks the winner on the user's weights (random conditioning, the derived tolerance against the float64 oracle,
the anti-cheat checks), and the next fastest where it fails: a policy that would act on wrong numbers does not load.

Noise per call: diffusers' exact stream from `seed` (NoiseSpec on a CPU generator: what every variant and
eager_diffusers draw for that seed), or, without a seed, one draw of the whole stack from the policy's own
device generator (rows of steps that add no noise are multiplied by sigma = 0 or not read), and for the variants
that draw as diffusers does a fresh seed of a device generator.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import dpk
from dpk.parity import check as parity_check
from dpk.registry import Registry, unavailable_reason
from dpk.timing import Timer, TimingConfig

from ..denoise._noise import NoiseSpec
from ._chunk import Chunk, predraw
from .reference import make_inputs

PREFERENCE = ("kernels_loop", "graph_loop", "graph_per_step", "compiled", "eager_loop", "eager_diffusers")
RACED = tuple(n for n in PREFERENCE if n != "compiled")  # pick="measure"'s default candidates
PICKS = ("measure", "order")


@dataclass
class Policy:
    """An action-chunk function bound to one net, schedule, device and variant."""

    variant: str
    chunk: Chunk
    fn: Callable[..., torch.Tensor]
    horizon: int
    notes: list[str] = field(default_factory=list)
    load_latency_ms: dict[str, float] = field(default_factory=dict)  # pick="measure": each candidate's median
    normalizer: Any = None  # _normalizer.Normalizer: observation in, actions out in the environment's units
    state: Any = None  # _observation_lerobot.StateConditioning: a policy without cameras, conditioned on its state
    # the steps a robot executes (upstream: n_obs_steps - 1 .. n_obs_steps - 1 + n_action_steps; its low-dim
    # policies without oa_step_convention from n_obs_steps)
    action_slice: slice = field(default_factory=lambda: slice(None))
    obs_keys: Any = None  # _observation_formats.ObsKeys: the checkpoint's observation names, for predict(obs={...})
    _gen: torch.Generator | None = None

    @property
    def device(self) -> torch.device:
        return self.chunk.net.device

    def _by_name(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """(image, low-dim, environment state) from observations by name: cameras stacked (B, n_obs, n_cameras, 3,
        H, W) where there are several, low-dim keys concatenated, in the checkpoint's order."""
        keys = self.obs_keys
        if keys is None:
            raise ValueError("this policy does not name its observations: call it with image= / agent_pos=")
        names = [*keys.cameras, *(k for k, _ in keys.low_dim), *((keys.env,) if keys.env else ())]
        missing = [k for k in names if k not in obs]
        if missing or len(obs) != len(names):
            raise ValueError(f"obs must hold exactly {names}: missing {missing}, unexpected "
                             f"{sorted(k for k in obs if k not in names)}")
        for key, width in keys.low_dim:
            x = obs[key]
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or (width is not None and x.shape[-1] != width):
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"obs[{key!r}] must be (B, n_obs, {width}), got {got}")
        cams = [obs[k] for k in keys.cameras]
        image = None if not cams else cams[0] if len(cams) == 1 else torch.stack(cams, dim=2)
        low = torch.cat([obs[k] for k, _ in keys.low_dim], dim=-1)
        return image, low, obs[keys.env] if keys.env else None

    def predict(self, global_cond: torch.Tensor | None = None, *, image: torch.Tensor | None = None,
                agent_pos: torch.Tensor | None = None, env_state: torch.Tensor | None = None,
                obs: torch.Tensor | dict[str, torch.Tensor] | None = None, seed: int | None = None
                ) -> dict[str, torch.Tensor]:
        """{"action_pred": (B, T, D) the whole denoised chunk, "action": the executed steps}, on the host. In:
        global_cond, or the raw observation (image= and agent_pos= with an image encoder; agent_pos= and, where
        the policy has one, env_state= for a policy without cameras; obs=, the same as agent_pos=, for
        diffusion_policy's low-dim policies, whose observation is one `obs` vector per frame), or obs= a dict of
        (B, n_obs, ...) tensors by the checkpoint's names, as upstream's predict_action takes them."""
        state_name = "agent_pos"
        if isinstance(obs, dict):
            if image is not None or agent_pos is not None or env_state is not None:
                raise ValueError("give obs= as a dict, or image= / agent_pos= / env_state=, not both")
            image, agent_pos, env_state = self._by_name(obs)
            obs = None
        if obs is not None:
            if agent_pos is not None:
                raise ValueError("give obs= or agent_pos= (the same argument), not both")
            agent_pos, state_name = obs, "obs"
        dev, cfg = self.device, self.chunk.net.config
        if self.chunk.encoder is not None:
            if image is None or agent_pos is None:
                raise ValueError("this policy encodes observations: call it with image= and agent_pos=")
            image, agent_pos = (t.to(dev, torch.float32) for t in (image, agent_pos))
            if self.normalizer is not None:
                image, agent_pos = self.normalizer.normalize_obs(image, agent_pos)
            batch = image.shape[0]
        else:
            if global_cond is None and self.state is not None and agent_pos is not None:
                self.state.check(agent_pos, env_state, state_name)
                state, env = (None if t is None else t.to(dev, torch.float32) for t in (agent_pos, env_state))
                if self.normalizer is not None:
                    state, env = self.normalizer.normalize_state(state, env)
                global_cond, agent_pos = self.state(state, env), None
            if not isinstance(global_cond, torch.Tensor):
                raise TypeError("this policy takes global_cond, a (B, global_cond_dim) tensor" + (
                    ", or agent_pos= (and env_state=): its state" if self.state is not None else ""))
            global_cond = global_cond.to(dev, torch.float32).contiguous()
            batch = global_cond.shape[0]
        shape = (batch, self.horizon, cfg.input_dim)
        chunk = self.chunk
        if seed is not None:
            chunk = dataclasses.replace(chunk, noise=NoiseSpec(int(seed), "cpu"))
            noise = predraw(chunk.noise, chunk.schedule, shape, dev)
        else:
            if self._gen is None:
                self._gen = torch.Generator(device=dev).manual_seed(torch.seed() & 0x7FFFFFFF)
            noise = torch.randn((chunk.steps + 1, *shape), generator=self._gen, device=dev)
            # variants that draw as diffusers does (eager_diffusers, compiled) read a seed, not `noise`: a fresh one
            chunk = dataclasses.replace(chunk, noise=NoiseSpec(torch.seed() & 0x7FFFFFFF, "device"))
        with torch.no_grad():
            actions = self.fn(global_cond, image, agent_pos, noise, chunk)
            if self.normalizer is not None:
                actions = self.normalizer.unnormalize_action(actions)
        host = actions.cpu()
        return {"action_pred": host, "action": host[:, self.action_slice]}

    def __call__(self, global_cond: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
        """The executed action steps (B, n, D) on the host (predict(...)["action"])."""
        return self.predict(global_cond, **kw)["action"]


@dataclass
class Choice:
    name: str
    fn: Callable[..., torch.Tensor]
    notes: list[str]
    latency_ms: dict[str, float]


def _prepare(reg: Registry, case: dpk.Case, device: torch.device, name: str) -> str:
    """Why `name` cannot run here ('' when it prepared: captured, compiled, packed once for these weights)."""
    v = reg.variant("policy", name)
    reason = unavailable_reason(v, device, case.dtype)
    if reason is None:
        try:
            v.fn(*make_inputs(case, device))
        except dpk.Unavailable as e:
            reason = str(e)
    return reason or ""


def _parity(reg: Registry, case: dpk.Case, device: torch.device, name: str) -> str:
    res = parity_check(reg, "policy", name, case, device)
    return "" if res.status == "pass" else f"parity {res.status}: {res.summary()}"


def race(reg: Registry, case: dpk.Case, device: torch.device, names: Sequence[str],
         cfg: TimingConfig | None = None) -> dict[str, float]:
    """Median action latency (ms) of each prepared variant in `names`, sampled in turn on the case's inputs."""
    inputs = make_inputs(case, device)

    def call(fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return fn(*inputs)

    cfg = cfg or TimingConfig(budget_s=2.0, min_samples=3, warmup_s=0.0)
    ms = Timer(device, cfg).latencies([functools.partial(call, reg.variant("policy", n).fn) for n in names])
    return {n: m.stats.median * 1e3 for n, m in zip(names, ms)}


def choose(reg: Registry, case: dpk.Case, device: torch.device, variant: str | None, verify: bool,
           pick: str = "measure", candidates: Sequence[str] | None = None) -> Choice:
    """The variant to run (see the module docstring): `variant`, else by `pick` among `candidates`; the notes say
    why the others were passed over."""
    if pick not in PICKS:
        raise ValueError(f"load_policy: pick must be one of {', '.join(PICKS)} (got {pick!r})")
    names = [variant] if variant else list(candidates or (RACED if pick == "measure" else PREFERENCE))
    known = [v.name for v in reg.variants_of("policy")]
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"load_policy: unknown policy variant(s) {', '.join(unknown)}; known: {', '.join(known)}")
    notes: list[str] = []

    def prepared() -> Iterator[str]:  # lazily: pick="order" prepares only until one passes
        for name in names:
            if reason := _prepare(reg, case, device, name):
                notes.append(f"{name}: {reason}")
            else:
                yield name

    ready: Iterable[str] = prepared()
    latency: dict[str, float] = {}
    if pick == "measure":
        ready = list(ready)
        if len(ready) > 1:
            latency = race(reg, case, device, ready)
            ready.sort(key=latency.__getitem__)
            notes.append("latency at load: " + ", ".join(f"{n} {latency[n]:.4g} ms" for n in ready))
    for name in ready:
        reason = _parity(reg, case, device, name) if verify else ""
        if not reason:
            return Choice(name, reg.variant("policy", name).fn, notes, latency)
        notes.append(f"{name}: {reason}")
    raise RuntimeError("no policy variant runs here: " + "; ".join(notes))


def load(reg: Registry, checkpoint: str | None, *, config: dict[str, Any] | None, weights_seed: int,
         scheduler: str | dict[str, Any] | None, batch: int, horizon: int | None, device: torch.device,
         variant: str | None, verify: bool, observation: bool | None, pick: str = "measure",
         candidates: Sequence[str] | None = None, dtype: str = "float32") -> Policy:
    """A Policy of a checkpoint (or of seeded random weights of `config`): see dpk.load_policy."""
    from ._observation import load_observation_side
    from ._settings import checkpoint_settings, executed_steps, sampling_settings

    if (checkpoint is None) == (config is None):
        raise ValueError("load_policy: give a checkpoint, or a U-Net config (dict of UNetConfig fields), not both")
    stored = checkpoint_settings(checkpoint) if checkpoint is not None else {}
    params: dict[str, Any] = {"checkpoint": str(checkpoint)} if checkpoint is not None else dict(config)
    params |= sampling_settings(stored, scheduler) | {"weights_seed": int(weights_seed), "B": int(batch)}
    params["T"] = int(horizon or stored.get("horizon") or 16)
    side = load_observation_side(checkpoint) if checkpoint is not None else None
    if observation and (side is None or (side.encoder is None and side.state is None)):
        why = side.encoder_reason if side is not None else "random weights: pass config['encoder']"
        raise ValueError(f"load_policy: observation=True but there is no image encoder or state conditioning to run "
                         f"({why})")
    if side is not None and side.encoder is not None and observation is not False:
        enc = side.encoder.config  # its cameras also for the work model (the encoders' bytes)
        params |= {"encoder": enc.name, "cameras": enc.n_cameras, "separate": enc.separate}
    case = dpk.make_case("policy", "load_policy", dtype=dtype, **params)
    choice = choose(reg, case, device, variant, verify, pick, candidates)
    chunk = make_inputs(case, device)[-1]
    normalizer = side.normalizer.to(device) if side is not None and side.normalizer is not None else None
    return Policy(choice.name, chunk, choice.fn, params["T"], choice.notes + (side.notes if side else []),
                  load_latency_ms=choice.latency_ms, normalizer=normalizer,
                  action_slice=executed_steps(stored, params["T"]),
                  state=side.state if side is not None and observation is not False else None,
                  obs_keys=side.obs_keys if side is not None and observation is not False else None)
