"""The batch loop a DQoES inference container runs, as a library without NATS.

Why this exists: the scheduler needs each service's real seconds per batch
under the CPU quota it was given. `Workload` loads a model once, keeps one
batch of images in memory, and runs inference batch after batch, yielding a
`BatchResult` (wall latency, CPU seconds, threads) for each; the NATS
publisher and the standalone runner (run.py) are thin layers on top.

Per batch it re-reads the process's cgroup CPU quota and sets torch's
intra-op threads to max(1, floor(limit_cores)) (see cgroup.py). It times only
the forward pass: images are prepared once, so input decoding never blurs
the number the scheduler acts on.

Images are synthetic by default: a seeded standard-normal batch (values do
not change the cost of a dense CNN). `images_dir` takes real inputs instead:
every *.npy, *.pt or binary *.ppm (P6, 8-bit; `convert x.jpg x.ppm` makes
one) file in the directory, sorted by name. A file holds one image (HxW,
CxHxW or HxWxC) or a stack (NxCxHxW or NxHxWxC). uint8 data is scaled to
[0, 1] and normalised with the ImageNet mean and std; float data is used as
is. Images are resized (bilinear) to the resolution and repeated in order
to fill the batch.

Process-wide effects: torch.set_num_threads before each batch, and
torch.set_flush_denormal(True) once (tiny activations from random weights
must not fall into slow denormal arithmetic).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from services.inference.cgroup import available_cpus, read_cpu_limit_cores, threads_for
from services.inference.models import build_model, get_spec

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".npy", ".pt", ".ppm")


class WorkloadError(ValueError):
    """Bad workload settings or unusable input images (a user error, one line)."""


@dataclass(frozen=True)
class BatchResult:
    model: str
    batch: int  # 0-based, counted over the Workload's life
    images: int
    resolution_px: int
    latency_s: float  # wall time of the forward pass (time.perf_counter)
    cpu_s: float  # CPU time of the whole process (all threads) during it
    threads: int  # torch intra-op threads used
    limit_cores: float | None  # cgroup quota seen before the batch; None: unlimited
    warmup: bool  # the first batch: 1.5-2.5x steady state, do not use it as a sample
    finished_at: float  # time.time() at the end of the batch

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- inputs


def synthetic_images(batch_size: int, resolution_px: int, seed: int = 0) -> torch.Tensor:
    """A seeded NCHW float batch, roughly the statistics of normalised images."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 3, resolution_px, resolution_px, generator=gen)


def _read_ppm(path: Path) -> torch.Tensor:
    data = path.read_bytes()
    # Header: "P6", width, height, maxval, separated by whitespace (comments skipped).
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:
        while pos < len(data) and data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            pos = data.find(b"\n", pos) + 1 or len(data)
            continue
        start = pos
        while pos < len(data) and not data[pos : pos + 1].isspace():
            pos += 1
        if start == pos:
            raise WorkloadError(f"{path}: truncated PPM header")
        fields.append(data[start:pos])
    pos += 1  # the single whitespace byte before the pixels
    if fields[0] != b"P6":
        raise WorkloadError(f"{path}: only binary PPM (P6) is supported, found {fields[0]!r}")
    try:
        width, height, maxval = (int(f) for f in fields[1:])
    except ValueError:
        raise WorkloadError(f"{path}: bad PPM header") from None
    if maxval != 255:
        raise WorkloadError(f"{path}: only 8-bit PPM (maxval 255) is supported")
    pixels = data[pos : pos + width * height * 3]
    if len(pixels) != width * height * 3:
        raise WorkloadError(f"{path}: PPM pixel data is truncated")
    return torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(height, width, 3)


def _load_array(path: Path) -> torch.Tensor:
    suffix = path.suffix.lower()
    try:
        if suffix == ".ppm":
            return _read_ppm(path)
        if suffix == ".npy":
            import numpy as np  # only needed for .npy inputs

            return torch.from_numpy(np.load(path, allow_pickle=False))
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except WorkloadError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise WorkloadError(f"cannot read image file {path}: {type(e).__name__}") from None
    if not isinstance(obj, torch.Tensor):
        raise WorkloadError(f"{path}: expected a tensor, found {type(obj).__name__}")
    return obj


