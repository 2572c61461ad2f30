"""How long the light commands take to start: ``python -m servesim --help``, ``models``,
``hardware`` and ``step``, as the CPU time (user + system) of the whole process, the minimum over
``--repeat`` runs. CPU time, not wall time, so a busy shared machine does not inflate it; the
minimum, because interference only ever adds. ``python -c pass`` is printed for scale.

Then the import time of the modules behind them (``import servesim.config`` and so on), as
``python -X importtime`` reports it: the cumulative microseconds of the module's own line, the
minimum over ``--repeat`` fresh processes.

    python benchmarks/bench_startup.py                        # this checkout
    python benchmarks/bench_startup.py --pythonpath TREE      # another servesim (e.g. an old one,
                                                              # laid out as .ci/typecheck does)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

COMMANDS = {
    "--help": ["--help"],
    "models": ["models"],
    "hardware": ["hardware"],
    "validate": ["validate", "quickstart"],
    "step": ["step", "--model", "llama-3-8b", "--hardware", "h100-sxm-80gb", "--decode-batch", "64",
             "--decode-context", "1024"],
}

IMPORTS = ("servesim.cli.app", "servesim.config", "servesim.pipeline")


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """user + system CPU seconds of one child process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_seconds(module: str, env: dict[str, str]) -> float:
    """``-X importtime``'s cumulative time of ``import module`` in a fresh process, in seconds."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"import {module} failed: {done.stderr[-500:]}")
    for line in reversed(done.stderr.splitlines()):
        fields = line.split("|")
        if line.startswith("import time:") and len(fields) == 3 and fields[2].strip() == module:
            return int(fields[1]) / 1e6
    raise SystemExit(f"-X importtime printed no line for {module}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--pythonpath", default=None, help="PYTHONPATH of another servesim to time")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    if env.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set, so every process compiles servesim's sources again; "
              "to time cached bytecode, as an installed servesim runs, unset it "
              "(PYTHONPYCACHEPREFIX=DIR keeps the caches out of the checkout)")
    base = min(cpu_seconds([sys.executable, "-c", "pass"], env) for _ in range(args.repeat))
    print(f"{'python -c pass':<10} {base:.3f} s CPU")
    for label, command in COMMANDS.items():
        best = min(cpu_seconds([sys.executable, "-m", "servesim", *command], env) for _ in range(args.repeat))
        print(f"{label:<10} {best:.3f} s CPU")
    for module in IMPORTS:
        best = min(import_seconds(module, env) for _ in range(args.repeat))
        print(f"import {module:<18} {best:.3f} s (-X importtime, cumulative)")


if __name__ == "__main__":
    main()
