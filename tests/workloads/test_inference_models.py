"""The plain-torch architectures: sizes, shapes, seeded weights, weights files.

Published parameter counts (each test allows 2%):
ResNet-50 25,557,032 (He et al. 2016 / torchvision); VGG-16 138,357,544
(Simonyan & Zisserman 2015, config D); MobileNetV2 3,504,872 (Sandler et al.
2018 / torchvision); InceptionV3 23,834,568 without the auxiliary classifier
(torchvision, aux_logits=False; Keras's 23,851,784 adds batch-norm moving
statistics); Xception 22,910,480 (Keras, of which 54,528 are batch-norm moving
statistics, buffers in torch; so 22,855,952 parameters).

Published multiply-adds at native resolution (GMACs, the "GFLOPs" torchvision
lists; timm for Xception): 4.09, 15.47, 0.30, 5.71, 8.4.

The tiny-batch test runs 2 images at 64 px, except InceptionV3 at 75 px, the
smallest its unpadded stem accepts (ModelSpec.min_resolution_px).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from services.inference.models import (  # noqa: E402
    ALIASES,
    MODELS,
    WeightsError,
    build_model,
    count_params,
    get_spec,
)

PUBLISHED_PARAMS = {
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "mobilenetv2": 3_504_872,
    "inceptionv3": 23_834_568,
    "xception": 22_910_480,
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def built():
    """Each model built once (seed 0): VGG-16's initialisation alone takes ~2 s."""
    return {name: build_model(name, seed=0) for name in MODELS}


def test_registry_names_and_alias():
    assert set(MODELS) == set(PUBLISHED_PARAMS)
    assert get_spec("nasnetmobile") is MODELS["mobilenetv2"]
    assert get_spec("ResNet50") is MODELS["resnet50"]
    assert set(ALIASES) == {"nasnetmobile"}
    assert {s.resolution_px for s in MODELS.values()} == {224, 299}
    assert MODELS["inceptionv3"].resolution_px == MODELS["xception"].resolution_px == 299
    with pytest.raises(KeyError, match="known: resnet50"):
        get_spec("nasnet")


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_parameter_count_matches_published(built, name):
    params = count_params(built[name])
    assert params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.02)
    assert params == pytest.approx(MODELS[name].params_published, rel=0.02)


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_one_image_at_native_resolution_costs_the_published_gflops(built, name):
    from torch.utils.flop_counter import FlopCounterMode

    side = MODELS[name].resolution_px
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        logits = built[name](torch.randn(1, 3, side, side))
    assert logits.shape == (1, 1000)
    # torch counts a multiply-add as 2 FLOPs; the published figures count it once.
    gmacs = counter.get_total_flops() / 2e9
    assert gmacs == pytest.approx(MODELS[name].gflops, rel=0.02)


@pytest.mark.parametrize("name", list(PUBLISHED_PARAMS))
def test_tiny_batch_gives_1000_finite_logits(built, name):
    side = max(64, MODELS[name].min_resolution_px)
    with torch.inference_mode():
        logits = built[name](torch.randn(2, 3, side, side))
    assert logits.shape == (2, 1000)
    assert torch.isfinite(logits).all()


def test_inceptionv3_below_its_minimum_fails(built):
    side = MODELS["inceptionv3"].min_resolution_px - 1
    with pytest.raises(RuntimeError), torch.inference_mode():
        built["inceptionv3"](torch.randn(1, 3, side, side))


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_seeded_weights_are_deterministic_and_leave_the_global_rng_alone():
    rng_before = torch.random.get_rng_state()
    a, b, c = (build_model("mobilenetv2", seed=s) for s in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert _same_weights(a, b)
    assert not _same_weights(a, c)
    assert not a.training  # built in eval mode


def test_weights_file_round_trips(tmp_path):
    source = build_model("mobilenetv2", seed=1)
    path = tmp_path / "mnv2.pt"
    torch.save(source.state_dict(), path)
    loaded = build_model("nasnetmobile", seed=2, weights=path)
    assert _same_weights(source, loaded)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        assert torch.equal(source(x), loaded(x))


def _one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


def test_weights_of_another_model_are_refused(tmp_path, built):
    path = tmp_path / "mnv2.pt"
    torch.save(built["mobilenetv2"].state_dict(), path)
    with pytest.raises(WeightsError) as e:
        build_model("resnet50", weights=path)
    assert "does not fit resnet50" in _one_line(e)


def test_wrong_shape_is_refused(tmp_path, built):
    state = dict(built["mobilenetv2"].state_dict())
    state["classifier.1.weight"] = torch.zeros(10, 1280)
    path = tmp_path / "mnv2-10-classes.pt"
    torch.save(state, path)
    with pytest.raises(WeightsError) as e:
        build_model("mobilenetv2", weights=path)
    assert "1 wrong-shape" in _one_line(e)


@pytest.mark.parametrize("content", ["list", "garbage", "missing"])
def test_unreadable_weights_files_are_refused(tmp_path, content):
    path = tmp_path / "w.pt"
    if content == "list":
        torch.save([1, 2, 3], path)
    elif content == "garbage":
        path.write_bytes(b"not a torch file")
    with pytest.raises(WeightsError) as e:
        build_model("mobilenetv2", weights=path)
    assert str(path) in _one_line(e)
