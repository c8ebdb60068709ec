"""DeepEP against the all-to-all backend on the same MoE block, one process per GPU (started
by torchrun from tests/gpu_full/test_moe_gpu_full.py).

Every rank builds the same tiny Qwen3-MoE block (the same seed), splits its experts over all
ranks (DTensor Shard(0), as the trainer does), and runs one forward and backward on its own
tokens through each backend in turn. Outputs, input gradients, router and expert gradients
must agree within bf16: the backends move the same rows, so only rounding may differ.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from halo.train.models import moe
    from halo.train.parallel import ep

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("ep",))
    conf = AutoConfig.for_model(
        "qwen3_moe", hidden_size=256, num_experts=4 * world, num_experts_per_tok=4,
        moe_intermediate_size=128, norm_topk_prob=True,
    )  # fmt: skip
    results = []
    for name in ("all_to_all", "deepep"):
        torch.manual_seed(0)
        with torch.device("cuda"):
            hf = Qwen3MoeSparseMoeBlock(conf).to(torch.bfloat16)
        for p in hf.parameters():
            torch.nn.init.normal_(p, std=0.05)
        block = moe.MoeBlock("qwen3_moe", "gate", hf.gate, moe.Experts("qwen3_moe", hf.experts))
        for pname, p in list(block.experts.named_parameters(recurse=False)):
            block.experts.register_parameter(
                pname, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)]))
            )
        group = mesh.get_group()
        block.dispatcher = (
            ep.AllToAll(block.num_experts, group)
            if name == "all_to_all"
            else ep.DeepEP(block.num_experts, group)
        )
        torch.manual_seed(1 + rank)
        x = torch.randn(2, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        out = block(x)
        out.float().square().sum().backward()
        grads = {
            n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).float()
            for n, p in block.named_parameters()
        }
        results.append((out.float().detach(), x.grad.float(), grads))
    (o1, x1, g1), (o2, x2, g2) = results
    torch.testing.assert_close(o2, o1, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x2, x1, atol=5e-2, rtol=5e-2)
    for n in g1:
        torch.testing.assert_close(g2[n], g1[n], atol=5e-2, rtol=5e-2, msg=n)
    dist.barrier()
    print(f"moe dispatch: deepep == all_to_all on rank {rank}/{world}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
