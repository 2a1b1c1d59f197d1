"""CPU time of CLI start-up: ``posenc --help``, subcommand help, ``posenc list`` and an
argument error, each in a fresh interpreter, against ``import torch`` alone (what every call
paid before the CLI stopped importing it). Medians of interleaved rounds, user + system CPU of
the child (``resource.RUSAGE_CHILDREN``), so a loaded machine shifts wall time more than this.

    python benchmarks/cli_startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys

CASES = {
    "posenc --help": ["-m", "posenc", "--help"],
    "posenc lab --help": ["-m", "posenc", "lab", "--help"],
    "posenc extend run --help": ["-m", "posenc", "extend", "run", "--help"],
    "posenc bench rope --help": ["-m", "posenc", "bench", "rope", "--help"],
    "posenc list": ["-m", "posenc", "list"],
    "posenc lab --bogus (error)": ["-m", "posenc", "lab", "--bogus"],
    "python -c 'import torch' (reference)": ["-c", "import torch"],
}


def _cpu_seconds(args: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(rounds):  # interleaved: each round runs every case once
        for name, args in CASES.items():
            samples[name].append(_cpu_seconds(args))
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{rounds} rounds, median CPU seconds (user + sys)\n")  # fmt: skip
    print("| command | CPU s (median) | min | max |\n|---|---:|---:|---:|")
    for name, xs in samples.items():
        print(f"| `{name}` | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")


if __name__ == "__main__":
    main()
