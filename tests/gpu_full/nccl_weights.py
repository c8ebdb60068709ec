"""Broadcast a freshly built tiny Llama's weights from rank 0 over NCCL; every other rank
compares them with the same model it built itself from the same seed (torchrun, one GPU each)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    conf = AutoConfig.for_model(
        "llama", vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=512,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16).cuda()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    if rank != 0:
        for v in model.state_dict().values():
            v.zero_()  # what arrives must be the broadcast, not this rank's own init
    for v in model.state_dict().values():
        dist.broadcast(v, src=0)
    torch.cuda.synchronize()
    if rank != 0:
        bad = [k for k, v in model.state_dict().items() if not torch.equal(v, expected[k])]
        assert not bad, f"rank {rank}: {len(bad)} tensors differ, first {bad[0]}"
        print(
            f"nccl: weights identical on rank {rank} (NCCL {torch.cuda.nccl.version()})", flush=True
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
