"""Five training tasks in plain torch, on data each job generates itself (nothing is downloaded).

Why these: the FlowCon paper's Table 1 mixes evaluation functions of
different kinds (reconstruction loss, cross entropy, squared loss) on small
models; these are the same kinds, sized so one epoch takes about a second on
one core of this project's machines:

- `vae`: a variational autoencoder on 16 x 16 synthetic "digit" images
  (blurred random strokes of 10 templates); E = reconstruction loss + KL per image.
- `cnn`: a small convolutional classifier on 10 classes of those images
  (template + noise); E = cross entropy.
- `mlp`: a two-hidden-layer perceptron on 10 Gaussian clusters in 32 dimensions;
  E = cross entropy.
- `lstm`, `gru`: one recurrent layer predicting the next value of noisy sums of
  two sines; E = squared loss (MSE).

Everything is seeded: the same seed gives the same data, weights and losses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

TASKS = ("vae", "cnn", "mlp", "lstm", "gru")
EVAL_FN = {"vae": "reconstruction loss", "cnn": "cross entropy", "mlp": "cross entropy",
           "lstm": "squared loss", "gru": "squared loss"}


class TaskError(ValueError):
    """An unknown task or a bad setting; one line."""


def _templates(gen: torch.Generator, side: int = 16, classes: int = 10) -> torch.Tensor:
    """Ten smooth random 'digits': blurred random strokes, values in [0, 1]."""
    t = (torch.rand(classes, 1, side, side, generator=gen) > 0.82).float()
    k = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16
    for _ in range(2):
        t = F.conv2d(t, k.view(1, 1, 3, 3), padding=1)
    return (t / t.amax(dim=(2, 3), keepdim=True).clamp_min(1e-6)).clamp(0, 1)


def _images(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    tmpl = _templates(gen)
    y = torch.randint(0, 10, (n,), generator=gen)
    x = (0.6 * tmpl[y] + 0.9 * torch.randn(n, 1, 16, 16, generator=gen)).clamp(0, 1)
    return x, y


class VAE(nn.Module):
    def __init__(self, latent: int = 8) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Flatten(), nn.Linear(256, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, latent), nn.Linear(128, latent)
        self.dec = nn.Sequential(nn.Linear(latent, 128), nn.ReLU(), nn.Linear(128, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        logits = self.dec(z)
        rec = F.binary_cross_entropy_with_logits(logits, x.flatten(1), reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (rec + kl) / x.shape[0]


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Recurrent(nn.Module):
    def __init__(self, kind: str, hidden: int = 32) -> None:
        super().__init__()
        self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(x)
        return self.out(h)


@dataclass
class Task:
    """A model, its optimiser and a `step()` that trains one mini-batch and returns its loss."""

    name: str
    eval_fn: str
    step: Callable[[], float]
    steps_per_epoch: int


def build(name: str, seed: int = 0, batch: int = 64, steps_per_epoch: int | None = None) -> Task:
    if name not in TASKS:
        raise TaskError(f"unknown training task {name!r} (choose from {', '.join(TASKS)})")
    if batch < 1:
        raise TaskError("batch must be >= 1")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if name == "vae":
        x, _ = _images(gen, 4096)
        model: nn.Module = VAE()
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)

        def loss_of(i: torch.Tensor) -> torch.Tensor:
            return model(x[i])
        n, spe = len(x), 150
    elif name == "cnn":
        x, y = _images(gen, 4096)
        model = CNN()
        opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)

        def loss_of(i: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(x[i]), y[i])
        n, spe = len(x), 25
    elif name == "mlp":
        centers = 0.25 * torch.randn(10, 64, generator=gen)
        y = torch.randint(0, 10, (8192,), generator=gen)
        x = centers[y] + torch.randn(8192, 64, generator=gen)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)

        def loss_of(i: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(model(x[i]), y[i])
        n, spe = len(x), 120
    else:
        length = 60
        t = torch.arange(length + 1, dtype=torch.float32)
        f = 0.05 + 0.25 * torch.rand(2048, 2, generator=gen)
        ph = 2 * math.pi * torch.rand(2048, 2, generator=gen)
        s = (torch.sin(f[:, :1] * t + ph[:, :1]) + 0.5 * torch.sin(f[:, 1:] * t + ph[:, 1:]))
        s = s + 0.05 * torch.randn(s.shape, generator=gen)
        x, y = s[:, :-1].unsqueeze(-1), s[:, 1:].unsqueeze(-1)
        model = Recurrent(name, hidden=48)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def loss_of(i: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(model(x[i]), y[i])
        n, spe = len(x), 25

    def step() -> float:
        i = torch.randint(0, n, (batch,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(i)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return Task(name, EVAL_FN[name], step, steps_per_epoch or spe)
