"""The permissive unpickler that reads a diffusion_policy .ckpt without diffusion_policy, omegaconf or dill.

A workspace checkpoint is torch.save(payload, pickle_module=dill): tensors, an OmegaConf cfg (classes from
omegaconf, `typing.Any`, and dill's `_load_type` for builtin types) and dill-pickled bytes. `load_permissive`
unpickles it importing only REAL_MODULES (plus omegaconf when installed); every other class becomes a StandIn
subclass of the same name that keeps its constructor arguments and pickled state, so the tensors load and
`plain` still reads the cfg from the state an OmegaConf node pickles (`_content` of containers, `_val` of values).
Nothing outside REAL_MODULES is imported or called, so loading does not run the training code; it is still a
pickle, to be read only from trusted files.
"""
from __future__ import annotations

import _compat_pickle
import builtins
import pickle
import types
from pathlib import Path
from typing import Any

import torch


def load_permissive(path: Path) -> tuple[Any, set[str]]:
    """torch.load through the permissive unpickler: (the payload, the classes replaced by stand-ins)."""
    error: Exception | None = None
    for real in (True, False):  # a cfg that the installed omegaconf cannot rebuild: unpickle it as stand-ins too
        missing: set[str] = set()
        try:
            return torch.load(path, map_location="cpu", weights_only=False,
                              pickle_module=pickle_module(missing, real)), missing
        except Exception as e:
            error = e
    assert error is not None
    raise error


class StandIn:
    """Takes the place of a class the unpickler does not import: accepts any arguments and state and keeps them."""

    args: tuple = ()
    state: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        return type(self)(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("items", []).append((key, value))

    def append(self, value: Any) -> None:
        self.__dict__.setdefault("items", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("items", []).extend(values)


def plain(obj: Any) -> Any:
    """Plain containers from stand-ins of OmegaConf nodes (their pickled state keeps `_content` / `_val`)."""
    if isinstance(obj, StandIn):
        state = obj.state if isinstance(obj.state, dict) else {}
        return plain(state["_content"]) if "_content" in state else plain(state["_val"]) if "_val" in state else obj
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return [plain(v) for v in obj] if isinstance(obj, (list, tuple)) else obj


REAL_MODULES = ("torch", "numpy", "collections", "typing", "pathlib", "_codecs", "copyreg")
SAFE_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bytearray",
                 "bool", "object", "slice", "range", "NoneType"}


def pickle_module(missing: set[str], real_omegaconf: bool) -> types.ModuleType:
    """A pickle_module for torch.load whose Unpickler imports only REAL_MODULES (and omegaconf) for real.

    Only top-level names are looked up (no `Path.write_text`-style attribute chains of protocol 4); the names
    replaced by stand-ins are added to `missing`.
    """
    def stand_in(module: str, name: str) -> type:
        missing.add(f"{module}.{name}")
        return type(name, (StandIn,), {"__module__": module})

    def load_type(name: str) -> type:  # dill._dill._load_type: dill's pickle of a builtin type, by name
        t = type(None) if name == "NoneType" else getattr(builtins, name, None)
        return t if isinstance(t, type) else stand_in("dill._dill._load_type", name)

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) == ("dill._dill", "_load_type"):
                return load_type
            if (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names that protocol 2 writes
                module, name = _compat_pickle.NAME_MAPPING[module, name]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
            root = module.split(".")[0]
            if "." not in name and (root in REAL_MODULES or (real_omegaconf and root == "omegaconf")
                    or (module == "builtins" and name in SAFE_BUILTINS)):
                try:
                    return super().find_class(module, name)
                except (ImportError, AttributeError):
                    pass
            return stand_in(module, name)

    mod = types.ModuleType("dpk_unet1d_unpickle")
    mod.Unpickler = Unpickler
    mod.load = lambda f, **kwargs: Unpickler(f, **kwargs).load()
    return mod
