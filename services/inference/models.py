"""The CNN architectures DQoES containers serve, defined here in plain torch.

Why this exists: the paper's services run Keras ImageNet classifiers. This
machine can install only a CPU torch wheel (torchvision would pull GBs of
CUDA) and nothing can be downloaded from a model hub, so the architectures are
written out here. Latency does not depend on the weight values, so seeded
random weights give the real cost of a batch; a state_dict file can be loaded
for real predictions.

Published parameter counts the tests check against (within 2%):

* ResNet-50 (He et al. 2016; torchvision v1.5 layout, stride on the 3x3):
  25,557,032.
* VGG-16 (Simonyan & Zisserman 2015, configuration D, no batch norm):
  138,357,544.
* MobileNetV2 (Sandler et al. 2018, width 1.0; torchvision): 3,504,872.
  It stands in for the paper's NASNetMobile ("nasnetmobile" is an alias):
  same class of mobile network, about half the multiply-adds.
* InceptionV3 (Szegedy et al. 2016) WITHOUT the auxiliary classifier
  (inference never runs it): 23,834,568, as torchvision with
  aux_logits=False; Keras reports 23,851,784 because it counts batch-norm
  moving statistics (which are buffers here, not parameters).
* Xception (Chollet 2017; Keras layout): Keras reports 22,910,480, of which
  54,528 are batch-norm moving statistics (buffers here), so this module has
  22,855,952 parameters.

Published GFLOPs are the usual figures at native resolution, which count
multiply-adds (torchvision's "GFLOPS" column; timm for Xception).

Every model ends in adaptive average pooling, so it accepts resolutions other
than its native one. The smallest input each accepts is `ModelSpec.min_resolution_px`
(InceptionV3's unpadded stem needs 75 px; the others work from 32 px).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

NUM_CLASSES = 1000


class WeightsError(ValueError):
    """A weights file that cannot be read or does not fit the model."""


# --------------------------------------------------------------------------- ResNet-50


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = 64
        stages = []
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = []
            for i in range(blocks):
                layers.append(_Bottleneck(in_ch, width, stride if i == 0 else 1))
                in_ch = width * _Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --------------------------------------------------------------------------- VGG-16


class VGG16(nn.Module):
    _CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for v in self._CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, stride=2))
            else:
                layers += [nn.Conv2d(in_ch, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                in_ch = int(v)
        self.features = nn.Sequential(*layers)
        # 7x7 as at 224 px; other resolutions are pooled (or stretched) to it.
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


# --------------------------------------------------------------------------- MobileNetV2


def _conv_bn_relu6(in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1):
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU6(inplace=True),
    )


class _InvertedResidual(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_ch * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(in_ch, hidden, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch),
        ]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s), as in the paper's Table 2.
    _SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                 (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        in_ch = 32
        for t, c, n, s in self._SETTINGS:
            for i in range(n):
                layers.append(_InvertedResidual(in_ch, c, s if i == 0 else 1, t))
                in_ch = c
        layers.append(_conv_bn_relu6(in_ch, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# --------------------------------------------------------------------------- InceptionV3


class _BasicConv(nn.Module):
    """Conv (no bias) + batch norm (eps 0.001, as Keras/TF) + ReLU."""

    def __init__(self, in_ch: int, out_ch: int, kernel, stride=1, padding=0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(out_ch, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(self.bn(self.conv(x)))


class _InceptionA(nn.Module):
    def __init__(self, in_ch: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = _BasicConv(in_ch, 64, 1)
        self.branch5x5 = nn.Sequential(_BasicConv(in_ch, 48, 1), _BasicConv(48, 64, 5, padding=2))
        self.branch3x3dbl = nn.Sequential(
            _BasicConv(in_ch, 64, 1),
            _BasicConv(64, 96, 3, padding=1),
            _BasicConv(96, 96, 3, padding=1),
        )
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), _BasicConv(in_ch, pool_features, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1x1, self.branch5x5, self.branch3x3dbl, self.branch_pool)
        return torch.cat([b(x) for b in branches], 1)


class _InceptionB(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = _BasicConv(in_ch, 384, 3, stride=2)
        self.branch3x3dbl = nn.Sequential(
            _BasicConv(in_ch, 64, 1),
            _BasicConv(64, 96, 3, padding=1),
            _BasicConv(96, 96, 3, stride=2),
        )
        self.branch_pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), self.branch_pool(x)], 1)


class _InceptionC(nn.Module):
    def __init__(self, in_ch: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = _BasicConv(in_ch, 192, 1)
        self.branch7x7 = nn.Sequential(
            _BasicConv(in_ch, c7, 1),
            _BasicConv(c7, c7, (1, 7), padding=(0, 3)),
            _BasicConv(c7, 192, (7, 1), padding=(3, 0)),
        )
        self.branch7x7dbl = nn.Sequential(
            _BasicConv(in_ch, c7, 1),
            _BasicConv(c7, c7, (7, 1), padding=(3, 0)),
            _BasicConv(c7, c7, (1, 7), padding=(0, 3)),
            _BasicConv(c7, c7, (7, 1), padding=(3, 0)),
            _BasicConv(c7, 192, (1, 7), padding=(0, 3)),
        )
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), _BasicConv(in_ch, 192, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1x1, self.branch7x7, self.branch7x7dbl, self.branch_pool)
        return torch.cat([b(x) for b in branches], 1)


class _InceptionD(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = nn.Sequential(_BasicConv(in_ch, 192, 1), _BasicConv(192, 320, 3, stride=2))
        self.branch7x7x3 = nn.Sequential(
            _BasicConv(in_ch, 192, 1),
            _BasicConv(192, 192, (1, 7), padding=(0, 3)),
            _BasicConv(192, 192, (7, 1), padding=(3, 0)),
            _BasicConv(192, 192, 3, stride=2),
        )
        self.branch_pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), self.branch_pool(x)], 1)


class _InceptionE(nn.Module):
    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch1x1 = _BasicConv(in_ch, 320, 1)
        self.branch3x3_1 = _BasicConv(in_ch, 384, 1)
        self.branch3x3_2a = _BasicConv(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _BasicConv(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _BasicConv(in_ch, 448, 1)
        self.branch3x3dbl_2 = _BasicConv(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = _BasicConv(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _BasicConv(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), _BasicConv(in_ch, 192, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.branch3x3_1(x)
        b = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(a),
                self.branch3x3_2b(a),
                self.branch3x3dbl_3a(b),
                self.branch3x3dbl_3b(b),
                self.branch_pool(x),
            ],
            1,
        )


class InceptionV3(nn.Module):
    """InceptionV3 without the auxiliary classifier (a training-only head)."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _BasicConv(3, 32, 3, stride=2),
            _BasicConv(32, 32, 3),
            _BasicConv(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            _BasicConv(64, 80, 1),
            _BasicConv(80, 192, 3),
            nn.MaxPool2d(3, stride=2),
        )
        self.mixed = nn.Sequential(
            _InceptionA(192, 32),
            _InceptionA(256, 64),
            _InceptionA(288, 64),
            _InceptionB(288),
            _InceptionC(768, 128),
            _InceptionC(768, 160),
            _InceptionC(768, 160),
            _InceptionC(768, 192),
            _InceptionD(768),
            _InceptionE(1280),
            _InceptionE(2048),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.mixed(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


# --------------------------------------------------------------------------- Xception


class _SeparableConv(nn.Module):
    """Depthwise 3x3 then pointwise 1x1, no biases (Keras SeparableConv2D, use_bias=False)."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_ch, in_ch, 3, padding=1, groups=in_ch, bias=False)
        self.pointwise = nn.Conv2d(in_ch, out_ch, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class _XceptionBlock(nn.Module):
    """`reps` x (ReLU, separable conv, BN), then optionally a stride-2 max pool.

    The shortcut is identity, or a strided 1x1 conv + BN when the block
    changes channels or resolution. `relu_first=False` is the first entry-flow
    block, whose input has just been through a ReLU.
    """

    def __init__(self, in_ch: int, out_chs: tuple[int, ...], downsample: bool, relu_first=True):
        super().__init__()
        layers: list[nn.Module] = []
        ch = in_ch
        for i, out_ch in enumerate(out_chs):
            if i > 0 or relu_first:
                layers.append(nn.ReLU(inplace=i > 0))
            layers += [_SeparableConv(ch, out_ch), nn.BatchNorm2d(out_ch)]
            ch = out_ch
        if downsample:
            # 'same' padding: ceil(n / 2) outputs, as Keras.
            layers.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.rep = nn.Sequential(*layers)
        self.skip: nn.Module | None = None
        if downsample or ch != in_ch:
            self.skip = nn.Sequential(
                nn.Conv2d(in_ch, ch, 1, stride=2 if downsample else 1, bias=False),
                nn.BatchNorm2d(ch),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.skip is None else self.skip(x)
        return self.rep(x) + skip


class Xception(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        blocks = [
            _XceptionBlock(64, (128, 128), True, relu_first=False),
            _XceptionBlock(128, (256, 256), True),
            _XceptionBlock(256, (728, 728), True),
        ]
        blocks += [_XceptionBlock(728, (728, 728, 728), False) for _ in range(8)]  # middle flow
        blocks.append(_XceptionBlock(728, (728, 1024), True))
        self.blocks = nn.Sequential(*blocks)
        self.exit = nn.Sequential(
            _SeparableConv(1024, 1536),
            nn.BatchNorm2d(1536),
            nn.ReLU(inplace=True),
            _SeparableConv(1536, 2048),
            nn.BatchNorm2d(2048),
            nn.ReLU(inplace=True),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.exit(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class ModelSpec:
    name: str
    constructor: Callable[[], nn.Module]
    resolution_px: int  # native input side
    gflops: float  # published, at resolution_px, multiply-adds per image
    params_published: int  # the figure the tests check against (see module docstring)
    min_resolution_px: int  # smallest input side the architecture accepts
    note: str = ""


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("resnet50", ResNet50, 224, 4.09, 25_557_032, 32),
        ModelSpec("vgg16", VGG16, 224, 15.47, 138_357_544, 32),
        ModelSpec(
            "mobilenetv2",
            MobileNetV2,
            224,
            0.30,
            3_504_872,
            32,
            note="stand-in for the paper's NASNetMobile",
        ),
        ModelSpec(
            "inceptionv3",
            InceptionV3,
            299,
            5.71,
            23_834_568,
            75,
            note="without the auxiliary classifier",
        ),
        ModelSpec("xception", Xception, 299, 8.4, 22_855_952, 32),
    )
}

# Other names accepted by get_spec/build_model. Not keys of MODELS, so that
# iterating MODELS gives each architecture once.
ALIASES: dict[str, str] = {"nasnetmobile": "mobilenetv2"}


def get_spec(name: str) -> ModelSpec:
    """The spec for a model name or alias (case-insensitive); KeyError lists the valid names."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in MODELS:
        known = ", ".join([*MODELS, *ALIASES])
        raise KeyError(f"unknown model {name!r} (known: {known})")
    return MODELS[key]


def _init_weights(model: nn.Module) -> None:
    # torchvision's scheme, except depthwise convs use fan-in: with fan-out
    # MobileNetV2's activations shrink ~sqrt(channels) a block and end near
    # 1e-9, close enough to float32 denormals to risk slow arithmetic.
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            depthwise = m.groups > 1 and m.groups == m.in_channels
            nn.init.kaiming_normal_(m.weight, mode="fan_in" if depthwise else "fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


def load_weights(model: nn.Module, path: str | os.PathLike, name: str = "model") -> None:
    """Load a state_dict file into `model`, or raise WeightsError with a one-line reason."""
    if not os.path.isfile(path):
        raise WeightsError(f"weights file {os.fspath(path)} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        # torch's own message is a paragraph; the type is enough (pickle errors
        # mean a non-torch file, or objects other than tensors).
        raise WeightsError(
            f"cannot read weights file {os.fspath(path)} as a torch state_dict ({type(e).__name__})"
        ) from None
    if isinstance(state, dict) and set(state) == {"state_dict"}:
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"weights file {os.fspath(path)} does not hold a state_dict of tensors")
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if missing or unexpected or mismatched:
        first = (missing or unexpected or mismatched)[0]
        raise WeightsError(
            f"weights file {os.fspath(path)} does not fit {name}: {len(missing)} missing, "
            f"{len(unexpected)} unexpected, {len(mismatched)} wrong-shape tensors "
            f"(first: {first!r})"
        )
    model.load_state_dict(state)


def build_model(name: str, seed: int = 0, weights: str | os.PathLike | None = None) -> nn.Module:
    """A model in eval mode: seeded random weights, or those from a state_dict file.

    The same (name, seed) always gives the same weights; the global torch RNG
    is left as it was.
    """
    spec = get_spec(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.constructor()
        _init_weights(model)
    if weights is not None:
        load_weights(model, weights, spec.name)
    return model.eval()


def count_params(model: nn.Module) -> int:
    """Learnable parameters (batch-norm running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters())
