"""What a launch configuration is: the server commands a simulated fleet corresponds to.

A simulated deployment is a topology of replica groups; on a real cluster each replica is one
serving process (``vllm serve`` or SGLang's ``launch_server``) on ``gpus_each`` GPUs, started
``copies`` times, behind a load balancer. :class:`ServerCommand` is one such process as an
argument vector (so it can be run or quoted exactly) plus the notes on what the simulation
assumed that no flag expresses; :class:`LaunchConfig` is a whole fleet for one engine family.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesim.model_spec import ModelSpec


@dataclass(frozen=True)
class ServerCommand:
    """One serving process of the fleet, started ``copies`` times (one per replica)."""

    role: str
    """``replica`` (colocated), ``prefill`` or ``decode`` (disaggregated)."""
    copies: int
    gpus_each: int
    hardware: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    """(path, text) of files the command reads, written before it (TensorRT-LLM's options YAML)."""

    def shell(self) -> str:
        """The command as a shell line per flag (``\\`` continuations), every word quoted: the
        program and its positional arguments first, then each flag with its value."""
        args = list(self.argv)
        first_flag = next((i for i, a in enumerate(args) if a.startswith("--")), len(args))
        head = [f"{k}={shlex.quote(v)}" for k, v in self.env] + [shlex.quote(a) for a in args[:first_flag]]
        lines = [" ".join(head)]
        i = first_flag
        while i < len(args):  # a flag and its value share a line
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                lines.append(f"    {args[i]} {shlex.quote(args[i + 1])}")
                i += 2
            else:
                lines.append(f"    {args[i]}")
                i += 1
        return " \\\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "copies": self.copies, "gpus_each": self.gpus_each,
                "hardware": self.hardware, "argv": list(self.argv), "env": dict(self.env),
                "command": self.shell(), "notes": list(self.notes),
                **({"files": dict(self.files)} if self.files else {})}


@dataclass(frozen=True)
class LaunchConfig:
    """A fleet for one engine family: its servers, how requests reach them, and caveats."""

    family: str
    """``vllm``, ``sglang`` or ``trtllm``."""
    servers: tuple[ServerCommand, ...]
    routing: str
    """How requests are spread over the servers (the simulated router, in words)."""
    router_argv: tuple[str, ...] = ()
    """A router process to start in front of the servers, when the family ships one."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gpus(self) -> int:
        return sum(s.copies * s.gpus_each for s in self.servers)

    def text(self) -> str:
        """The configuration as a commented shell snippet, for people and for copying."""
        lines = [f"# {self.family}: {self.gpus} GPU(s); {self.routing}"]
        for note in self.notes:
            lines.append(f"# note: {note}")
        for server in self.servers:
            lines.append(f"# {server.role}: {server.copies} server(s) x {server.gpus_each} "
                         f"{server.hardware} GPU(s), each on its own GPUs and port")
            for note in server.notes:
                lines.append(f"# note: {note}")
            for path, text in server.files:
                lines += [f"cat > {shlex.quote(path)} <<'EOF'", text, "EOF"]
            lines.append(server.shell())
        if self.router_argv:
            lines.append("# router in front of the servers (one --prefill/--decode per server URL)")
            lines.append(shlex.join(self.router_argv))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "gpus": self.gpus, "routing": self.routing,
                "servers": [s.to_dict() for s in self.servers],
                "router_argv": list(self.router_argv) or None, "notes": list(self.notes),
                "text": self.text()}


def served_model(model: ModelSpec, model_arg: str | None) -> str:
    """What to pass as the model: the Hugging Face id a catalogue model was written from
    (``meta-llama/Meta-Llama-3-8B``), else what the experiment named (an id, or the folder of a
    local config.json, where the weights would sit beside it)."""
    source = model.source.strip()
    if source.endswith("/config.json") and source.count("/") >= 2 and not Path(source).is_absolute():
        return source.removesuffix("/config.json")
    if model_arg:
        path = Path(model_arg).expanduser()
        if path.name == "config.json":
            return str(path.parent)
        return model_arg
    return model.name


def parallelism_argv(degrees: Mapping[str, int], flags: Mapping[str, Callable[[int], list[str]]],
                     where: str) -> tuple[list[str], list[str]]:
    """A layout's degrees (``Parallelism.describe()``) as one engine family's flags, and a note for
    each degree the family has no flag for (``where``: the module that would hold it)."""
    argv: list[str] = []
    notes: list[str] = []
    for key, degree in degrees.items():
        flag = flags.get(key)
        if flag is None:
            notes.append(f"parallelism {key}={degree} has no flag in {where}")
        else:
            argv += flag(degree)
    return argv, notes