def _to_nchw(x: torch.Tensor, path: Path) -> torch.Tensor:
    if x.dim() == 2:  # grey HxW
        x = x.unsqueeze(0)
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4:
        raise WorkloadError(
            f"{path}: expected an image or a stack of images, found shape {tuple(x.shape)}"
        )
    if x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):  # channels last
        x = x.permute(0, 3, 1, 2)
    if x.shape[1] not in (1, 3):
        raise WorkloadError(f"{path}: expected 1 or 3 channels, found shape {tuple(x.shape)}")
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def load_images(images_dir: str | os.PathLike, batch_size: int, resolution_px: int) -> torch.Tensor:
    """A float NCHW batch built from the image files in `images_dir` (see module docstring)."""
    root = Path(images_dir)
    if not root.is_dir():
        raise WorkloadError(f"images directory {root} does not exist")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise WorkloadError(f"no {', '.join(IMAGE_SUFFIXES)} files in {root}")
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    parts: list[torch.Tensor] = []
    for path in files:
        x = _to_nchw(_load_array(path), path)
        if x.dtype == torch.uint8:
            x = (x.float() / 255.0 - mean) / std
        elif x.is_floating_point():
            x = x.float()
        else:
            raise WorkloadError(f"{path}: expected uint8 or float data, found {x.dtype}")
        if x.shape[-2:] != (resolution_px, resolution_px):
            x = F.interpolate(
                x, size=(resolution_px, resolution_px), mode="bilinear", align_corners=False
            )
        parts.append(x)
    images = torch.cat(parts)
    reps = -(-batch_size // images.shape[0])  # ceil
    return images.repeat(reps, 1, 1, 1)[:batch_size].contiguous()


# --------------------------------------------------------------------------- the loop


class Workload:
    """One model, one batch of images, inference batch after batch.

    `threads=None` follows the cgroup quota (default_threads with no quota);
    an int pins the thread count. `stop()` (thread-safe; also
    `stop_event.set()`) ends `run()` after the batch in progress: a forward
    pass cannot be interrupted.
    """

    def __init__(
        self,
        model: str = "resnet50",
        batch_size: int = 100,
        resolution_px: int | None = None,
        *,
        seed: int = 0,
        weights: str | os.PathLike | None = None,
        images_dir: str | os.PathLike | None = None,
        threads: int | None = None,
        default_threads: int = 1,
        stop_event: threading.Event | None = None,
        limit_reader: Callable[[], float | None] = read_cpu_limit_cores,
    ) -> None:
        try:
            self.spec = get_spec(model)
        except KeyError as e:
            raise WorkloadError(e.args[0]) from None
        self.resolution_px = (
            self.spec.resolution_px if resolution_px is None else int(resolution_px)
        )
        if batch_size < 1:
            raise WorkloadError(f"batch size must be >= 1, got {batch_size}")
        if self.resolution_px < self.spec.min_resolution_px:
            raise WorkloadError(
                f"{self.spec.name} needs a resolution of at least {self.spec.min_resolution_px} px, "
                f"got {self.resolution_px}"
            )
        if threads is not None and threads < 1:
            raise WorkloadError(f"threads must be >= 1, got {threads}")
        if default_threads < 1:
            raise WorkloadError(f"default threads must be >= 1, got {default_threads}")
        self.batch_size = batch_size
        self.fixed_threads = threads
        self.default_threads = default_threads
        self.stop_event = stop_event or threading.Event()
        self._limit_reader = limit_reader
        self._cpus = available_cpus()
        self._batches_done = 0

        torch.set_flush_denormal(True)
        self.model = build_model(self.spec.name, seed=seed, weights=weights)
        if images_dir is None:
            self.images = synthetic_images(batch_size, self.resolution_px, seed)
        else:
            self.images = load_images(images_dir, batch_size, self.resolution_px)

    def stop(self) -> None:
        self.stop_event.set()

    def plan_threads(self) -> tuple[int, float | None]:
        """(threads to use, limit_cores) for the next batch."""
        limit_cores = self._limit_reader()
        if self.fixed_threads is not None:
            return self.fixed_threads, limit_cores
        return threads_for(limit_cores, self._cpus, self.default_threads), limit_cores

    def run_batch(self) -> BatchResult:
        """Run one batch now and return its measurements."""
        return self.infer(self.images)[1]

    def infer(self, images: torch.Tensor) -> tuple[torch.Tensor, BatchResult]:
        """Run the model on `images` (NCHW) now, with the threads the quota allows: (logits, measurements).

        The HTTP serving mode (serving.py) calls this with each micro-batch it collected.
        """
        threads, limit_cores = self.plan_threads()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        cpu0, t0 = time.process_time(), time.perf_counter()
        with torch.inference_mode():
            logits = self.model(images)
        t1, cpu1 = time.perf_counter(), time.process_time()
        if logits.shape[0] != images.shape[0]:  # guards against a silently wrong model
            raise RuntimeError(
                f"model returned {logits.shape[0]} rows for {images.shape[0]} images"
            )
        result = BatchResult(
            model=self.spec.name,
            batch=self._batches_done,
            images=int(images.shape[0]),
            resolution_px=self.resolution_px,
            latency_s=t1 - t0,
            cpu_s=cpu1 - cpu0,
            threads=threads,
            limit_cores=limit_cores,
            warmup=self._batches_done == 0,
            finished_at=time.time(),
        )
        self._batches_done += 1
        return logits, result

    def run(self, batches: int | None = None) -> Iterator[BatchResult]:
        """Yield one result a batch until `batches` have run (None: no limit) or stop() is called."""
        done = 0
        while (batches is None or done < batches) and not self.stop_event.is_set():
            yield self.run_batch()
            done += 1
