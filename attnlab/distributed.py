"""Several processes training one model: torchrun's ranks, DDP or FSDP2, and state dicts that read alike in every mode.

    torchrun --standalone --nproc_per_node=2 train.py                       # DDP: each process holds the whole model
    torchrun --standalone --nproc_per_node=2 train.py train.parallel=fsdp   # FSDP2: each holds 1/2 of its weights,
                                                                            # gradients and optimizer state

Under FSDP a checkpoint gathers the full state dicts (every rank takes part, rank 0 receives them) with the names and
numbering one process's own state_dict() gives, so a checkpoint written under FSDP loads in sample.py and resumes
under DDP or one process, and one written there resumes under FSDP.
"""
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from attnlab.runtime import pick_device
from model import GPT

# FSDP and torch.distributed.checkpoint are imported by the functions that shard (they take a second of start-up,
# which a single process never needs)


@dataclass
class Processes:
    """This process's place in the run (torchrun sets RANK, LOCAL_RANK, WORLD_SIZE) and the device it computes on.
    Rank 0 owns every side effect: files, logs, printing."""
    device: torch.device
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False

    @property
    def master(self):
        return self.rank == 0

    def mean(self, tensor):
        """tensor averaged over every process (itself when alone)."""
        if self.distributed:
            dist.all_reduce(tensor)
            tensor /= self.world_size
        return tensor

    def max_(self, tensor):
        """tensor, in place, the largest of every process's (itself when alone): read on the device, no host wait."""
        if self.distributed:
            dist.all_reduce(tensor, dist.ReduceOp.MAX)
        return tensor

    def max(self, value):
        """The largest of every process's int (a signal number, 0 for none), so all stop at the same step."""
        if not self.distributed:
            return value
        value = torch.tensor(value, device=self.device)  # on the device: NCCL reduces no CPU tensor
        dist.all_reduce(value, dist.ReduceOp.MAX)
        return int(value.item())

    def from_rank0(self, value):
        """rank 0's value of a float, so every process takes the same decision (time-based, or a new best)."""
        if not self.distributed:
            return value
        value = torch.tensor(value, dtype=torch.float64, device=self.device)  # float64: a Python float, unrounded
        dist.broadcast(value, 0)
        return value.item()


def setup_processes(device_name):
    device = pick_device(device_name)
    if "RANK" not in os.environ:
        return Processes(device)
    rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Processes(device, rank, local_rank, world_size, distributed=True)


def shard(model, parallel, procs, dtype=None):
    """With parallel=fsdp and several processes, FSDP2 (fully_shard) in place: each block, then the root (embeddings,
    head, final norm; all of an RNN), keeps 1/world_size of its parameters and gathers the rest only while it runs
    forward or backward. Build the optimizer after it, over the shards. Otherwise the model as it is. dtype: the
    run's autocast dtype (None: fp32); under bf16 the blocks' parameters are gathered in bf16 and the gradients reduced
    in fp32, while the shards, and so the optimizer, stay fp32. The root stays fp32, so the embedding's output, the
    residual stream, is fp32 as in one process (tests/test_distributed.py)."""
    if parallel != "fsdp" or not procs.distributed:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    # autocast computes the blocks' matmuls in bf16 anyway, so bf16 gathers halve their traffic; fp32 reductions keep
    # the gradients' sums exact enough to step with (FSDP2's recommended policy); inputs uncast: the residual stays fp32
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    policy = bf16 if dtype == torch.bfloat16 else MixedPrecisionPolicy()
    for block in model.transformer.h if isinstance(model, GPT) else []:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=MixedPrecisionPolicy())
    return model


def ddp_device_ids(device):
    """DDP's device_ids: the process's own GPU (cuda:LOCAL_RANK under torchrun, --device otherwise); None off CUDA."""
    if device.type != "cuda":
        return None
    return [device.index or 0]


def wrap(model, compile, procs):
    """The model the loop calls: DDP-wrapped and/or compiled (the state keeps the plain one), and the one it
    evaluates with (compiled, not DDP). Compiled around DDP, as PyTorch advises: dynamo then splits the graph at
    DDP's buckets, so each bucket's all-reduce overlaps the rest of the backward. A sharded model needs no wrapper:
    FSDP2 already reduces its gradients."""
    eval_model = torch.compile(model) if compile else model
    if not procs.distributed or is_sharded(model):
        return eval_model, eval_model
    # the only buffers (RoPE and sinusoid tables) are computed identically on every rank: no per-step sync
    ddp = DDP(model, device_ids=ddp_device_ids(procs.device), forward_sync_buffers=False)
    return torch.compile(ddp) if compile else ddp, eval_model


