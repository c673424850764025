"""The project's torch models as an MLServer custom runtime, so a stock third-party server serves them.

Why this exists: DQoES should govern real model servers through the metrics
they export themselves. MLServer (Seldon, `pip install -e '.[serving]'`)
exports request-latency histograms natively
(`rest_server_request_duration_seconds` on its metrics port); this class is
all it needs to serve a CNN from models.py, and MLServer itself is used as
released. compose/mlserver/ holds a ready model repository.

A request (V2 inference protocol, `POST /v2/models/<name>/infer`) carries
one INT32 input `images` with one element N, and optionally an INT64 input
`seed`: N seeded synthetic images at the model's resolution, made on the
server, as in the workload's own --serve mode. The answer is one INT64
output `predictions`, a class index per image. Model settings
(`parameters.extra`): model, resolution_px, seed, weights, threads (default:
follow the cgroup CPU quota, as workload.py does).

Forward passes run one at a time on one thread of their own: concurrent
requests queue there (the latency the server's histogram records), and the
server's event loop stays free to accept them.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput

MAX_IMAGES = 256


class TorchImageModel(MLModel):
    """One CNN from services/inference/models.py behind MLServer."""

    async def load(self) -> bool:
        from services.inference.workload import Workload

        params = self.settings.parameters
        extra: dict[str, Any] = dict((params.extra if params is not None else None) or {})
        self._workload = Workload(str(extra.get("model", "resnet50")), 1, extra.get("resolution_px"),
                                  seed=int(extra.get("seed", 0)), weights=extra.get("weights"),
                                  threads=extra.get("threads"))
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference")
        return True

    def _forward(self, images: int, seed: int) -> list[int]:
        from services.inference.workload import synthetic_images

        logits, _ = self._workload.infer(synthetic_images(images, self._workload.resolution_px, seed))
        return logits.argmax(dim=1).tolist()

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = {i.name: i for i in payload.inputs}
        if "images" not in inputs:
            raise MLServerError("expected an INT32 input named 'images' holding the number of images", 400)
        try:
            images = int(_first(inputs["images"].data))
            seed = int(_first(inputs["seed"].data)) if "seed" in inputs else 0
        except (TypeError, ValueError, IndexError):
            raise MLServerError("'images' and 'seed' must each hold one integer", 400) from None
        if not 1 <= images <= MAX_IMAGES or seed < 0:
            raise MLServerError(f"'images' must be 1 to {MAX_IMAGES} and 'seed' >= 0", 400)
        loop = asyncio.get_running_loop()
        predictions = await loop.run_in_executor(self._executor, self._forward, images, seed)
        return InferenceResponse(
            model_name=self.name, model_version=self.version, id=payload.id,
            outputs=[ResponseOutput(name="predictions", shape=[len(predictions)], datatype="INT64",
                                    data=predictions)])


def _first(data: Any) -> Any:
    """The first element of a V2 tensor's data (a list, possibly nested, or a TensorData root)."""
    root = getattr(data, "root", data)
    while isinstance(root, list | tuple):
        root = root[0]
    return root
