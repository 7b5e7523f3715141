"""The typed configuration schema: every default lives here once (the model's shape in model.py's GPTConfig,
which ModelConfig extends, since model.py stays free of any config framework).

Hydra composes `configs/` (named presets per group) on top of these dataclasses, so a misspelt key or a
value of the wrong type fails at start-up, in one line (attnlab/cli.py); each dataclass checks its own values in
`__post_init__`. `train.py`, `sample.py` and `scripts/evaluate.py` receive plain dataclasses; `compose(...)` gives the
same ones to scripts and tests.
"""
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from attnlab.decode import check_sampling
from attnlab.rnn import RNNConfig
from model import GPTConfig, require

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
MODEL_TYPES = ("gpt", "lstm", "gru", "mingru")
CORPORA = ("stdlib", "shakespeare_char", "shakespeare", "text")
TOKENIZERS = ("char", "gpt2", "bpe")
DTYPES = ("auto", "float32", "bfloat16", "float16")
FINE_TUNE_MAX_LR = 3e-4  # the largest learning rate train.init_from accepts (nanoGPT fine-tunes GPT-2 at 3e-5)


@dataclass
class ModelConfig(GPTConfig):
    # gpt (model.py) | lstm | gru | mingru (attnlab/rnn.py: n_layer layers of n_embd; attention fields unused)
    type: str = "gpt"

    def __post_init__(self):
        require(self.type in MODEL_TYPES, f"model.type={self.type!r} is unknown; use one of {', '.join(MODEL_TYPES)}")
        self.architecture()  # the chosen model validates the fields it reads, and only those

    def architecture(self) -> GPTConfig | RNNConfig:
        """The chosen model's own config, from the fields that model reads."""
        cls = GPTConfig if self.type == "gpt" else RNNConfig
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


@dataclass
class DataConfig:
    name: str = "stdlib"  # the corpus: stdlib (built in) | shakespeare_char | shakespeare | text
    path: str | None = None  # a local UTF-8 text file, or a folder of .txt/.md/.jsonl/.jsonl.gz/.parquet documents
    url: str | None = None  # where a downloadable corpus comes from
    tokenizer: str = "char"  # char (vocabulary from the corpus) | gpt2 (GPT-2's BPE) | bpe (a BPE of the corpus's own)
    bpe_file: str | None = None  # a local gpt2.tiktoken ranks file, for the gpt2 tokenizer offline
    bpe_vocab_size: int = 4096  # tokenizer=bpe: its vocabulary (256 bytes, merges, end-of-text); 4096 to 65536 typical
    text_field: str = "text"  # the key of a .jsonl record, or the column of a .parquet file, that holds a document
    num_proc: int = 0  # worker processes tokenizing the corpus; 0 means one per CPU core
    val_fraction: float = 0.1  # the last 10% of the token stream is the validation split
    dir: str = "data/prepared"  # prepared corpora live in dir/<name>-<tokenizer>-<source hash>/

    def __post_init__(self):
        require(self.name in CORPORA, f"data.name={self.name!r} is unknown; use one of {', '.join(CORPORA)}")
        require(self.tokenizer in TOKENIZERS,
                f"data.tokenizer={self.tokenizer!r} is unknown; use one of {', '.join(TOKENIZERS)}")
        require(0 < self.val_fraction < 1, f"data.val_fraction={self.val_fraction} must be between 0 and 1, e.g. 0.1")
        require(self.num_proc >= 0, f"data.num_proc={self.num_proc} must be >= 0 (0: one per CPU core)")
        require(self.bpe_vocab_size >= 258, f"data.bpe_vocab_size={self.bpe_vocab_size} must be at least 258 (256 "
                                            f"bytes, a merge and end-of-text), e.g. 4096")
        require(self.name != "stdlib" or not (self.path or self.url),
                "data=stdlib reads the Python standard library, not data.path or data.url; add data=text to train "
                "on your own text")


@dataclass
class RuntimeConfig:
    """Where and how the arithmetic runs, for training and sampling alike."""
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:1 | mps
    dtype: str = "auto"  # auto (bf16 autocast where native: runtime.native_bf16) | float32 | bfloat16 | float16
    # training: initial weights and dropout (each micro-batch is drawn from seed, step and micro-step); sampling: draws
    seed: int = 1337

    def __post_init__(self):
        require(self.dtype in DTYPES, f"dtype={self.dtype!r} is unknown; use one of {', '.join(DTYPES)}")


