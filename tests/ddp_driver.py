"""Run train() under torchrun and print each rank's parameter hash (tests/test_distributed.py).

    torchrun --standalone --nproc_per_node=2 -m tests.ddp_driver KEY=VALUE ...   # the overrides train.py takes

train() sets up and tears down the process group itself, as it does for the CLI; every rank then prints one line,
`rank <r> parameter sha256: <hash>`.
"""
import hashlib
import os
import sys

import train as train_module
from attnlab.config import compose


def main():
    models = []  # the model train() builds, kept to hash it once training is done
    build_model = train_module.build_model
    train_module.build_model = lambda model_cfg: models.append(build_model(model_cfg)) or models[-1]
    train_module.train(compose(*sys.argv[1:]))
    weights = b"".join(p.detach().numpy().tobytes() for p in models[0].parameters())
    line = f"rank {os.environ['RANK']} parameter sha256: {hashlib.sha256(weights).hexdigest()}\n"
    sys.stdout.write(line)  # in one write, newline included: print writes the newline apart, so ranks could glue lines
    sys.stdout.flush()


if __name__ == "__main__":
    main()
