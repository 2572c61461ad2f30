"""How fast is the capacity planner? (issue #18) Prints, with the machine's load:

``servesim capacity llama3-8b-chat --workers 1`` (the shipped example: six candidates, two
replications of 1,000 requests per rate, fleets verified at 40 req/s) as a whole process, three
ways, the minimum of ``--repeat`` runs each (wall and CPU):

- the default: failing probes stop once their failure is certain, round-robin fleets are
  verified replica by replica;
- ``--set search.early_stop=false``: every probe simulated to its end (fleets still split);
- ``--set search.saturation_stop=true``: the opt-in statistical stop on top of the default;

and whether each answer (``capacity.csv``) is byte-identical to the default's, and how many
probes stopped early. ``--before PYTHON`` first runs the same command with another install's
interpreter (e.g. a checkout of the previous release in its own venv), for a side-by-side
speed-up. Run with ``make bench-capacity`` (or ``make bench``); never as a timed test. The shared
machine is noisy: read the CPU seconds first, measured side by side in one run of this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench_core import best, load  # the same timing and load line as the core benchmark

MODES = (("default (exact early stop)", []),
         ("early_stop=false", ["--set", "search.early_stop=false"]),
         ("saturation_stop=true", ["--set", "search.saturation_stop=true"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--config", default="llama3-8b-chat")
    parser.add_argument("--before", help="another install's python to time first (the tree before)")
    args = parser.parse_args()
    print(f"machine: {load()}")
    answers: dict[str, str] = {}
    modes = [(name, sys.executable, extra) for name, extra in MODES]
    if args.before:
        modes.insert(0, ("before (--before)", args.before, []))
    with tempfile.TemporaryDirectory() as scratch:
        for name, python, extra in modes:
            out = Path(scratch) / name.split()[0]
            argv = [python, "-m", "servesim", "capacity", args.config, "--workers", "1",
                    "--out", str(out), *extra]
            wall, cpu, _ = best(argv, args.repeat)
            answer = json.loads((out / "capacity.json").read_text())
            evaluations = [e for record in answer["candidates"]
                           for e in record.get("search", {}).get("evaluations", [])]
            stopped = sum(1 for e in evaluations if "stopped_early" in e)
            answers[name] = (out / "capacity.csv").read_text()
            first = modes[0][0]
            same = "identical" if answers[name] == answers[first] else "DIFFERENT"
            print(f"{name:<28}: {wall:6.1f} s wall, {cpu:6.1f} s CPU; {len(evaluations)} probes, "
                  f"{stopped} stopped early; capacity.csv {same} to {first!r}'s ({load()})", flush=True)


if __name__ == "__main__":
    main()
