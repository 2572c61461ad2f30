"""``calibrate import-vidur`` writes fitted profiles to a user folder, never into the built-in
profiles (site-packages in a normal install), and says where."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import servesim

from servesim.resources import hardware_profiles_dir, user_profiles_dir


def test_user_folder_follows_servesim_home_then_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVESIM_HOME", str(tmp_path / "home"))
    assert user_profiles_dir() == tmp_path / "home" / "hardware_profiles"
    monkeypatch.delenv("SERVESIM_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert user_profiles_dir() == tmp_path / "xdg" / "servesim" / "hardware_profiles"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert user_profiles_dir() == Path("~/.local/share/servesim/hardware_profiles").expanduser()


def test_import_vidur_leaves_the_builtin_profiles_alone(shared_data: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    builtin = {p.name: p.read_bytes() for p in hardware_profiles_dir().glob("*.yaml")}
    monkeypatch.setenv("SERVESIM_HOME", str(tmp_path))
    run = servesim("calibrate", "import-vidur", str(shared_data / "kernels" / "vidur_profiling"))
    assert run.returncode == 0, run.stderr
    written = sorted(p.name for p in (tmp_path / "hardware_profiles").glob("*.yaml"))
    assert written == ["a100-sxm-80gb.yaml", "h100-sxm-80gb.yaml"]
    assert f"wrote {tmp_path / 'hardware_profiles' / 'a100-sxm-80gb.yaml'}" in " ".join(run.stdout.split())
    assert "use them with --hardware" in run.stdout
    assert {p.name: p.read_bytes() for p in hardware_profiles_dir().glob("*.yaml")} == builtin
    check = servesim("hardware", str(tmp_path / "hardware_profiles" / "h100-sxm-80gb.yaml"))
    assert check.returncode == 0, check.stderr
