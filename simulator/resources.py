"""Where the built-in hardware profiles, model configs and example configs live.

In a checkout (and an editable install) they are the top-level ``hardware_profiles/`` and
``configs/`` folders of the repository. A wheel installs the same files inside the package as
``servesim/hardware_profiles`` and ``servesim/configs`` (see ``pyproject.toml``), so
``pip install .`` works from any directory. We look in the checkout first so that an edited
profile is picked up without reinstalling.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from servesim.errors import ServesimError

_PACKAGE_DIR = Path(__file__).resolve().parent
_REPO_ROOT = _PACKAGE_DIR.parent
_LAYOUT = {"hardware_profiles": "hardware_profiles", "configs": "configs"}


def builtin_dir(kind: str) -> Path:
    """The folder holding the built-in files of ``kind`` (``hardware_profiles`` or ``configs``)."""
    folder = _LAYOUT[kind]
    checkout = _REPO_ROOT / folder
    if checkout.is_dir() and (_REPO_ROOT / "pyproject.toml").is_file():
        return checkout
    return _PACKAGE_DIR / folder


def hardware_profiles_dir() -> Path:
    return builtin_dir("hardware_profiles")


def model_configs_dir() -> Path:
    return builtin_dir("configs") / "models"


def configs_dir() -> Path:
    return builtin_dir("configs")


def find_builtin(text: str, folders: list[Path], field: str, kind: str,
                 is_kind: Callable[[Path], bool] = lambda _: True) -> Path:
    """``text`` as a path, or as the name of a built-in YAML (``quickstart`` ->
    configs/quickstart.yaml) in the first of ``folders`` holding one that ``is_kind`` accepts (an
    experiment and a sweep share configs/); else a one-line error listing the built-ins."""
    path = Path(text)
    if path.is_file():
        return path
    if path.parent == Path("."):
        name = f"{text.removesuffix('.yaml')}.yaml"
        for folder in folders:
            if (folder / name).is_file() and is_kind(folder / name):
                return folder / name
    known = sorted({p.stem for folder in folders for p in folder.glob("*.yaml") if is_kind(p)})
    raise ServesimError(field, f"{text} not found",
                        f"give a YAML path or a built-in {kind} ({', '.join(known)})")


def user_profiles_dir() -> Path:
    """Where servesim writes hardware profiles it fits for the user (``calibrate import-vidur``):
    ``$SERVESIM_HOME/hardware_profiles``, else ``$XDG_DATA_HOME/servesim/hardware_profiles``
    (``~/.local/share/servesim/hardware_profiles``). Never the built-in folder, which is inside
    site-packages in a normal install; use a profile written here with ``--hardware PATH``."""
    import os

    home = os.environ.get("SERVESIM_HOME")
    if home:
        return Path(home).expanduser() / "hardware_profiles"
    data = os.environ.get("XDG_DATA_HOME") or str(Path("~/.local/share").expanduser())
    return Path(data) / "servesim" / "hardware_profiles"
