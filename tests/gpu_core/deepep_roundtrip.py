"""DeepEP intranode round trip, one process per GPU (started by torchrun from the GPU tiers).

Each rank routes its tokens to top-k experts spread over all ranks, dispatches them
(NVLink), and combines them back. Combine sums the copies a token sent to each rank
without weights, so combined / (ranks the token went to) must give the token back; the
layout DeepEP computes must agree with the one counted here from the routing.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    import deep_ep

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens, hidden, topk, experts = 256, 4096, 4, 8 * world
    torch.manual_seed(rank)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    scores = torch.rand(tokens, experts, device="cuda") + 1
    topk_idx = scores.topk(topk, dim=-1, sorted=False).indices.to(deep_ep.topk_idx_t)
    weights = torch.rand(tokens, topk, dtype=torch.float32, device="cuda")

    # The layout counted by hand: which ranks each token goes to (its experts' owners).
    owner = topk_idx.long() // (experts // world)
    in_rank = torch.zeros(tokens, world, dtype=torch.bool, device="cuda")
    in_rank.scatter_(1, owner, True)

    buffer = deep_ep.Buffer(dist.group.WORLD, num_nvl_bytes=256 << 20)
    per_rank, _, per_expert, is_in_rank, _ = buffer.get_dispatch_layout(topk_idx, experts)
    assert torch.equal(is_in_rank.bool(), in_rank), "dispatch layout: token -> rank differs"
    assert torch.equal(per_rank.long().cpu(), in_rank.sum(0).long().cpu())
    recv_x, _, recv_w, _, handle, _ = buffer.dispatch(
        x=x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=is_in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=topk_idx,
        topk_weights=weights,
    )
    total = torch.tensor([recv_x.shape[0]], device="cuda")
    dist.all_reduce(total)
    sent = in_rank.sum().reshape(1)
    dist.all_reduce(sent)
    assert int(total) == int(sent), f"received {int(total)} tokens, {int(sent)} were sent"
    combined, _, _ = buffer.combine(x=recv_x, handle=handle, topk_weights=recv_w)
    back = combined.float() / in_rank.sum(1, keepdim=True).float()
    err = float((back - x.float()).abs().max())
    # bf16 sums of identical copies: exact up to one rounding of the sum.
    assert err <= 2e-2 * float(x.float().abs().max()), f"combine(dispatch(x)) != x: {err}"
    dist.barrier()
    print(f"deepep: round trip ok rank {rank}/{world} ({recv_x.shape[0]} tokens in)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
