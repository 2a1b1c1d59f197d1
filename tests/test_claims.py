"""What the project says must be true (DESIGN.md: claims are generated or tested): the READMEs'
list of reversal-blind encodings against the demo's own verdicts, every scheme they call
buildable by name builds, the run time they state, and Attention refusing an encoding it would
silently ignore."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from posenc import Attention, ModelConfig, TransformerLM, build, names
from posenc.demo import reversal_blind


@pytest.mark.parametrize("name", names("absolute"))
def test_attention_refuses_absolute_encodings(name: str) -> None:
    # Inside attention an absolute encoding would do nothing: the layer would equal NoPE.
    enc = build(name, dim=32, num_heads=4)
    with pytest.raises(ValueError, match="absolute encoding: it adds position to the token emb"):
        Attention(32, 4, encoding=enc)
    with pytest.raises(ValueError, match="TransformerLM applies it there"):
        Attention(32, 4, encoding=enc, backend="sdpa")
    # Where it belongs it still works: TransformerLM adds it to the embeddings.
    model = TransformerLM(ModelConfig(vocab_size=7, dim=32, num_heads=4, encoding=name))
    assert model.absolute is not None
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 7)


def test_attention_takes_none_and_nope() -> None:
    x = torch.randn(1, 5, 32)
    torch.manual_seed(0)
    a = Attention(32, 4)
    torch.manual_seed(0)
    b = Attention(32, 4, encoding=build("none", dim=32, num_heads=4))
    torch.testing.assert_close(a(x), b(x))


# --- the READMEs ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
READMES = {"en": ROOT / "README.md", "zh": ROOT / "README.zh-CN.md"}
# Each claim, as each README words it (one sentence or list each).
REVERSAL_BLIND = {"en": r"Blind to reversal: (.+?)\.", "zh": r"对倒序不敏感的编码：(.+?)。"}
BUILDABLE = {"en": r"the registered names are: (.+?)\.", "zh": r"已注册的名称为：(.+?)。"}
MODULES_ONLY = {"en": r"\*\*Modules and functions only\*\*", "zh": r"\*\*仅以模块和函数提供\*\*"}


def readme(lang: str) -> str:
    return READMES[lang].read_text(encoding="utf-8")


def claim(lang: str, pattern: str) -> str:
    """The text the pattern's group captures, with the README's line breaks joined."""
    text = readme(lang)
    flat = re.sub(r"\s*\n\s*", " " if lang == "en" else "", text)
    found = re.findall(pattern, flat)
    assert len(found) == 1, f"{READMES[lang].name}: expected one match of {pattern!r}, got {found}"
    return str(found[0])


@pytest.fixture(scope="module")
def reversal_blind_verdicts() -> list[str]:
    return reversal_blind()  # the demo's own code and examples


@pytest.mark.parametrize("lang", READMES)
def test_readme_reversal_blind_list_is_the_demos(
    lang: str, reversal_blind_verdicts: list[str]
) -> None:
    listed = [n.strip().lower() for n in re.split(r"[,、]", claim(lang, REVERSAL_BLIND[lang]))]
    assert listed == reversal_blind_verdicts, (
        f"{READMES[lang].name} says {listed} are blind to reversal; `posenc demo order` finds "
        f"{reversal_blind_verdicts}"
    )


def test_demo_prints_the_reversal_blind_encodings() -> None:
    from typer.testing import CliRunner

    from posenc.cli import app

    res = CliRunner().invoke(app, ["demo", "order", "--encodings", "none,rope,alibi,kerple"])
    assert res.exit_code == 0, res.output
    assert "Blind to this reordering besides NoPE: alibi, kerple" in " ".join(res.output.split())


@pytest.mark.parametrize("lang", READMES)
def test_readme_buildable_names_build(lang: str) -> None:
    listed = re.findall(r"`([^`]+)`", claim(lang, BUILDABLE[lang]))
    assert sorted(listed) == sorted(names()), "the README's list of names is not the registry's"
    for name in listed:
        enc = build(name, dim=64, num_heads=4, max_len=64)
        if enc.family in ("rotary", "bias", "relative"):
            assert Attention(64, 4, encoding=enc)(torch.randn(1, 6, 64)).shape == (1, 6, 64)
        else:
            model = TransformerLM(ModelConfig(vocab_size=5, dim=64, num_heads=4, encoding=name))
            assert model(torch.zeros(1, 6, dtype=torch.long)).shape == (1, 6, 5)


@pytest.mark.parametrize("lang", READMES)
def test_readme_modules_only_exist_and_are_not_registered(lang: str) -> None:
    text = readme(lang)
    start = re.search(MODULES_ONLY[lang], text)
    assert start is not None
    paragraph = text[start.end() :].split("\n\n")[0]
    paths = [p for p in re.findall(r"`([^`]+)`", paragraph) if p.startswith("posenc.")]
    assert len(paths) == 4, paths  # 2-D sin-cos, 2-D learned, 2-D axial RoPE, MLA
    for path in paths:
        module, attr = path.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), attr), path
        assert attr.lower() not in names()


def test_mrope_by_name_is_rope_on_text_and_mrope_on_grids() -> None:
    mrope, rope = build("mrope", dim=256, num_heads=2), build("rope", dim=256, num_heads=2)
    assert mrope.mrope_section == (16, 24, 24)  # Qwen2-VL's, for head_dim 128
    q = torch.randn(1, 2, 7, 128, dtype=torch.float64)
    k = torch.randn(1, 2, 7, 128, dtype=torch.float64)
    for a, b in zip(mrope(q, k), rope(q, k), strict=True):  # text positions: plain RoPE
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    cols = torch.arange(7)
    grid = torch.stack((0 * cols, cols // 3, cols % 3)).view(3, 1, 7)  # [3, b, s]: t, h, w
    assert not torch.allclose(mrope(q, k, grid)[0], mrope(q, k)[0])


def test_readmes_state_the_measured_run_time() -> None:
    from posenc.lab import DEFAULT_RUN_TIME

    minutes = re.fullmatch(
        r"about (\d+) minutes on two CPU cores \(up to \d+ on .+\)", DEFAULT_RUN_TIME
    )
    assert minutes is not None, DEFAULT_RUN_TIME
    n = minutes.group(1)
    assert f"about {n} min on 2 cores" in readme("en")
    assert f"在 2 核机器上约 {n} 分钟" in readme("zh")
    for lang in READMES:
        # The retired "ten minutes" claim, not a figure that ends in 10 (a study's "110 min").
        assert not re.search(r"ten minutes|(?<!\d)10 min|十分钟|(?<!\d)10 分钟", readme(lang)), lang
