"""Run train() under torchrun and print each rank's parameter hash (tests/test_distributed.py).

    torchrun --standalone --nproc_per_node=2 -m tests.ddp_driver KEY=VALUE ...   # the overrides train.py takes

train() sets up and tears down the process group itself, as it does for the CLI; every rank then prints one line,
`rank <r> parameter sha256: <hash>`.
"""
import hashlib
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train as train_module


def main():
    models = []
    build_model = train_module.build_model
    train_module.build_model = lambda model_cfg: models.append(build_model(model_cfg)) or models[-1]
    with initialize_config_dir(config_dir=str(Path(train_module.__file__).parent / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=sys.argv[1:]))
    train_module.train(cfg)
    weights = b"".join(p.detach().numpy().tobytes() for p in models[0].parameters())
    print(f"rank {os.environ['RANK']} parameter sha256: {hashlib.sha256(weights).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