@dataclass
class TrainConfig(RuntimeConfig):
    compile: bool = False  # torch.compile the model (pays off on long GPU runs)
    batch_size: int = 16  # sequences per micro-batch, per process
    tokens_per_step: int = 0  # tokens per optimizer step across processes; 0 means one micro-batch each
    max_iters: int = 350  # optimizer steps
    learning_rate: float = 2e-3  # peak learning rate
    min_lr: float = 1e-4  # learning rate at the end of the decay
    warmup_iters: int = 100  # linear warmup steps
    weight_decay: float = 0.1  # AdamW decay, on matrices only
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # clip the global gradient norm; 0 disables
    eval_interval: int = 200  # steps between validation estimates (and checkpoints)
    eval_iters: int = 20  # validation batches per estimate (fixed batches, same every time)
    checkpoint_interval: int = 0  # steps between checkpoints; 0 means at every evaluation
    resume: bool = False  # continue from out_dir/ckpt.pt
    init_from: str | None = None  # fine-tune GPT-2: gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a save_pretrained dir
    skip_nonfinite: bool = False  # skip a step whose loss is nan/inf (no update; counted, logged) instead of stopping
    optimizer: str = "muon"  # muon (Muon for the GPT blocks' and the RNN's matrices, AdamW for the rest) | adamw
    muon_lr: float = 0.02  # Muon's peak learning rate; it follows learning_rate's warmup and decay
    muon_momentum: float = 0.85  # Muon's (Nesterov) momentum
    time_budget_s: float = 0.0  # stop after this many seconds of training, the lr decaying over them; 0 = off
    final_eval: str = "estimate"  # the last evaluation's val loss: estimate (eval_iters batches) | full (whole split)
    # how several processes (torchrun) share the work: ddp (a whole copy of the model each) | fsdp (FSDP2: each holds
    # 1/N of the weights, gradients and optimizer state, for a model that does not fit one device); one process: unused
    parallel: str = "ddp"

    def __post_init__(self):
        super().__post_init__()
        for name in ("batch_size", "max_iters", "eval_interval", "eval_iters", "learning_rate"):
            if not getattr(self, name) > 0:  # written so that nan fails too
                raise ValueError(f"train.{name}={getattr(self, name)} must be positive")
        for name in ("min_lr", "tokens_per_step", "time_budget_s", "warmup_iters", "checkpoint_interval",
                     "weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"train.{name}={getattr(self, name)} must be >= 0")
        if self.optimizer == "muon" and not self.muon_lr > 0:
            raise ValueError(f"train.muon_lr={self.muon_lr} must be positive")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"train.{name}={getattr(self, name)} must be in [0, 1), e.g. 0.9")
        if self.min_lr > self.learning_rate:
            raise ValueError(f"train.min_lr={self.min_lr:g} is above train.learning_rate={self.learning_rate:g}, the "
                             f"peak it decays from; lower min_lr")
        choices = dict(optimizer=("adamw", "muon"), final_eval=("estimate", "full"), parallel=("ddp", "fsdp"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"train.{name}={getattr(self, name)!r} is unknown; use one of {', '.join(allowed)}")
        # published weights take small steps: the from-scratch defaults (Muon, 2e-3) erase what they learnt
        if self.init_from and (self.optimizer == "muon" or self.learning_rate > FINE_TUNE_MAX_LR):
            raise ValueError(f"train.init_from={self.init_from} with train.optimizer={self.optimizer} at train."
                             f"learning_rate={self.learning_rate:g} would erase the published weights' learning; add "
                             f"experiment=finetune_gpt2 (AdamW at a constant 3e-5), or set train.optimizer=adamw and "
                             f"train.learning_rate <= {FINE_TUNE_MAX_LR:g}")


@dataclass
class LoggerConfig:
    log_interval: int = 10  # steps between metric lines
    wandb: bool = False  # also log to Weights & Biases
    # each None below leaves the choice to wandb's own setting, as for any wandb user; a value set here wins over it
    wandb_project: str | None = None  # None: WANDB_PROJECT, else attnlab
    wandb_run_name: str | None = None  # None: WANDB_NAME, else the out_dir's name
    wandb_group: str | None = None  # runs shown together; None: a sweep's out_dir's name, else WANDB_RUN_GROUP
    wandb_mode: str | None = None  # online | offline (to disk; `wandb sync` uploads) | disabled; None: WANDB_MODE

    def __post_init__(self):
        if self.log_interval <= 0:
            raise ValueError(f"logger.log_interval={self.log_interval} must be positive")
        if self.wandb_mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"logger.wandb_mode={self.wandb_mode!r} is unknown; use online, offline or disabled, or "
                             f"null to follow WANDB_MODE")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    out_dir: str = "out"  # checkpoints, metrics, the resolved config and the loss curve


