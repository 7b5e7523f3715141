"""The bridge to Hugging Face GPT-2, both ways: `to_hf` writes our GPT as a GPT-2 folder, `from_hf("gpt2")` or
`from_hf(local_dir)` gives our GPT with GPT-2's weights (train.init_from and sample.py's init_from use it;
scripts/export.py is its command line), and `hf_tokenizer` our tokenizers as transformers' own. Only models built the
GPT-2 way convert (GPT2_ARCH; configs/model/gpt2.yaml). transformers is an optional dependency, imported only by the
functions that need it.
"""
import os
from dataclasses import asdict, replace

import torch

from data.tokenizers import EOT, GPT2_EOT, CharTokenizer, GPT2Tokenizer
from model import GPT, GPTConfig

# HF GPT-2 keeps these in Conv1D layers, stored (in, out); our nn.Linear stores (out, in). Every other tensor
# has the same name and shape on both sides, because model.py follows GPT-2's module names.
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# How GPT-2 computes, in GPTConfig's terms (Radford et al. 2019); the sizes come from each checkpoint
GPT2_ARCH = dict(pos="learned", norm="layernorm", bias=True, mlp="gelu", tie_weights=True, qk_norm=False, window=0,
                 ngram=0)


def gpt2_config_problems(config: GPTConfig) -> list[str]:
    """What stops config from being a GPT-2; empty when it is one."""
    problems = [f"{name}={getattr(config, name)!r} (GPT-2 uses {value})" for name, value in GPT2_ARCH.items()
                if getattr(config, name) != value]
    if config.kv_heads != config.n_head:
        problems.append(f"n_kv_head={config.n_kv_head} (GPT-2 has one key/value head per query head)")
    return problems


def import_transformers(purpose):
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{purpose} needs transformers: pip install -e '.[hf]'") from None
    return transformers


def to_hf(model: GPT, out_dir, tokenizer=None):
    """Write model into out_dir as a Hugging Face GPT-2 (config.json, model.safetensors), and with tokenizer (one of
    data/tokenizers.py's) its tokenizer files, so that `pipeline("text-generation", out_dir)` needs nothing else."""
    if not isinstance(model, GPT):
        raise ValueError(f"this run's model.type is {model.config.type}, not gpt; only a GPT trained with model=gpt2 "
                         "exports to GPT-2's format")
    c = model.config
    problems = gpt2_config_problems(c)
    if problems:
        raise ValueError(f"model is not GPT-2-compatible: {', '.join(problems)}; "
                         "train with model=gpt2 (keeping your own n_layer, n_head, n_embd)")
    transformers = import_transformers("exporting to Hugging Face")
    # a vocabulary smaller than the GPT-2 BPE (characters, say) has no <|endoftext|>; HF warns on out-of-range ids
    eos = GPT2_EOT if c.vocab_size > GPT2_EOT else None
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True)
    hf = transformers.GPT2LMHeadModel(hf_config)
    state = {name: w.t() if name.endswith(CONV1D_WEIGHTS) else w for name, w in model.state_dict().items()}
    hf.load_state_dict(state)  # strict: a name or shape that does not map fails here, not in a later load
    hf.save_pretrained(out_dir)
    if tokenizer is not None:
        hf_tokenizer(tokenizer, transformers).save_pretrained(out_dir)


def byte_symbols():
    """GPT-2's printable stand-in for each byte, as its vocab.json spells tokens (Radford et al.'s encoder.py)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in symbols]
    symbols.update({b: chr(256 + n) for n, b in enumerate(others)})
    return symbols


def merge_parts(ranks, token, rank):
    """The two tokens that the merge of rank `rank` joins into `token`: byte-pair encoding of token's bytes with the
    merges before it only; None for a token no merge makes (a byte, or an id a ranks file fills unreachably)."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        pairs = [(ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1)]
        best, i = min(pairs)
        if best >= rank:
            return None
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) == 2 and ranks.get(parts[0]) is not None and ranks.get(parts[1]) is not None:
        return parts
    return None