def is_sharded(model):
    """Whether FSDP2 shards model; only a distributed run can."""
    if not dist.is_initialized():
        return False
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def local(tensor):
    """This process's part of tensor: a DTensor's local shard (FSDP2's), which in-place ops update, or the tensor."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def is_dtensor(tensor):
    """Whether tensor is a DTensor (FSDP2's shards), without importing DTensor's module, which pulls in FSDP's: a
    process that never imported it holds none."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def map_replicated(fn, matrices):
    """fn(matrices) for a stack of matrices (n, rows, cols) that every process of the default group holds alike (DDP's
    gradients), each process computing fn on 1/world_size of them: fn must treat each matrix on its own. One
    all-gather."""
    world, rank = dist.get_world_size(), dist.get_rank()
    n = matrices.size(0)
    share = -(-n // world)  # matrices per process
    mine = matrices[rank * share:(rank + 1) * share]
    mine = fn(F.pad(mine, (0, 0, 0, 0, 0, share - mine.size(0))))  # the last processes' shares padded with zeros
    gathered = mine.new_empty(world * share, *mine.shape[1:])
    dist.all_gather_single(gathered, mine)
    return gathered[:n]


def map_sharded(fn, shards, rows, group):
    """fn of whole matrices, applied to those whose dim-0 shards (FSDP2's, split as torch.chunk splits) the processes
    of group hold: shards (n, local rows, cols) are this process's of n matrices of rows rows. Each process gathers
    1/world_size of the matrices whole, applies fn to them (fn must treat each matrix on its own) and sends each
    process its shards of the results, which come back as shards (n, local rows, cols). Two all-to-alls."""
    world = dist.get_world_size(group)
    n, local_rows, cols = shards.shape
    chunk = -(-rows // world)  # rows per shard, the last shards shorter or empty: padded to it
    share = -(-n // world)  # matrices per process, padded with zeros to a multiple of world
    send = F.pad(shards, (0, 0, 0, chunk - local_rows, 0, world * share - n))  # (world * share, chunk, cols)
    received = torch.empty_like(send)  # from each process, its shard of each of my matrices
    dist.all_to_all_single(received, send, group=group)
    whole = received.view(world, share, chunk, cols).transpose(0, 1).reshape(share, world * chunk, cols)
    done = F.pad(fn(whole[:, :rows]), (0, 0, 0, world * chunk - rows))  # (share, world * chunk, cols)
    send = done.view(share, world, chunk, cols).transpose(0, 1).contiguous()  # to each process, its shards
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.view(world * share, chunk, cols)[:n, :local_rows]


def torch_optimizers(optimizer):
    """The torch optimizers behind optimizer: itself, or optim.Optimizers' several (AdamW and Muon), whose state
    dict is the list of theirs."""
    return getattr(optimizer, "optimizers", [optimizer])


def full_state_dicts(model, optimizer):
    """(model, optimizer) state dicts as one process's own: plain names and CPU tensors, the optimizer's parameters
    numbered. Under FSDP every rank must call it, as it gathers the shards; rank 0 alone gets them, the others {}."""
    if not is_sharded(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    gather = StateDictOptions(full_state_dict=True, cpu_offload=True)  # onto rank 0's CPU; the other ranks get {}
    model.reshard()  # the root keeps its parameters gathered after a forward without backward (an evaluation)
    model_state = get_model_state_dict(model, options=gather)
    if model_state:  # rank 0: one copy of a tied weight (the GPT's wte and lm_head), as state_dict() keeps it
        first = {}
        for name, p in model.state_dict(keep_vars=True).items():
            model_state[name] = model_state[first.setdefault(p, name)]
    # an optimizer with no state yet (before the first step) has no shards; DCP would step it to make some
    states = [numbered(get_optimizer_state_dict(model, o, options=gather)) if o.state else o.state_dict()
              for o in torch_optimizers(optimizer)]
    return model_state, states if hasattr(optimizer, "optimizers") else states[0]


def load_full_state_dicts(model, optimizer, model_state, optimizer_state):
    """Load what full_state_dicts gave, in any mode, into model and optimizer, sharded or not; every rank passes
    the full state dicts and keeps its shards of them."""
    if not is_sharded(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    scatter = StateDictOptions(full_state_dict=True)  # every rank holds the full state dicts; each keeps its shards
    set_model_state_dict(model, model_state, options=scatter)
    name = {p: n for n, p in model.named_parameters()}  # a tied weight by its first name, as DCP names it
    states = optimizer_state if hasattr(optimizer, "optimizers") else [optimizer_state]
    for o, state in zip(torch_optimizers(optimizer), states, strict=True):
        if state["state"]:
            names = [name[p] for group in o.param_groups for p in group["params"]]
            set_optimizer_state_dict(model, o, relabel(state, names), options=scatter)
        else:  # saved before the first step: no shards to scatter
            o.load_state_dict(state)


def numbered(state):
    """A state from get_optimizer_state_dict, keyed by parameter name, keyed as optimizer.state_dict() keys it: by
    number, in the param groups' order. {} (a rank other than 0) stays {}."""
    if not state:
        return state
    names = [name for group in state["param_groups"] for name in group["params"]]
    return relabel(state, {name: i for i, name in enumerate(names)})


def relabel(state, label):
    """An optimizer state dict with each parameter's key k (a number or a name) replaced by label[k]."""
    groups = [{**group, "params": [label[k] for k in group["params"]]} for group in state["param_groups"]]
    return {"state": {label[k]: s for k, s in state["state"].items()}, "param_groups": groups}
