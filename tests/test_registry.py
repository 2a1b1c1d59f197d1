"""The registry's edges: names in any case with "did you mean", option types checked against the
builders' annotations (the error names the option), and a model shape that cannot be built."""

from __future__ import annotations

import pytest

from posenc.registry import BuildContext, build, check_options, entry, names, options

ALL = names()


@pytest.mark.parametrize("name", ALL)
def test_zero_heads_is_a_value_error_naming_num_heads(name: str) -> None:
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got 0"):
        build(name, dim=64, num_heads=0)
    with pytest.raises(ValueError, match="dim must be a positive integer, got -8"):
        build(name, dim=-8, num_heads=4)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        build(name, dim=64, num_heads=4, max_len=0)


def test_build_context_checks_its_sizes() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        BuildContext(dim=8, num_heads=0, head_dim=8, max_len=16)
    with pytest.raises(TypeError, match="causal must be a bool"):
        BuildContext(dim=8, num_heads=1, head_dim=8, max_len=16, causal="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("spelling", ["RoPE", "ROPE", " rope "])
def test_names_are_case_insensitive(spelling: str) -> None:
    assert entry(spelling).name == "rope"
    assert build(spelling, dim=32, num_heads=4).family == "rotary"
    assert options(spelling) == options("rope")


def test_unknown_names_get_suggestions() -> None:
    with pytest.raises(ValueError, match=r"unknown encoding 'rpoe' \(did you mean 'rope'"):
        build("rpoe", dim=8)
    with pytest.raises(ValueError, match=r"'Transformer_XL' \(did you mean 'transformer-xl'"):
        entry("Transformer_XL")
    with pytest.raises(ValueError, match=r"unknown encoding 'zzz'; registered: none, "):
        entry("zzz")  # nothing close: no suggestion
    with pytest.raises(TypeError, match=r"\['bse'\] for encoding 'rope' \(did you mean 'base'\?\)"):
        build("rope", dim=8, bse=500.0)


@pytest.mark.parametrize(
    ("name", "option", "value", "wanted"),
    [
        ("kerple", "eps", None, "float"),  # `posenc lab -e kerple:eps=null`
        ("rope", "base", "500", "float"),
        ("rope", "layout", 1, "str"),
        ("rope", "scaling", ["linear"], "dict or None"),
        ("t5", "num_buckets", 32.0, "int"),
        ("t5", "num_buckets", True, "int"),  # a bool is not a count
        ("t5", "bidirectional", "yes", "bool or None"),
        ("mrope", "mrope_section", [16, "24", 24], "a list of int or None"),
        ("sinusoidal", "scale_input", 1, "bool"),
    ],
)
def test_wrong_option_types_name_the_option(
    name: str, option: str, value: object, wanted: str
) -> None:
    message = f"option '{option}' of encoding '{name}' must be {wanted}, got {value!r}"
    with pytest.raises(TypeError, match=message.replace("[", r"\[").replace("(", r"\(")):
        build(name, dim=32, num_heads=4, **{option: value})


@pytest.mark.parametrize("name", ALL)
def test_every_option_is_type_checked(name: str) -> None:
    """No option takes an arbitrary object: each builder annotates every option."""
    for option in options(name):
        with pytest.raises(TypeError, match=f"option '{option}' of encoding '{name}' must be"):
            check_options(name, {option: object()})


def test_right_types_pass() -> None:
    check_options("rope", {"base": 500, "scaling": {"rope_type": "linear", "factor": 2.0}})
    check_options("mrope", {"mrope_section": (2, 1, 1)})
    check_options("t5", {"bidirectional": None, "num_buckets": 8})
    assert build("rope", dim=32, num_heads=4, base=500).base == 500.0


def test_register_class_reads_options_from_the_class() -> None:
    from torch import nn

    from posenc import registry

    class Scaled(nn.Module):
        family = "bias"

        def __init__(self, num_heads: int, scale: float = 2.0, tag: str | None = None) -> None:
            super().__init__()
            self.num_heads, self.scale, self.tag = num_heads, scale, tag

    registry.register_class(
        "scaled-test", "bias", Scaled, args=lambda ctx: (ctx.num_heads,), options=("scale",)
    )
    try:
        assert registry.options("scaled-test") == {"scale": 2.0}
        m = registry.build("scaled-test", dim=16, num_heads=4, scale=0.5)
        assert (m.num_heads, m.scale, m.tag) == (4, 0.5, None)
        with pytest.raises(TypeError, match="unknown option"):
            registry.build("scaled-test", dim=16, num_heads=4, tag="x")  # not an option
        with pytest.raises(TypeError, match="must be float"):
            registry.build("scaled-test", dim=16, num_heads=4, scale="big")
    finally:
        registry.unregister("scaled-test")
    with pytest.raises(ValueError, match="takes no option"):
        registry.register_class("bad-test", "bias", Scaled, args=lambda c: (), options=("nope",))
    assert "bad-test" not in registry.names()
