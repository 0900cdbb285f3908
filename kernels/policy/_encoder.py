"""Diffusion Policy's image observation encoder at inference: observation frames -> the U-Net's global_cond.

    enc = ObsEncoder(EncoderConfig())                   # Push-T image: 2 frames of (3, 96, 96) + agent_pos (2)
    global_cond = enc(image, agent_pos)                 # (B, 2, 3, 96, 96), (B, 2, 2) -> (B, 1028)

What upstream diffusion_policy computes for DiffusionUnetImagePolicy.predict_action with obs_as_global_cond and a
MultiImageObsEncoder holding one rgb key and one low-dim key, in eval mode:
  - frames flattened: (B, n_obs, ...) -> (B * n_obs, ...), frame t of sample b at row b * n_obs + t;
  - the image transform Sequential(resize, crop randomizer, imagenet normalize): no resize here (NOTES.md);
    CropRandomizer in eval takes torchvision's center crop (top = round((H - h) / 2), Python's round); with
    random_crop False upstream applies no crop at all (its CenterCrop is assigned and then overwritten), which a
    config expresses as crop_shape None; imagenet_norm subtracts ImageNet's mean and divides by its std;
  - ResNet-18 with GroupNorm (_resnet.py) -> 512 features per frame;
  - features of rgb keys first, then low-dim keys, each group in sorted key order: cat(image 512, agent_pos 2);
  - reshape (B * n_obs, 514) -> (B, n_obs * 514): frame 0's features, then frame 1's.
The inputs are the normalised observations (the policy's LinearNormalizer runs before the encoder: _normalizer.py).

`layout="lerobot"` is LeRobot's DiffusionRgbEncoder inside its DiffusionModel._prepare_global_conditioning, eval:
center crop (torchvision's CenterCrop, the same box), ResNet-18 trunk (GroupNorm(C // 16) with `use_group_norm`, else
BatchNorm with running statistics), SpatialSoftmax keypoints, Linear, ReLU (_keypoints.py): 2K features per image;
per frame the state first, then each camera's features in the config's camera order (one encoder shared by the
cameras, or one per camera with `separate`); frames flattened as above. Several cameras come as one image tensor
(B, n_obs, n_cameras, 3, H, W), as LeRobot stacks them. Its image normalisation is the normaliser's (dataset
statistics).

`layout="robomimic"` is Diffusion Policy's DiffusionUnetHybridImagePolicy (the paper's image policies, its Push-T
checkpoints among them): robomimic 0.2.0's ObservationEncoder, eval, its rgb keys first (one camera, or several of
one shape stacked as above in shape_meta's order, each its own VisualCore), then its low-dim keys (concatenated in
shape_meta's order: one low-dim vector), with
`eval_fixed_crop` (Diffusion Policy's CropRandomizer: torchvision's center crop; 76 x 76 by default) and every
BatchNorm replaced by GroupNorm(C // 16) with `obs_encoder_group_norm` (else BatchNorm, running statistics): per
image VisualCore (ResNet-18 trunk, robomimic's SpatialSoftmax, Linear(2K, feature_dimension = 64)), then ReLU; per
frame the keys in shape_meta's order (Push-T: image, then agent_pos: 64 + 2); frames flattened as above (2 x 66 = 132
on Push-T). Images are normalised by the policy's LinearNormalizer only.
forward has no host syncs and no data-dependent branches, so it can be captured in a CUDA graph and compiled
whole; the checks read shapes, dtypes and devices only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._keypoints import RgbEncoder
from ._resnet import FEATURE_DIM, NORMS, ResNet18, conv_output_size

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # upstream's imagenet_norm: torchvision Normalize with these
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("diffusion_policy", "lerobot", "robomimic")


@dataclass(frozen=True)
class EncoderConfig:
    """One camera and one low-dim observation per frame; defaults are Push-T image's (diffusion_policy's layout)."""

    image_shape: tuple[int, int, int] = (3, 96, 96)  # (C, H, W) of one frame
    crop_shape: tuple[int, int] | None = (84, 84)  # eval-time center crop; None: the full image
    n_obs_steps: int = 2
    low_dim: int = 2  # agent_pos
    feature_dim: int = FEATURE_DIM  # per image: ResNet-18's 512 (diffusion_policy); 2 keypoints (lerobot); the
    # Linear's width (robomimic: feature_dimension)
    imagenet_norm: bool = False
    rgb_key: str = "image"  # names in the checkpoint (state-dict keys, normalizer fields)
    low_dim_key: str = "agent_pos"
    layout: str = "diffusion_policy"  # or "lerobot": SpatialSoftmax head, the state before the image features;
    # or "robomimic": robomimic's SpatialSoftmax head, the image before the state
    norm: str = "group"  # the ResNet's norm: GroupNorm(C // 16), or "batch" (lerobot without use_group_norm)
    keypoints: int = 32  # lerobot: spatial_softmax_num_keypoints; robomimic: num_kp
    n_cameras: int = 1  # lerobot, robomimic: cameras of one (C, H, W) shape, in the config's order
    separate: bool = False  # lerobot: use_separate_rgb_encoder_per_camera; robomimic: always, with several

    def __post_init__(self) -> None:
        c, h, w = self.image_shape
        if c != 3 or h < 1 or w < 1:
            raise ValueError(f"image_shape must be (3, H, W) with H, W >= 1, got {self.image_shape}")
        if self.crop_shape is not None and not (1 <= self.crop_shape[0] <= h and 1 <= self.crop_shape[1] <= w):
            raise ValueError(f"crop_shape {self.crop_shape} does not fit in the image's (H, W) = {(h, w)}")
        if self.n_obs_steps < 1 or self.low_dim < 0:
            raise ValueError(f"n_obs_steps must be >= 1 and low_dim >= 0, got {self.n_obs_steps}, {self.low_dim}")
        if self.layout not in LAYOUTS or self.norm not in NORMS:
            raise ValueError(f"layout must be one of {LAYOUTS} and norm one of {NORMS}, got {self.layout!r}, "
                             f"{self.norm!r}")
        if self.layout == "diffusion_policy" and self.norm != "group":
            raise ValueError("the diffusion_policy layout is upstream's GroupNorm ResNet: norm 'group'")
        if self.keypoints < 1:
            raise ValueError(f"keypoints must be >= 1, got {self.keypoints}")
        if self.n_cameras < 1 or (self.layout == "robomimic" and self.separate != (self.n_cameras > 1)) or (
                self.layout == "diffusion_policy" and self.separate and self.n_cameras == 1):
            raise ValueError(f"n_cameras {self.n_cameras}, separate {self.separate}: robomimic's layout has one "
                             "VisualCore per camera (separate with several); every layout at least one camera, and "
                             "separate needs several")
        if self.layout == "robomimic" and self.feature_dim < 1:
            raise ValueError(f"feature_dim {self.feature_dim}: robomimic's Linear needs at least one output")
        want = {"lerobot": 2 * self.keypoints, "diffusion_policy": FEATURE_DIM}.get(self.layout, self.feature_dim)
        if self.feature_dim != want:
            raise ValueError(f"feature_dim {self.feature_dim}: the {self.layout} layout gives {want} per image "
                             f"({'2 x keypoints' if self.layout == 'lerobot' else 'only ResNet-18 is implemented'})")

    @classmethod
    def lerobot(cls, **kw: object) -> EncoderConfig:
        """LeRobot's layout and key names (Push-T: 2 frames of 3 x 96 x 96, crop 84, 32 keypoints: 132 wide)."""
        kw = {"rgb_key": "observation.image", "low_dim_key": "observation.state", **kw}
        return cls(layout="lerobot", feature_dim=2 * int(kw.get("keypoints", 32)), **kw)

    @classmethod
    def robomimic(cls, **kw: object) -> EncoderConfig:
        """DiffusionUnetHybridImagePolicy's (Push-T: 2 frames of 3 x 96 x 96, crop 76, 32 keypoints, 64 features:
        132 wide)."""
        return cls(**{"layout": "robomimic", "crop_shape": (76, 76), "feature_dim": 64, **kw})

    @property
    def name(self) -> str:
        """The case parameter `encoder` that builds this architecture (_encoding.ENCODERS)."""
        return "resnet18_gn" if self.layout == "diffusion_policy" else f"{self.layout}_resnet18_{self.norm[0]}n"

    @property
    def map_shape(self) -> tuple[int, int]:
        """layer4's (h, w) for the (cropped) image."""
        h, w = self.crop_shape or self.image_shape[1:]
        return conv_output_size(h), conv_output_size(w)

    @property
    def frame_dim(self) -> int:
        """Features of one frame: every camera's image features and the low-dim vector (in the layout's order)."""
        return self.n_cameras * self.feature_dim + self.low_dim

    @property
    def frame_parts(self) -> list[object]:
        """One frame's features in the layout's order, for messages: [512, 2] or [2, 64] ([2, '2 x 64'])."""
        images = self.feature_dim if self.n_cameras == 1 else f"{self.n_cameras} x {self.feature_dim}"
        return [self.low_dim, images] if self.layout == "lerobot" else [images, self.low_dim]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """An observation's image shape after the batch: (n_obs, 3, H, W), with n_cameras before C when > 1."""
        return (self.n_obs_steps, *((self.n_cameras,) if self.n_cameras > 1 else ()), *self.image_shape)

    @property
    def cond_dim(self) -> int:
        """The U-Net's global_cond_dim: n_obs_steps frames of frame_dim."""
        return self.n_obs_steps * self.frame_dim


