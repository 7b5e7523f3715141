"""attnlab/hf.py and scripts/export.py (its CLI) against transformers' own GPT-2: same logits and same greedy tokens,
both directions; offline."""
import base64
import io
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import SHARED_DATA, run_in_process, tiny_config  # noqa: E402

from attnlab.checkpoint import build_model, load_checkpoint, load_model, save_checkpoint  # noqa: E402
from attnlab.config import ExportConfig, ModelConfig, SampleConfig  # noqa: E402
from attnlab.decode import generate  # noqa: E402
from attnlab.hf import GPT2_ARCH, from_hf, gpt2_config_problems, hf_tokenizer, to_hf  # noqa: E402
from data.tokenizers import GPT2_EOT, BPETokenizer, CharTokenizer, GPT2Tokenizer  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from sample import sample  # noqa: E402
from scripts.export import export  # noqa: E402
from train import train  # noqa: E402

TINY = dict(n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=101)


def tiny_gpt2_config():
    # no bos/eos: HF would otherwise stop generating at GPT2_EOT, which this vocabulary lacks anyway
    return transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=101, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)


def scramble(model):
    """Weights far from the defaults: zero biases and unit LayerNorms would hide a mapping that drops or swaps
    them, and with GPT-2's small init greedy decoding repeats one token, which hides cache and position bugs."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return model.eval()


def tiny_ours():
    return scramble(GPT(GPTConfig(**TINY, **GPT2_ARCH)))


def assert_same_as_hf(ours, hf, n_new=20):
    torch.manual_seed(1)
    idx = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        diff = (ours(idx)[0] - hf(idx).logits).abs().max().item()
    assert diff < 1e-4
    prompt = idx[:, :6]
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n_new,
                           pad_token_id=0)
    assert len(set(expected[0, 6:].tolist())) > 3  # a varied continuation, so every step's token is checked
    for kv_cache in (True, False):
        got = generate(ours, prompt, n_new, temperature=0, kv_cache=kv_cache)
        assert torch.equal(got, expected), f"kv_cache={kv_cache}"
    return diff


def test_from_hf_matches_transformers(tmp_path):
    hf = scramble(transformers.GPT2LMHeadModel(tiny_gpt2_config()))
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert not ours.training and ours.lm_head.weight.dtype == torch.float32 and ours.lm_head.weight.device.type == "cpu"
    assert ours.lm_head.weight is ours.transformer.wte.weight
    assert_same_as_hf(ours, hf)


def test_to_hf_loads_in_transformers(tmp_path):
    ours = tiny_ours()
    to_hf(ours, tmp_path)
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
    assert_same_as_hf(ours, transformers.GPT2LMHeadModel.from_pretrained(tmp_path))


def test_round_trip_keeps_every_tensor(tmp_path):
    ours = tiny_ours()
    to_hf(ours, tmp_path)
    back = from_hf(tmp_path).state_dict()
    for name, w in ours.state_dict().items():
        assert torch.equal(back[name], w), name


def test_incompatible_model_names_what_to_change(tmp_path):
    model = GPT(GPTConfig(**TINY, pos="rope", norm="rmsnorm", bias=False))
    with pytest.raises(ValueError, match="not GPT-2-compatible") as err:
        to_hf(model, tmp_path)
    for field in ("pos='rope'", "norm='rmsnorm'", "bias=False"):
        assert field in str(err.value)
    assert not (tmp_path / "config.json").exists()
    gqa = GPTConfig(**TINY, **GPT2_ARCH, n_kv_head=2)
    assert [p.split("=")[0] for p in gpt2_config_problems(gqa)] == ["n_kv_head"]
    ngrams = GPTConfig(**{**TINY, **GPT2_ARCH, "ngram": 3})  # tables GPT-2 has no place for
    assert [p.split("=")[0] for p in gpt2_config_problems(ngrams)] == ["ngram"]
    assert gpt2_config_problems(GPTConfig(**TINY, **GPT2_ARCH, n_kv_head=4, attn="manual")) == []


def test_cli_exports_a_trained_run(tmp_path):
    cfg = tiny_config(tmp_path, batch_size=4, max_iters=4, eval_interval=4, eval_iters=1)
    cfg.model = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, **GPT2_ARCH)
    train(cfg)
    code, _, err = run_in_process("-m scripts.export", f"out_dir={cfg.out_dir}")
    assert code == 0, err
    ours, _ = load_model(cfg.out_dir, "best", "cpu")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out" / "hf")
    assert hf.config.eos_token_id is None  # a character vocabulary has no GPT2_EOT
    idx = torch.randint(0, ours.config.vocab_size, (1, 10))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max() < 1e-4


def test_export_refuses_an_unknown_checkpoint_name():
    with pytest.raises(ValueError, match=re.escape("checkpoint='newest' is unknown; use best or latest")):
        export(ExportConfig(out_dir="x", checkpoint="newest"))


def test_from_hf_offline_says_what_to_do(monkeypatch, tmp_path):
    import huggingface_hub.constants
    monkeypatch.chdir(tmp_path)  # so that "gpt2" cannot be a local folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these once at import, which importorskip above already did
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError) as err:
        from_hf("gpt2")
    message = str(err.value)
    assert "'gpt2'" in message and "offline" in message and "save_pretrained" in message
    assert "\n" not in message
    with pytest.raises(ValueError, match="'./nowhere' is not a directory; pass a folder written by save_pretrained"):
        from_hf("./nowhere")


def test_train_and_sample_start_from_a_local_gpt2(tmp_path):
    # GPT-2's ranks file where present; else a table of single bytes (real GPT-2 ids for bytes, no merges)
    bpe = SHARED_DATA / "gpt2.tiktoken"
    if not bpe.exists():
        bpe = tmp_path / "bytes.tiktoken"
        bpe.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    hf_dir = tmp_path / "hf"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32,
                                                         vocab_size=GPT2_EOT + 1)).save_pretrained(hf_dir)
    cfg = tiny_config(tmp_path, init_from=str(hf_dir), batch_size=2, max_iters=2, eval_interval=2, eval_iters=1,
                      optimizer="adamw", learning_rate=1e-12, min_lr=0.0, weight_decay=0.0)
    cfg.model = ModelConfig(block_size=16)
    cfg.data.tokenizer, cfg.data.bpe_file = "gpt2", str(bpe)
    train(cfg)
    ckpt = load_checkpoint(tmp_path / "out" / "ckpt.pt")
    assert ckpt["model_config"]["n_embd"] == 16 and ckpt["model_config"]["block_size"] == 16  # cropped from 32
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_dir)
    torch.testing.assert_close(ckpt["model"]["transformer.wte.weight"], hf.transformer.wte.weight.detach())
    if bpe.name == "bytes.tiktoken":
        pytest.skip(f"sampling needs GPT-2's ranks file ({SHARED_DATA / 'gpt2.tiktoken'}): a random model emits "
                    "ids beyond the bytes table")
    texts = sample(SampleConfig(init_from=str(hf_dir), bpe_file=str(bpe), prompt="the fox", max_new_tokens=5,
                                temperature=0, device="cpu"), out=io.StringIO())
    assert texts[0].startswith("the fox") and len(texts[0]) > len("the fox")


TEXTS = ["hello world", "Hello, I'm a language model,\n\n  spaced   out\tand tabbed", "naïve café — 日本語 🙂",
         "don't stop: 1234567 it's 3.14!", ""]


def exported_tokenizer(tokenizer, tmp_path):
    hf_tokenizer(tokenizer, transformers).save_pretrained(tmp_path / "tok")
    return transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")


@pytest.mark.parametrize("kind", ["char", "tiny gpt2", "gpt2", "bpe"])
def test_the_exported_tokenizer_encodes_and_decodes_as_ours(kind, tmp_path, tiny_bpe):
    corpus = "".join(TEXTS) * 20
    if kind == "char":
        ours, texts = CharTokenizer(sorted(set(corpus))), TEXTS
    elif kind == "tiny gpt2":
        ours, texts = GPT2Tokenizer(tiny_bpe), TEXTS
    elif kind == "gpt2":
        if not (SHARED_DATA / "gpt2.tiktoken").exists():
            pytest.skip("needs ../shared/data/gpt2.tiktoken")
        ours, texts = GPT2Tokenizer(SHARED_DATA / "gpt2.tiktoken"), TEXTS
    else:
        ours, texts = BPETokenizer.train([corpus] * 5, 300), TEXTS
    theirs = exported_tokenizer(ours, tmp_path)
    for text in texts:
        ids = ours.encode(text)
        assert theirs(text)["input_ids"] == ids, text
        assert theirs.decode(ids) == text
    if kind != "char":
        assert theirs.eos_token_id == ours.eot_token


def test_a_pipeline_generates_from_the_exported_folder_alone_as_sample_py_does(tmp_path):
    cfg = tiny_config(tmp_path, batch_size=4, max_iters=2, eval_interval=2, eval_iters=1)
    cfg.model = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, **GPT2_ARCH)
    train(cfg)
    for name in ("best.pt", "ckpt.pt"):  # weights far from the init, so that greedy decoding varies
        ckpt = load_checkpoint(tmp_path / "out" / name)
        model = build_model(ckpt["model_config"])
        model.load_state_dict(ckpt["model"])
        save_checkpoint(tmp_path / "out" / name, {**ckpt, "model": scramble(model).state_dict()})
    hf_dir = export(ExportConfig(out_dir=cfg.out_dir))
    pipe = transformers.pipeline("text-generation", model=hf_dir)  # the folder alone: model and tokenizer
    theirs = pipe("def f1", max_new_tokens=20, do_sample=False)[0]["generated_text"]
    ours = sample(SampleConfig(out_dir=cfg.out_dir, prompt="def f1", max_new_tokens=20, temperature=0, device="cpu",
                               dtype="float32"), out=io.StringIO())
    assert theirs == ours[0] and len(set(theirs[6:])) > 1