@dataclass
class SampleConfig(RuntimeConfig):
    out_dir: str = "out"  # the training run to sample from
    checkpoint: str = "best"  # best (lowest val loss, else latest) | latest
    prompt: str = "\n"  # text to continue
    prompts: list[str] = field(default_factory=list)  # several prompts, sampled as one left-padded batch
    prompt_file: str | None = None  # read the prompt from this file instead
    num_samples: int = 1  # samples, generated as one batch
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0 is greedy; higher is more random
    top_k: int | None = 200  # keep the k likeliest tokens; None keeps all
    top_p: float | None = None  # keep the smallest set holding this much probability; None keeps all
    kv_cache: bool = True  # reuse past keys and values instead of recomputing the context each token
    init_from: str | None = None  # sample published GPT-2 instead of a run: gpt2 | ... | a save_pretrained dir
    bpe_file: str | None = None  # with init_from: a local gpt2.tiktoken file, for the tokenizer offline

    def __post_init__(self):
        super().__post_init__()
        require(self.checkpoint in ("best", "latest"), f"checkpoint={self.checkpoint!r} is unknown; use best or latest")
        require(self.num_samples >= 1, f"num_samples={self.num_samples} must be >= 1")
        check_sampling(self.max_new_tokens, self.temperature, self.top_k, self.top_p)


