"""The bridge to Hugging Face GPT-2, both ways: export a run, or start from published GPT-2 weights.

    python export.py out_dir=out/mini                          # best.pt (else ckpt.pt) -> out/mini/hf
    python export.py out_dir=out/mini checkpoint=latest hf_dir=/tmp/mini-hf

The exported folder (config.json, model.safetensors) loads with
`transformers.GPT2LMHeadModel.from_pretrained(hf_dir)`; `from_hf("gpt2")` or `from_hf(local_dir)` gives our GPT
with GPT-2's weights. Only models built the GPT-2 way convert (configs/model/gpt2.yaml). transformers is an
optional dependency, imported only by the functions that need it.
"""
import os
import sys
import torch

from model import GPT, GPTConfig

# HF GPT-2 keeps these in Conv1D layers, stored (in, out); our nn.Linear stores (out, in). Every other tensor
# has the same name and shape on both sides, because model.py follows GPT-2's module names.
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
GPT2_EOS = 50256  # <|endoftext|>, the last id of the GPT-2 BPE


def gpt2_config_problems(config: GPTConfig) -> list[str]:
    """What stops config from being a GPT-2; empty when it is one."""
    gpt2 = dict(pos="learned", norm="layernorm", bias=True, mlp="gelu", tie_weights=True, qk_norm=False)
    problems = [f"{name}={getattr(config, name)!r} (GPT-2 uses {value})" for name, value in gpt2.items()
                if getattr(config, name) != value]
    if config.kv_heads != config.n_head:
        problems.append(f"n_kv_head={config.n_kv_head} (GPT-2 has one key/value head per query head)")
    return problems


def import_transformers(purpose):
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{purpose} needs transformers: pip install transformers") from None
    return transformers


def to_hf(model: GPT, out_dir):
    """Write model into out_dir as a Hugging Face GPT-2 (config.json, model.safetensors)."""
    c = model.config
    problems = gpt2_config_problems(c)
    if problems:
        raise ValueError(f"model is not GPT-2-compatible: {', '.join(problems)}; "
                         "train with model=gpt2 (keeping your own n_layer, n_head, n_embd)")
    transformers = import_transformers("exporting to Hugging Face")
    # a vocabulary smaller than the GPT-2 BPE (characters, say) has no <|endoftext|>; HF warns on out-of-range ids
    eos = GPT2_EOS if c.vocab_size > GPT2_EOS else None
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.dropout, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=True)
    hf = transformers.GPT2LMHeadModel(hf_config)
    state = {name: w.t() if name.endswith(CONV1D_WEIGHTS) else w for name, w in model.state_dict().items()}
    hf.load_state_dict(state)  # strict: a name or shape that does not map fails here, not in a later load
    hf.save_pretrained(out_dir)


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
                       n_embd=hc.n_embd, bias=True, pos="learned", norm="layernorm", mlp="gelu", tie_weights=True)
    model = GPT(config)
    hf_state = hf.state_dict()
    with torch.no_grad():
        for name, w in model.state_dict().items():  # the tied head is written twice, with the same values
            w.copy_(hf_state[name].t() if name.endswith(CONV1D_WEIGHTS) else hf_state[name])
    return model.eval()


def main(argv):
    args = dict(out_dir=None, checkpoint="best", hf_dir=None)
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in args:
            raise ValueError(f"unknown argument {arg!r}; usage: export.py out_dir=DIR [checkpoint=best|latest] "
                             "[hf_dir=DIR]")
        args[key] = value
    if not args["out_dir"]:
        raise ValueError("out_dir=DIR is required: the training run to export")
    from sample import load_model
    model, _ = load_model(args["out_dir"], args["checkpoint"], "cpu")
    hf_dir = args["hf_dir"] or os.path.join(args["out_dir"], "hf")
    to_hf(model, hf_dir)
    print(f"wrote {hf_dir} from {args['out_dir']}; load it with transformers.GPT2LMHeadModel.from_pretrained({hf_dir!r})")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