def center_crop_box(height: int, width: int, crop: tuple[int, int] | None) -> tuple[int, int, int, int]:
    """(top, left, h, w) of torchvision's center_crop: top = round((H - h) / 2), halves to even (Python's round)."""
    if crop is None:
        return 0, 0, height, width
    return round((height - crop[0]) / 2.0), round((width - crop[1]) / 2.0), crop[0], crop[1]


class ObsEncoder(nn.Module):
    """(image (B, n_obs, 3, H, W), agent_pos (B, n_obs, low_dim)) -> global_cond (B, n_obs * (512 + low_dim)).

    `seed` initialises the backbone as torchvision does after torch.manual_seed(seed) (the global RNG is left as it
    was); None draws from the global RNG. State-dict keys are `backbone.<torchvision resnet18 key>`, and for
    LeRobot's and robomimic's layouts `rgb.<i>.{backbone,pool,out}.*` (_keypoints.py: one encoder, or one per camera).
    """

    def __init__(self, config: EncoderConfig | None = None, seed: int | None = 0):
        super().__init__()
        self.config = config or EncoderConfig()
        if self.config.layout != "diffusion_policy" and min(self.config.map_shape) < 1:
            raise ValueError(f"an image of {self.config.crop_shape or self.config.image_shape[1:]} leaves no "
                             "layer4 map for the keypoints")
        self.backbones: nn.ModuleList | None = None
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            cfg = self.config
            if cfg.layout != "diffusion_policy":  # LeRobot's encoders, built one after the other as its list
                # comprehension does; robomimic's one VisualCore
                self.backbone, self.rgb = None, nn.ModuleList(
                    RgbEncoder(cfg.norm, *cfg.map_shape, cfg.keypoints, cfg.layout, cfg.feature_dim)
                    for _ in range(cfg.n_cameras if cfg.separate else 1))
            elif cfg.separate:  # Diffusion Policy's image policy without share_rgb_model: one ResNet per camera
                self.backbone, self.rgb, self.backbones = None, None, nn.ModuleList(
                    ResNet18() for _ in range(cfg.n_cameras))
            else:  # ... one ResNet (shared by the cameras with share_rgb_model)
                self.backbone, self.rgb = ResNet18(), None
        _, h, w = self.config.image_shape
        self._crop = center_crop_box(h, w, self.config.crop_shape)
        self.register_buffer("imagenet_mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1), persistent=False)
        self.register_buffer("imagenet_std", torch.tensor(IMAGENET_STD).view(3, 1, 1), persistent=False)
        self.eval()

    @property
    def cond_dim(self) -> int:
        return self.config.cond_dim

    def transform(self, images: torch.Tensor) -> torch.Tensor:
        """Upstream's eval-time image transform of (N, 3, H, W) frames: center crop, then imagenet_norm."""
        top, left, h, w = self._crop
        x = images[:, :, top:top + h, left:left + w]
        if self.config.imagenet_norm:
            x = (x - self.imagenet_mean) / self.imagenet_std
        return x

    def forward(self, image: torch.Tensor, agent_pos: torch.Tensor) -> torch.Tensor:
        self.check_inputs(image, agent_pos)
        cfg, (b, n) = self.config, image.shape[:2]
        low = agent_pos.reshape(b * n, cfg.low_dim)
        x = image.reshape(b * n, cfg.n_cameras, *cfg.image_shape)
        if self.backbones is not None:  # one ResNet per camera, the cameras' features in key order
            feats = torch.cat([net(self.transform(x[:, c])) for c, net in enumerate(self.backbones)], dim=-1)
            frames = torch.cat([feats, low], dim=-1)  # rgb keys first, then low-dim
        elif self.rgb is None:  # one ResNet: the cameras as one batch, camera-major (upstream's cat over keys)
            feats = self.backbone(self.transform(x.transpose(0, 1).reshape(-1, *cfg.image_shape)))
            frames = torch.cat([feats.reshape(cfg.n_cameras, b * n, -1).transpose(0, 1).reshape(b * n, -1), low], -1)
        else:
            if len(self.rgb) == 1:  # one shared encoder: frames and cameras as one batch, "(b s n) -> b s (n ...)"
                feats = self.rgb[0](self.transform(x.reshape(-1, *cfg.image_shape))).reshape(b * n, -1)
            else:
                feats = torch.cat([enc(self.transform(x[:, c])) for c, enc in enumerate(self.rgb)], dim=-1)
            # LeRobot: the state first; robomimic: shape_meta's order, the image first
            frames = torch.cat([low, feats] if cfg.layout == "lerobot" else [feats, low], dim=-1)
        return frames.reshape(b, n * cfg.frame_dim)

    def check_inputs(self, image: torch.Tensor, agent_pos: torch.Tensor) -> None:
        """ValueError naming the expected and the received shape / dtype / device."""
        cfg, weight = self.config, next(self.parameters())
        _check("image", image, ("B", *cfg.input_shape), weight)
        _check("agent_pos", agent_pos, ("B", cfg.n_obs_steps, cfg.low_dim), weight)
        if agent_pos.shape[0] != image.shape[0]:
            raise ValueError(f"agent_pos has batch {agent_pos.shape[0]} but image has {image.shape[0]} "
                             f"(image {tuple(image.shape)}, agent_pos {tuple(agent_pos.shape)})")


def _check(name: str, x: torch.Tensor, expected: tuple, weight: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) != len(expected) or shape[0] < 1 or shape[1:] != expected[1:]:
        raise ValueError(f"{name} must have shape ({', '.join(map(str, expected))}), got {shape}")
    if x.dtype != weight.dtype:
        raise ValueError(f"{name} must be {weight.dtype} like the encoder's weights, got {x.dtype}")
    if x.device != weight.device:
        raise ValueError(f"{name} is on {x.device} but the encoder is on {weight.device}")