@dataclass
class EvalConfig(RuntimeConfig):
    out_dir: str = "out"  # the training run to score
    checkpoint: str = "best"  # best (lowest val loss, else latest) | latest
    text: str | None = None  # a UTF-8 text file to score, every token of it
    split: str | None = None  # or a split of the corpus the run trained on: val | train; neither given: val
    batch_size: int = 16  # windows of block_size tokens scored at once; the result is the same up to rounding
    json: bool = False  # print one JSON object, for scripts, instead of the readable block

    def __post_init__(self):
        super().__post_init__()
        require(self.checkpoint in ("best", "latest"), f"checkpoint={self.checkpoint!r} is unknown; use best or latest")
        require(self.split in (None, "val", "train"), f"split={self.split!r} is unknown; use val or train")
        require(not (self.text and self.split), "pass text=FILE or split=val|train, not both")
        require(self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1")


@dataclass
class AttentionConfig(RuntimeConfig):
    out_dir: str = "out"  # the training run shown: a GPT's heads and its loss per token, an RNN's loss only
    checkpoint: str = "best"  # best (lowest val loss, else latest) | latest; compare's too
    text: str | None = None  # the text to read, given inline: text="def f(x): return x"
    text_file: str | None = None  # or a UTF-8 file holding it
    compare: str | None = None  # a second run (an LSTM, a minGRU, another GPT) scored token by token on the same text
    max_tokens: int = 2000  # a longer text is cut to its first max_tokens tokens, which keeps the page light
    page: str | None = None  # the HTML file written; None: out_dir/attention.html

    def __post_init__(self):
        super().__post_init__()
        require(self.checkpoint in ("best", "latest"), f"checkpoint={self.checkpoint!r} is unknown; use best or latest")
        require(self.text is None or self.text_file is None, "pass text=\"...\" or text_file=FILE, not both")
        require(2 <= self.max_tokens <= 65535, f"max_tokens={self.max_tokens} must be between 2 (the first token is "
                                               f"only context) and 65535 (the page holds positions in 16 bits)")


@dataclass
class ExportConfig:
    out_dir: str = "out"  # the training run to export (trained with model=gpt2, any size)
    checkpoint: str = "best"  # best (lowest val loss, else latest) | latest
    hf_dir: str | None = None  # where the Hugging Face folder goes; None: out_dir/hf

    def __post_init__(self):
        require(self.checkpoint in ("best", "latest"), f"checkpoint={self.checkpoint!r} is unknown; use best or latest")


@dataclass
class HellaSwagConfig(RuntimeConfig):
    out_dir: str = "out"  # the training run to score (any tokenizer); unused with init_from
    checkpoint: str = "best"  # best (lowest val loss, else latest) | latest
    init_from: str | None = None  # score published GPT-2 instead of a run: gpt2 | ... | a save_pretrained dir
    bpe_file: str | None = None  # with init_from: a local gpt2.tiktoken file, for the tokenizer offline
    # the official hellaswag_val.jsonl; None: data/hellaswag/hellaswag_val.jsonl, downloaded there the first time
    data_path: str | None = None
    limit: int | None = None  # score only the first N examples; None: all 10,042
    batch_size: int = 4  # examples scored at once (4 candidates each); the result is the same up to rounding
    json: bool = False  # print one JSON object, for scripts, instead of the readable block

    def __post_init__(self):
        super().__post_init__()
        require(self.checkpoint in ("best", "latest"), f"checkpoint={self.checkpoint!r} is unknown; use best or latest")
        require(self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1")
        require(self.limit is None or self.limit >= 1, f"limit={self.limit} must be >= 1, or null for every example")
        require(self.bpe_file is None or self.init_from is not None,
                "bpe_file sets init_from's tokenizer, and a run (out_dir) brings its own; drop bpe_file or add "
                "init_from=gpt2")


def flatten(tree, prefix=""):
    """{"model": {"n_layer": 2}} as {"model.n_layer": 2}, the spelling of a command-line override."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def nested(flat_dict):
    """{"model.n_layer": 2} as {"model": {"n_layer": 2}}: flatten undone."""
    out = {}
    for key, value in flat_dict.items():
        *groups, name = key.split(".")
        node = out
        for group in groups:
            node = node.setdefault(group, {})
        node[name] = value
    return out


# keys a resumed run cannot change: the model's shape and kind, the corpus's tokens, the optimizer's state
FROZEN_ON_RESUME = ("model.", "data.name", "data.tokenizer", "data.bpe_vocab_size", "data.text_field",
                    "data.val_fraction", "train.optimizer", "train.init_from")


def resumed_config(dict_cfg, saved, overrides) -> Config:
    """The config a resumed run continues with: saved (its checkpoint's, as a dict), plus the keys this command line
    (overrides, dict_cfg its composition) gives; says what changed."""
    asked = OmegaConf.to_container(dict_cfg, resolve=True)
    cfg, changed = resume_config(saved, asked, keys_given(overrides, dict_cfg))
    if changed and int(os.environ.get("RANK", "0")) == 0:
        changes = ", ".join(f"{key}={new!r} (was {old!r})" for key, (old, new) in changed.items())
        print(f"resuming {cfg.out_dir} with {changes}")
    return cfg


def keys_given(overrides, dict_cfg):
    """The config keys a command line sets: each key=value, and each key that a preset chosen with group=option
    changes (against the same command line without the presets)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    keys = {o.key_or_group for o in parsed if not o.key_or_group.startswith("hydra") and not o.is_delete()}
    groups = {key for key in keys if (CONFIG_DIR / key).is_dir()}
    if not groups:
        return keys
    plain = [text for text, o in zip(overrides, parsed) if o.key_or_group not in groups]
    without = flatten(OmegaConf.to_container(hydra.compose(config_name="config", overrides=plain), resolve=True))
    asked = flatten(OmegaConf.to_container(dict_cfg, resolve=True))
    return (keys - groups) | {key for key, value in asked.items() if without.get(key) != value}


def resume_config(saved: dict, asked: dict, given: set[str]) -> tuple[Config, dict]:
    """What a resumed run continues with: its saved config (a key it lacks takes today's default; one today's schema
    lacks is dropped), plus the keys given on the command line now. A given key that cannot change mid-run and differs
    is refused, naming each one with its saved and asked value. Returns the config and {key: (saved, now)} for every
    key that changed."""
    saved_flat = {**flatten(asdict(Config())), **flatten(saved)}
    asked_flat = flatten(asked)
    values = {key: saved_flat[key] for key in asked_flat}
    values["out_dir"] = asked_flat["out_dir"]
    values["train.resume"] = True
    changed = {key: (values[key], asked_flat[key]) for key in sorted(given & asked_flat.keys())
               if asked_flat[key] != values[key] and key not in ("out_dir", "train.resume")}
    frozen = [f"{key}={old!r} vs {new!r}" for key, (old, new) in changed.items() if key.startswith(FROZEN_ON_RESUME)]
    if frozen:
        raise ValueError(f"{values['out_dir']} was trained with other values of keys a run cannot change mid-way "
                         f"(saved vs now): {', '.join(frozen)}; drop those overrides to resume, or train anew in "
                         f"another out_dir")
    values.update({key: new for key, (_, new) in changed.items()})
    merged = OmegaConf.merge(OmegaConf.structured(Config), nested(values))
    return OmegaConf.to_object(merged), changed


def register_configs():
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(name="sample_schema", node=SampleConfig)
    cs.store(name="evaluate_schema", node=EvalConfig)
    cs.store(name="attention_schema", node=AttentionConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(name="hellaswag_schema", node=HellaSwagConfig)


def compose(*overrides, config_name="config"):
    """The dataclass that `python train.py OVERRIDES` runs (config_name="sample": sample.py's), without Hydra's
    run directory or logging: for scripts and tests."""
    register_configs()
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return OmegaConf.to_object(hydra.compose(config_name=config_name, overrides=list(overrides)))
