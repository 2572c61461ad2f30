"""The per-user cache of parsed YAML: the same documents as parsing, faster, never stale, and
never a reason to fail (servesim.inputs.parse_cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

import servesim.inputs.files as files
from servesim import load_hardware
from servesim.errors import ServesimError
from servesim.inputs.files import read_yaml
from servesim.resources import hardware_profiles_dir

PROFILE = hardware_profiles_dir() / "h100-sxm-80gb.yaml"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each call of the YAML parser, by source."""
    calls: list[str] = []
    parse = files.load_yaml_text

    def counting(text: str, source: str, field: str) -> object:
        calls.append(source)
        return parse(text, source, field)

    monkeypatch.setattr(files, "load_yaml_text", counting)
    return calls


def test_an_unchanged_file_is_parsed_once_and_read_back_equal(cache: Path, parses: list[str],
                                                               tmp_path: Path) -> None:
    path = tmp_path / "h100.yaml"
    path.write_text(PROFILE.read_text())
    first = read_yaml(path, "hardware")
    second = read_yaml(path, "hardware")
    assert second == first and second is not first  # a fresh copy each time
    assert parses == [str(path)]
    assert len(list((cache / "yaml").glob("*.marshal"))) == 1
    # the cached document validates into the same profile
    assert load_hardware(path) == load_hardware(PROFILE)


def test_an_edited_file_is_parsed_again(cache: Path, parses: list[str], tmp_path: Path) -> None:
    path = tmp_path / "h100.yaml"
    text = PROFILE.read_text()
    path.write_text(text)
    read_yaml(path, "hardware")
    path.write_text(text.replace("name: h100-sxm-80gb", "name: my-h100", 1))
    assert read_yaml(path, "hardware")["name"] == "my-h100"
    assert len(parses) == 2


def test_a_bad_file_is_refused_alike_every_time_and_never_cached(cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(PROFILE.read_text() + "\nmemory: [unclosed\n")
    messages = []
    for _ in range(2):
        with pytest.raises(ServesimError) as caught:
            read_yaml(path, "hardware")
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "malformed YAML" in messages[0]
    assert not (cache / "yaml").exists() or not list((cache / "yaml").iterdir())


def test_a_damaged_entry_or_an_unusable_folder_only_costs_a_parse(cache: Path, parses: list[str],
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "h100.yaml"
    path.write_text(PROFILE.read_text())
    expected = read_yaml(path, "hardware")
    (entry,) = (cache / "yaml").glob("*.marshal")
    entry.write_bytes(b"\xff not marshal data")
    assert read_yaml(path, "hardware") == expected  # re-parsed and re-stored
    assert read_yaml(path, "hardware") == expected  # from the repaired entry
    assert len(parses) == 2
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(blocker))
    assert read_yaml(path, "hardware") == expected
    monkeypatch.setenv("SERVESIM_CACHE_DIR", "off")
    assert read_yaml(path, "hardware") == expected
    assert len(parses) == 4


def test_documents_marshal_cannot_hold_are_parsed_each_time(cache: Path, parses: list[str],
                                                            tmp_path: Path) -> None:
    path = tmp_path / "dated.yaml"
    path.write_text("when: 2026-11-24\n" + "# padding\n" * 200)
    assert str(read_yaml(path, "config")["when"]) == "2026-11-24"
    read_yaml(path, "config")
    assert len(parses) == 2


def test_small_files_skip_the_cache(cache: Path, parses: list[str], tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text("a: 1\nb: [1, 2]\n")
    assert read_yaml(path, "config") == {"a": 1, "b": [1, 2]}
    assert not cache.exists()
