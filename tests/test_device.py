import pytest
import torch

from forge_course import device as dev


def test_pick_device_prefers_an_accelerator(monkeypatch):
    monkeypatch.delenv("FORGE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "mps" if dev._mps_ready() else "cpu"
    assert dev.pick_device().type == expected


def test_forge_device_overrides(monkeypatch):
    monkeypatch.setenv("FORGE_DEVICE", "cpu")
    assert dev.pick_device() == torch.device("cpu")


def test_forge_device_refuses_a_missing_device(monkeypatch):
    missing = "mps" if torch.cuda.is_available() and not dev._mps_ready() else "cuda"
    if missing == "cuda" and torch.cuda.is_available():
        pytest.skip("both accelerators present")
    monkeypatch.setenv("FORGE_DEVICE", missing)
    with pytest.raises(RuntimeError, match="not available"):
        dev.pick_device()


def test_available_devices_start_with_cpu():
    devices = dev.available_devices()
    assert devices[0] == torch.device("cpu")
    assert len(devices) == len(set(devices))


def test_tolerance_grows_as_precision_falls():
    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    rtols = [dev.tolerance(d)["rtol"] for d in dtypes]
    assert rtols == sorted(rtols)
    for dtype, rtol in zip(dtypes, rtols):
        assert rtol >= torch.finfo(dtype).eps, "below machine epsilon, correct answers would fail"


def test_tolerance_accepts_a_result_rounded_once_and_rejects_a_wrong_one():
    a = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(a * (1 + 1e-7), a, **dev.tolerance(a.dtype))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(a * 1.01, a, **dev.tolerance(a.dtype))


def test_describe_names_device_and_torch():
    text = dev.describe(torch.device("cpu"))
    assert "cpu" in text and torch.__version__ in text
