"""Run train() under torchrun, then check that every rank ended with the same parameters (tests/test_distributed.py).

    torchrun --standalone --nproc_per_node=2 -m tests.ddp_driver KEY=VALUE ...   # the overrides train.py takes

Rank 0 prints one line, `parameter sha256 by rank: <hash> <hash> ...`.
"""
import hashlib
import sys
from pathlib import Path

import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train as train_module


def main():
    dist.init_process_group("gloo")  # set up here, so train() leaves it up for the comparison below
    models = []
    build_model = train_module.build_model
    train_module.build_model = lambda model_cfg: models.append(build_model(model_cfg)) or models[-1]
    with initialize_config_dir(config_dir=str(Path(train_module.__file__).parent / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=sys.argv[1:]))
    train_module.train(cfg)
    weights = b"".join(p.detach().numpy().tobytes() for p in models[0].parameters())
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, hashlib.sha256(weights).hexdigest())
    if dist.get_rank() == 0:
        print(f"parameter sha256 by rank: {' '.join(digests)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
