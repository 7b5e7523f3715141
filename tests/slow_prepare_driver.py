"""train() under torchrun with a slow corpus preparation and a short process-group timeout (test_process_group.py).

    torchrun --standalone --nproc_per_node=2 -m tests.slow_prepare_driver SECONDS KEY=VALUE ...

The process that prepares the corpus takes SECONDS longer than the group's timeout allows any collective to wait.
"""
import datetime
import sys
import time

import torch.distributed as dist

import data.corpus as corpus
import train as train_module
from attnlab.config import compose


def main():
    delay, overrides = float(sys.argv[1]), sys.argv[2:]
    build = corpus._build_or_clean_up
    corpus._build_or_clean_up = lambda *args: time.sleep(delay) or build(*args)
    init = dist.init_process_group
    dist.init_process_group = lambda *args, **kwargs: init(*args, **kwargs, timeout=datetime.timedelta(seconds=2))
    train_module.train(compose(*overrides))


if __name__ == "__main__":
    main()
