"""The recipe at scale, end to end at toy size: experiment=gpt2_owt from a folder of .parquet and .jsonl.gz documents
(the form FineWeb and OpenWebText dumps come in) through `python -m data.prepare`, torchrun (2 processes, gloo) and
sample.py. The tokens are each document's own GPT-2 tokens followed by <|endoftext|>. Slow: a real torchrun."""
import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import WORDS, run_in_process, run_script

from data.corpus import load_meta, load_split
from data.tokenizers import GPT2Tokenizer

# GPT-2's recipe shrunk to seconds: its data, tokenizer, schedule and logging, with a toy model on the CPU; a toy
# corpus holds out a tenth, where OpenWebText's 0.05% is millions of tokens
TOY = ["experiment=gpt2_owt", "model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=32",
       "train.device=cpu", "train.compile=false", "train.dtype=float32", "train.batch_size=2",
       "train.tokens_per_step=128", "train.max_iters=4", "train.eval_interval=2", "train.eval_iters=1",
       "train.warmup_iters=1", "logger.log_interval=1", "data.val_fraction=0.1"]


def documents(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))).capitalize() + "." for _ in range(n)]


def write_dump(folder):
    """Two parquet shards and a gzipped jsonl shard with 'text' fields among other fields; returns the documents in
    the order the folder sorts them."""
    shards = [documents(60, seed) for seed in range(3)]
    folder.mkdir()
    for i, docs in enumerate(shards[:2]):
        pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), folder / f"train-{i:05d}.parquet",
                       row_group_size=16)
    with gzip.open(folder / "train-00002.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d, "url": f"https://example.com/{i}"}) + "\n" for i, d in enumerate(shards[2]))
    return [d for docs in shards for d in docs]


@pytest.mark.slow
def test_gpt2_owt_from_parquet_and_jsonl_shards_through_torchrun_to_samples(tmp_path, tiny_bpe):
    docs = write_dump(tmp_path / "dump")
    data = [f"data.path={tmp_path / 'dump'}", f"data.bpe_file={tiny_bpe}", f"data.dir={tmp_path / 'prepared'}",
            "data.num_proc=2"]
    code, printed, err = run_in_process("-m data.prepare", *TOY, *data)
    assert code == 0, err[-2000:]
    assert "180 documents" in printed
    folder = next((tmp_path / "prepared").glob("text-gpt2-*[!k]"))
    tok = GPT2Tokenizer(tiny_bpe)
    ids = np.concatenate([load_split(folder, "train"), load_split(folder, "val")]).tolist()
    assert ids == [i for d in docs for i in [*tok.encode(d), tok.eot_token]]
    assert load_meta(folder)["files"] == 3

    out_dir = tmp_path / "run"
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *TOY, *data,
                        f"out_dir={out_dir}", timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 process(es)" in result.stdout and "1 micro-step(s) of 128 tokens" in result.stdout
    assert json.loads((out_dir / "status.json").read_text())["status"] == "finished"

    code, sampled, err = run_in_process("sample.py", f"out_dir={out_dir}", "prompt=The cat", "max_new_tokens=8",
                                        "device=cpu")
    assert code == 0, err[-2000:]
    assert sampled.startswith("The cat")
