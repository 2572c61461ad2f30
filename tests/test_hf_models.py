"""Models by Hugging Face id: read from the local cache, downloaded with huggingface_hub when it
is installed, and one line saying where to put the file when neither works."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from servesim.errors import ServesimError
from servesim.model_config import load_model
from servesim.resources import model_configs_dir


def hf_config() -> dict:
    config = json.loads((model_configs_dir() / "mistral-7b.json").read_text())
    config.pop("_servesim")
    return config


def fake_cache(root: Path, repo: str, revision: str = "abc123") -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<rev>/}."""
    folder = root / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(hf_config()))
    return snapshot / "config.json"


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed


def test_a_cached_model_loads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: None) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    fake_cache(tmp_path, "my-org/My-Mistral-Finetune")
    spec = load_model("my-org/My-Mistral-Finetune")
    builtin = load_model("mistral-7b")
    assert spec.name == "My-Mistral-Finetune" and spec.source == "my-org/My-Mistral-Finetune/config.json"
    assert (spec.num_layers, spec.num_kv_heads, spec.param_count) == (
        builtin.num_layers, builtin.num_kv_heads, builtin.param_count)


def test_not_cached_and_offline_is_one_line_saying_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         no_hub: None) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ServesimError) as error:
        load_model("some-org/Unknown-7B")
    text, cache = str(error.value), tmp_path / "cache"
    assert text.startswith(f"model: some-org/Unknown-7B is not in the Hugging Face cache ({cache})")
    assert f"put the model's config.json at {cache}/models--some-org--Unknown-7B/snapshots/" in text
    assert "pip install huggingface_hub" in text and "\n" not in text


def test_download_goes_through_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    downloaded = tmp_path / "downloaded" / "config.json"
    downloaded.parent.mkdir()
    downloaded.write_text(json.dumps(hf_config()))
    calls = []

    def hf_hub_download(repo_id: str, filename: str) -> str:
        calls.append((repo_id, filename))
        if repo_id == "gated/Model":
            raise PermissionError("401 Client Error: access to gated/Model is restricted")
        return str(downloaded)

    hub = types.SimpleNamespace(hf_hub_download=hf_hub_download)
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    assert load_model("other-org/Other-7B").hidden_size == 4096
    assert calls == [("other-org/Other-7B", "config.json")]
    with pytest.raises(ServesimError, match=r"cannot download gated/Model's config.json \(PermissionError"):
        load_model("gated/Model")


def test_catalogue_names_and_paths_still_win(tmp_path: Path, no_hub: None) -> None:
    """``meta-llama/llama-3-8b`` ends in a catalogue name, so it is the catalogue model."""
    assert load_model("meta-llama/llama-3-8b").name == "llama-3-8b"
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps(hf_config()))
    assert load_model(str(local)).name == "name"