def hf_tokenizer(tokenizer, transformers):
    """Our tokenizer as a transformers fast tokenizer that encodes and decodes alike: characters as a vocabulary of
    single characters, a byte-level BPE (GPT-2's or the corpus's own) as its vocabulary, merges and pre-tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        vocab = {c: i for i, c in enumerate(tokenizer.chars)}
        fast = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: each character is its own token
        fast.decoder = decoders.Fuse()
        return transformers.PreTrainedTokenizerFast(tokenizer_object=fast, clean_up_tokenization_spaces=False)
    enc = tokenizer.enc
    ranks = {}
    for i in range(enc.n_vocab):
        if not enc.is_special_token(i):
            try:
                ranks[enc.decode_single_token_bytes(i)] = i
            except KeyError:  # an id that no token has
                pass
    symbols = byte_symbols()
    spell = lambda token: "".join(symbols[b] for b in token)  # noqa: E731
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = merge_parts(ranks, token, rank)
        if parts is not None:
            merges.append((spell(parts[0]), spell(parts[1])))
    fast = Tokenizer(models.BPE(vocab={spell(token): rank for token, rank in ranks.items()}, merges=merges))
    if isinstance(tokenizer, GPT2Tokenizer):
        fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's own regex
    else:
        fast.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(tokenizer.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens([AddedToken(EOT, special=True)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=fast, eos_token=EOT, bos_token=EOT,
                                                clean_up_tokenization_spaces=False)


def from_hf(name_or_path) -> GPT:
    """Our GPT (eval mode, fp32, CPU) holding a Hugging Face GPT-2: a hub name (gpt2, gpt2-medium, gpt2-large,
    gpt2-xl) or a local directory written by save_pretrained."""
    transformers = import_transformers("init_from=gpt2")
    name = os.fspath(name_or_path)
    if name.startswith(("/", ".", "~")) and not os.path.isdir(os.path.expanduser(name)):  # a path, not a Hub name
        raise ValueError(f"{name!r} is not a directory; pass a folder written by save_pretrained, or a Hub name "
                         f"such as gpt2")
    try:
        hf, info = transformers.GPT2LMHeadModel.from_pretrained(name, output_loading_info=True)
    except OSError as e:
        if os.path.isdir(name):
            raise ValueError(f"could not load {name!r} as a Hugging Face GPT-2: {str(e).splitlines()[0]}") from e
        raise ValueError(f"could not load {name!r} from the Hugging Face Hub (offline?); "
                         "pass a local directory written by save_pretrained") from e
    hc = hf.config
    # GPT-2 variants that model.py does not compute; loading them anyway would give quietly wrong logits
    checks = [("model_type", hc.model_type == "gpt2"),
              ("activation_function", hc.activation_function in ("gelu_new", "gelu_pytorch_tanh")),
              ("n_inner", hc.n_inner in (None, 4 * hc.n_embd)),
              ("layer_norm_epsilon", hc.layer_norm_epsilon == 1e-5),
              ("scale_attn_weights", hc.scale_attn_weights),
              ("scale_attn_by_inverse_layer_idx", not hc.scale_attn_by_inverse_layer_idx),
              ("tie_word_embeddings", hc.tie_word_embeddings)]
    problems = [f"{key}={getattr(hc, key)!r}" for key, ok in checks if not ok]
    if info["missing_keys"]:
        problems.append(f"missing weights {sorted(info['missing_keys'])[:3]}")
    if problems:
        raise ValueError(f"{name!r} is not a GPT-2 that model.py can run: {', '.join(problems)}")
    config = GPTConfig(vocab_size=hc.vocab_size, block_size=hc.n_positions, n_layer=hc.n_layer, n_head=hc.n_head,
                       n_embd=hc.n_embd, **GPT2_ARCH)
    model = GPT(config)
    hf_state = hf.state_dict()
    with torch.no_grad():
        for name, w in model.state_dict().items():  # the tied head is written twice, with the same values
            w.copy_(hf_state[name].t() if name.endswith(CONV1D_WEIGHTS) else hf_state[name])
    return model.eval()


def pretrained_gpt2(name_or_path, model_cfg, meta):
    """For train.init_from: GPT-2's weights as model_cfg's type with GPT-2's shape (the block_size and dropout of
    model_cfg) and a state dict cropped to that block_size; meta is the corpus's, whose tokens must be GPT-2's."""
    gpt2 = from_hf(name_or_path)
    if meta["tokenizer"]["type"] != "gpt2":
        raise ValueError(f"init_from={name_or_path} reads GPT-2 tokens; add data.tokenizer=gpt2")
    if meta["vocab_size"] > gpt2.config.vocab_size:
        raise ValueError(f"the corpus's tokenizer has {meta['vocab_size']} tokens, {name_or_path} only "
                         f"{gpt2.config.vocab_size}; use data.tokenizer=gpt2 with GPT-2's own ranks file")
    if model_cfg.block_size > gpt2.config.block_size:
        raise ValueError(f"model.block_size={model_cfg.block_size} is longer than {name_or_path}'s "
                         f"{gpt2.config.block_size} positions; pass a smaller model.block_size")
    shape = {**asdict(gpt2.config), "block_size": model_cfg.block_size, "dropout": model_cfg.dropout}
    pretrained_cfg = replace(model_cfg, **shape, type="gpt")
    state = gpt2.state_dict()
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:model_cfg.block_size]
    return pretrained_cfg, state
