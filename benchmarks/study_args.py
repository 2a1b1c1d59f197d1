"""What the real-model study scripts (``extend_smollm2_tasks.py``, ``extend_gemma3.py``) share
of their command lines."""


def threads(argv: list[str]) -> int:
    """``--threads=N`` (default 1, as most committed rows were measured, the other core free for
    the other study; 2 once only one study is left). Each row records its own count."""
    values = [a.removeprefix("--threads=") for a in argv if a.startswith("--threads")]
    if not values:
        return 1
    if len(values) > 1 or not values[0].isdigit() or int(values[0]) < 1:
        raise SystemExit(f"--threads takes one positive whole number as --threads=N, got {values}")
    return int(values[0])
