"""A device that is not here is one line naming the fix, before anything loads."""

import pytest
import torch

from specdec.cli import main
from specdec.devices import check_device
from specdec.errors import InvalidParameterError


def test_the_cpu_is_always_there():
    check_device("cpu")
    check_device(torch.device("cpu"))


@pytest.mark.parametrize("device", ["tpu", "gpu:0", "cuda:x", "mps"])
def test_other_devices_are_refused(device):
    with pytest.raises(InvalidParameterError, match="cpu or cuda"):
        check_device(device)


def test_a_cpu_only_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(InvalidParameterError, match="CPU-only build.*docs/guide/gpu.md"):
        check_device("cuda")


def test_no_visible_device_and_an_index_too_far(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(InvalidParameterError, match="finds no CUDA device"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda")
    check_device("cuda:1")
    with pytest.raises(InvalidParameterError, match="2 CUDA device"):
        check_device("cuda:2")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_generate_on_a_missing_gpu_is_one_line(tmp_path, capsys):
    code = main(["generate", "--model", str(tmp_path), "--device", "cuda", "hi"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "cuda" in err and "Traceback" not in err
