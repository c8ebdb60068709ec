"""The weights a live vLLM server serves: exactly those of the folder the trainer exported,
and after a push the pushed ones (what online GRPO does after every update, through
halo.rollout.weights), coming back with the original folder."""

from __future__ import annotations

import array
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from rollout_client import Server

from halo.rollout.client import Client
from halo.rollout.weights import check_served, reload

PROBE = "What is 7 + 5? 7 + 5 = 12."


def scaled_copy(src: Path, dst: Path, tensor: str, factor: float) -> Path:
    """``src`` with one float32 tensor of model.safetensors multiplied by ``factor``.

    Standard library only (the tier may run where torch is absent): the file is an 8-byte
    header length, a JSON header of byte offsets, then the raw little-endian tensors.
    """
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    raw = bytearray(path.read_bytes())
    (size,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8 : 8 + size])[tensor]
    assert meta["dtype"] == "F32", meta
    start, end = (8 + size + o for o in meta["data_offsets"])
    values = array.array("f", raw[start:end])
    for i, v in enumerate(values):
        values[i] = v * factor
    raw[start:end] = values.tobytes()
    path.write_bytes(bytes(raw))
    return dst


@pytest.mark.rollout_vllm
def test_pushed_weights_are_served_and_the_originals_come_back(
    vllm_server: Server, served_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = vllm_server.get_json("/v1/models")["data"][0]["id"]
    client = Client(vllm_server.url, model)
    probe = vllm_server.post_json("/tokenize", {"model": model, "prompt": PROBE})["tokens"]
    before = client.prompt_logprobs(probe)
    # Scratch is shared with the server: the same folder here and there, or mounted into this
    # container (HALO_SCRATCH) from where the server sees it (HALO_SERVER_SCRATCH).
    root = Path(os.environ.get("HALO_SCRATCH", str(tmp_path_factory.mktemp("push"))))
    on_server = Path(os.environ.get("HALO_SERVER_SCRATCH", str(root)))
    pushed = root / "weight-push-test"
    shutil.rmtree(pushed, ignore_errors=True)
    scaled_copy(served_folder, pushed, "model.norm.weight", 3.0)
    try:
        reload(client, str(on_server / pushed.name))
        after = client.prompt_logprobs(probe)
        gap = max(abs(a - b) for a, b in zip(before, after, strict=True))
        assert gap > 0.05, f"the server's log-probs did not move after the push ({gap})"
        # The version check accepts the pushed weights' scores and refuses the old ones.
        check_served(client, probe, after, tolerance=1e-4)
        with pytest.raises(Exception, match="serves other weights"):
            check_served(client, probe, before, tolerance=1e-4)
    finally:
        reload(client, os.environ.get("HALO_SERVED_FOLDER_ON_SERVER", str(served_folder)))
        shutil.rmtree(pushed, ignore_errors=True)
    assert check_served(client, probe, before, tolerance=1e-4)[1] <= 1e-4


@pytest.mark.rollout_vllm
def test_the_server_scores_tokens_as_the_trainer_exported_them(
    vllm_server: Server, served_folder: Path
) -> None:
    """Same folder, same log-probs: in transformers (the trainer's side) and in vLLM."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = vllm_server.get_json("/v1/models")["data"][0]["id"]
    ids = vllm_server.post_json("/tokenize", {"model": model, "prompt": PROBE})["tokens"]
    served = Client(vllm_server.url, model).prompt_logprobs(ids)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(served_folder), dtype=torch.float32, local_files_only=True
    ).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = hf(input_ids=x).logits[0, :-1].float()
    mine = torch.log_softmax(logits, -1).gather(1, x[0, 1:, None])[:, 0].tolist()
    gap = max(abs(a - b) for a, b in zip(served, mine, strict=True))
    assert gap <= 1e-3, f"vLLM and transformers disagree on the exported weights by {gap:.4f}"
