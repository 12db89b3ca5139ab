"""Models by Hugging Face name, without a network: the tests write Hugging Face cache
layouts themselves (``models--ORG--NAME/refs/BRANCH`` holding a commit hash,
``snapshots/COMMIT/...``) with tiny random checkpoints from transformers' own config
classes, set ``HF_HUB_OFFLINE=1``, and compare attnkit with transformers loading the same
name. The download path runs against a monkeypatched ``huggingface_hub``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from attnkit import models
from attnkit.models.checkpoints import hub
from tests.fixtures.crafted import tokenizer_json
from tests.fixtures.tiny_families import CASES, TEXT_LENGTH, VOCAB

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

REPO = "tiny-org/tiny-llama"
COMMIT_MAIN = "a" * 40
COMMIT_V2 = "b" * 40
WORDS = [f"w{i}" for i in range(VOCAB - 1)] + ["[UNK]"]


def _repo_folder(cache: Path, name: str) -> Path:
    return cache / ("models--" + name.replace("/", "--"))


def _write_snapshot(cache: Path, name: str, commit: str, branches: tuple[str, ...]) -> Path:
    """An empty snapshot ``commit`` of ``name`` that ``branches`` point at."""
    repo = _repo_folder(cache, name)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for branch in branches:
        (repo / "refs" / branch).write_text(commit)
    folder = repo / "snapshots" / commit
    folder.mkdir(parents=True)
    return folder


def _write_llama(folder: Path, seed: int, *, sharded: bool) -> None:
    """A tiny random LLaMA written by transformers (seeded), with a word-level tokenizer."""
    torch.manual_seed(seed)
    config = CASES["llama_linear"][0]()
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder, max_shard_size="100KB" if sharded else "10GB")
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(WORDS)))


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face cache holding ``tiny-org/tiny-llama`` at two revisions: ``main``
    (one safetensors file) and the branch ``v2`` (other weights, sharded with an index)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    _write_llama(_write_snapshot(cache, REPO, COMMIT_MAIN, ("main",)), seed=0, sharded=False)
    _write_llama(_write_snapshot(cache, REPO, COMMIT_V2, ("v2",)), seed=1, sharded=True)
    return cache


@pytest.fixture
def offline(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` at :func:`hub_cache`."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


def _transformers_model(cache: Path, revision: str | None):
    return transformers.AutoModelForCausalLM.from_pretrained(
        REPO,
        revision=revision or "main",
        cache_dir=cache,
        local_files_only=True,
        attn_implementation="eager",
        dtype=torch.float32,
    ).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, TEXT_LENGTH), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("revision", [None, "v2", COMMIT_V2])
def test_a_name_loads_like_transformers_at_each_revision(offline: Path, revision: str | None) -> None:
    model = models.load(REPO, revision=revision)
    expected_commit = COMMIT_MAIN if revision is None else COMMIT_V2
    assert model.path == _repo_folder(offline, REPO) / "snapshots" / expected_commit
    assert model.name == (REPO if revision is None else f"{REPO}@{revision}")
    ids = _ids()
    run = model.run(ids)
    reference = _transformers_model(offline, revision)
    with torch.no_grad():
        expected = reference(ids, output_attentions=True)
    assert (run.logits - expected.logits).abs().max() <= 1e-4 * expected.logits.abs().max()
    assert len(expected.attentions) == model.num_layers
    for i, weights in enumerate(expected.attentions):
        torch.testing.assert_close(run.attentions[i], weights, rtol=0, atol=1e-5)
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert list(model.generate_ids(ids, max_new_tokens=8)) == theirs[0, TEXT_LENGTH:].tolist()


def test_the_two_revisions_are_different_checkpoints(offline: Path) -> None:
    ids = _ids()
    main, v2 = models.load(REPO).run(ids).logits, models.load(REPO, revision="v2").run(ids).logits
    assert (main - v2).abs().max() > 1e-2
    assert len(list((_repo_folder(offline, REPO) / "snapshots" / COMMIT_V2).glob("model-*.safetensors"))) > 1


def test_hf_home_is_honoured_when_hf_hub_cache_is_unset(hub_cache: Path, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "hub").symlink_to(hub_cache)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.cache_folder() == home / "hub"
    assert models.load(REPO).path.name == COMMIT_MAIN


def test_a_name_missing_offline_is_one_line_that_says_how_to_get_it(offline: Path) -> None:
    with pytest.raises(hub.HubError) as caught:
        models.load("tiny-org/absent", revision="v3")
    message = str(caught.value)
    assert "\n" not in message
    assert "tiny-org/absent@v3" in message and str(offline) in message
    assert "HF_HUB_OFFLINE" in message and "hf download tiny-org/absent --revision v3" in message


def test_a_revision_missing_offline_is_refused(offline: Path) -> None:
    with pytest.raises(hub.HubError, match=r"tiny-org/tiny-llama@v9 is not in the Hugging Face cache"):
        models.load(REPO, revision="v9")


def test_a_pickle_only_snapshot_is_refused_naming_safetensors(offline: Path) -> None:
    folder = _write_snapshot(offline, "tiny-org/pickled", "c" * 40, ("main",))
    shutil.copy(_repo_folder(offline, REPO) / "snapshots" / COMMIT_MAIN / "config.json", folder)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(WORDS)))
    (folder / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ValueError) as caught:
        models.load("tiny-org/pickled")
    message = str(caught.value)
    assert "\n" not in message and "pytorch_model.bin" in message
    assert "safetensors" in message and "arbitrary code" in message


def test_an_architecture_without_a_family_names_its_model_type_and_the_families(offline: Path) -> None:
    folder = _write_snapshot(offline, "tiny-org/mamba", "d" * 40, ("main",))
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    with pytest.raises(models.CheckpointError) as caught:
        models.load("tiny-org/mamba")
    message = str(caught.value)
    assert "\n" not in message and "'mamba' is not supported" in message
    assert "llama" in message and "gemma3_text" in message and "bert" in message


def test_folder_checks_apply_to_snapshots(offline: Path) -> None:
    folder = _write_snapshot(offline, "tiny-org/truncated", "e" * 40, ("main",))
    source = _repo_folder(offline, REPO) / "snapshots" / COMMIT_MAIN
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, folder)
    data = (source / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(models.CheckpointError, match=r"model\.safetensors is truncated"):
        models.load("tiny-org/truncated")


def test_a_fetched_name_then_a_folder_then_a_hub_name(offline: Path, tmp_path: Path, monkeypatch) -> None:
    local = tmp_path / "tiny-org" / "tiny-llama"
    shutil.copytree(_repo_folder(offline, REPO) / "snapshots" / COMMIT_V2, local)
    monkeypatch.chdir(tmp_path)
    assert models.load(REPO).path == Path(REPO)  # an existing folder wins over the Hub name
    with pytest.raises(ValueError, match="a revision applies to Hugging Face names"):
        models.load(REPO, revision="main")
    monkeypatch.chdir(local.parent)
    assert models.load(REPO).path.name == COMMIT_MAIN


def test_dtype_names_are_taken_and_bad_ones_refused(offline: Path) -> None:
    assert next(models.load(REPO, dtype="bfloat16").module.parameters()).dtype == torch.bfloat16
    assert next(models.load(REPO).module.parameters()).dtype == torch.float32  # auto on the CPU
    with pytest.raises(TypeError, match="dtype must be 'auto'"):
        models.load(REPO, dtype="float8")


# The download path, against a monkeypatched huggingface_hub.

REPO_FILES = [
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "consolidated.safetensors",
    "adapter_model.safetensors",
    "onnx/model.safetensors",
    "original/consolidated.00.pth",
    "pytorch_model.bin",
    "optimizer.pt",
    "training_args.ckpt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "sub/config.json",
    "sub/chat_template.jinja",
]
ALLOWED = {
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
}


class _FakeApi:
    """``HfApi`` whose ``model_info`` lists ``files`` (or raises ``error``)."""

    files: ClassVar[list[str]] = []
    error: ClassVar[Exception | None] = None
    tokens: ClassVar[list[str | None]] = []

    def model_info(self, name: str, *, revision: str | None = None, token: str | None = None):
        _FakeApi.tokens.append(token)
        if _FakeApi.error is not None:
            raise _FakeApi.error
        siblings = [huggingface_hub.hf_api.RepoSibling(rfilename=f) for f in _FakeApi.files]
        return type("Info", (), {"sha": "f" * 40, "siblings": siblings})()


@pytest.fixture
def online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """An empty cache, online, with ``HfApi`` and ``snapshot_download`` replaced: a download
    records its arguments and returns a snapshot folder with the tiny LLaMA in it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    calls: dict = {"downloads": []}
    _FakeApi.files, _FakeApi.error, _FakeApi.tokens = list(REPO_FILES), None, []

    def snapshot_download(name: str, **options):
        if options.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        calls["downloads"].append(options)
        folder = _write_snapshot(Path(options["cache_dir"]), name, options["revision"], ())
        _write_llama(folder, seed=0, sharded=False)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_the_download_asks_only_for_safetensors_configuration_and_tokenizer(online: dict) -> None:
    model = models.load(REPO)
    assert model.path.name == "f" * 40
    (request,) = online["downloads"]
    assert set(request["allow_patterns"]) == ALLOWED
    # As huggingface_hub applies the patterns to the repository's files.
    chosen = set(huggingface_hub.utils.filter_repo_objects(REPO_FILES, allow_patterns=request["allow_patterns"]))
    assert chosen == ALLOWED
    assert request["revision"] == "f" * 40
    # The branch now names the commit in the cache: the model opens offline afterwards.
    assert (_repo_folder(Path(request["cache_dir"]), REPO) / "refs" / "main").read_text() == "f" * 40


def test_a_single_file_checkpoint_downloads_only_model_safetensors(online: dict) -> None:
    assert set(hub.wanted_files(["model.safetensors", *REPO_FILES])) == (
        ALLOWED
        - {"model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    ) | {"model.safetensors"}


def test_a_pickle_only_repository_is_refused_before_any_download(online: dict) -> None:
    _FakeApi.files = ["config.json", "pytorch_model.bin", "tokenizer.json"]
    with pytest.raises(hub.HubError) as caught:
        models.load(REPO)
    message = str(caught.value)
    assert "\n" not in message and "pytorch_model.bin" in message
    assert "safetensors" in message and "unpickling runs arbitrary code" in message
    assert online["downloads"] == []


def test_a_gated_repository_without_a_token_says_how_to_give_one(online: dict) -> None:
    import httpx

    response = httpx.Response(403, request=httpx.Request("GET", f"https://huggingface.co/api/models/{REPO}"))
    _FakeApi.error = huggingface_hub.errors.GatedRepoError("gated", response=response)
    with pytest.raises(hub.HubError) as caught:
        models.load(REPO)
    message = str(caught.value)
    assert "\n" not in message and f"{REPO} is a gated repository" in message
    assert "HF_TOKEN" in message and "hf auth login" in message


def test_hf_token_is_passed_to_the_hub(online: dict, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    models.load(REPO)
    assert _FakeApi.tokens == ["hf_secret"] and online["downloads"][0]["token"] == "hf_secret"


def test_an_unknown_repository_is_one_line(online: dict) -> None:
    import httpx

    response = httpx.Response(404, request=httpx.Request("GET", f"https://huggingface.co/api/models/{REPO}"))
    _FakeApi.error = huggingface_hub.errors.RepositoryNotFoundError("missing", response=response)
    with pytest.raises(hub.HubError, match=r"^no model repository 'tiny-org/tiny-llama' on the Hugging Face Hub; "):
        models.load(REPO)


# The command line.


def test_inspect_takes_a_hugging_face_name_and_revision(offline: Path, tmp_path: Path, capsys) -> None:
    from attnkit.cli import main

    out = tmp_path / "out"
    code = main(
        ["inspect", "w1 w5 w2 w7", "--model", REPO, "--revision", "v2", "--format", "json", "--out", str(out), "-q"]
    )
    assert code == 0, capsys.readouterr().err
    (written,) = out.glob("*.json")
    data = json.loads(written.read_text())
    assert REPO in json.dumps(data)


@pytest.mark.slow
def test_inspect_by_name_as_its_own_process(hub_cache: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "attnkit", "inspect", "w1 w5 w2", "--model", REPO, "--format", "png"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"loading {REPO} on cpu" in done.stderr
    assert len(list(tmp_path.glob("tiny-org_tiny-llama_*.png"))) == 1, sorted(p.name for p in tmp_path.iterdir())


def test_the_command_line_refuses_a_missing_name_in_one_line(offline: Path, capsys) -> None:
    from attnkit.cli import main

    assert main(["inspect", "w1 w2", "--model", "tiny-org/absent", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tiny-org/absent is not in the Hugging Face cache" in err


def test_serve_shows_a_hugging_face_name_whole_and_a_folder_by_its_last_part(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("fastapi")
    from attnkit.serve.app import public_name

    monkeypatch.chdir(tmp_path)
    assert public_name(REPO) == REPO
    (tmp_path / REPO).mkdir(parents=True)
    assert public_name(REPO) == "tiny-llama"


# Hardening: what the network, a revision or the cache may say.


def _connect_error() -> Exception:
    """The error huggingface_hub's HTTP client raises where no network is (httpx2 in
    huggingface_hub 2, httpx before)."""
    import importlib

    for module in ("httpx2", "httpx"):
        try:
            return importlib.import_module(module).ConnectError("[Errno -2] Name or service not known")
        except ImportError:
            continue
    raise AssertionError("neither httpx2 nor httpx is installed beside huggingface_hub")


@pytest.mark.parametrize("revision", [None, "no-such-branch"])
def test_a_network_that_cannot_be_reached_is_one_line_that_says_what_to_do(online: dict, revision) -> None:
    _FakeApi.error = _connect_error()
    with pytest.raises(hub.HubError) as caught:
        models.load(REPO, revision=revision)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot download {REPO}")
    assert "Name or service not known" in message and "check the network" in message and "HF_HUB_OFFLINE=1" in message


def test_a_cached_snapshot_without_its_tokenizer_and_no_network_is_one_line(
    hub_cache: Path, tmp_path: Path, monkeypatch
) -> None:
    cache = tmp_path / "hub"
    shutil.copytree(hub_cache, cache, symlinks=True)
    (cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT_MAIN / "tokenizer.json").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    _FakeApi.error = _connect_error()
    monkeypatch.setattr(huggingface_hub, "HfApi", _FakeApi)
    with pytest.raises(hub.HubError, match=r"^cannot download tiny-org/tiny-llama .*check the network"):
        models.load(REPO)


def test_the_command_line_says_the_network_cannot_be_reached_in_one_line(online: dict, capsys) -> None:
    from attnkit.cli import main

    _FakeApi.error = _connect_error()
    assert main(["inspect", "w1 w2", "--model", "org/missing", "-q"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("attnkit: error: cannot download org/missing from the Hugging Face Hub")
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("revision", ["../refs/main", "/etc", "-main", "a\x00b", "main\n", "v 2", "a..b", "x~1", "."])
def test_a_revision_that_is_no_branch_tag_or_commit_is_refused(offline: Path, revision: str) -> None:
    with pytest.raises(hub.HubError, match="^revision must be a branch, tag or commit hash"):
        models.load(REPO, revision=revision)


@pytest.mark.parametrize("revision", ["main", "v2", COMMIT_V2, "refs/pr/1", "release-1.0"])
def test_branch_tag_and_commit_names_are_revisions(revision: str) -> None:
    hub.check_revision(revision)


def test_a_refs_file_that_points_outside_the_cache_is_refused(hub_cache: Path, tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    shutil.copytree(hub_cache, cache, symlinks=True)
    repo = cache / f"models--{REPO.replace('/', '--')}"
    # A whole checkpoint outside the repository's snapshots, and a branch that names it.
    shutil.copytree(repo / "snapshots" / COMMIT_MAIN, tmp_path / "elsewhere", symlinks=False)
    (repo / "refs" / "escape").write_text("../../../elsewhere")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError, match="outside"):
        models.load(REPO, revision="escape")


@pytest.mark.parametrize(
    "name", ["org/smol.", "org--x/smol", "org/smol--x", "org/smol.git", "-org/smol", "org/-smol", "org/a..b", "org/"]
)
def test_names_the_hub_refuses_are_not_hugging_face_names(name: str, capsys) -> None:
    from attnkit.cli import main

    assert not hub.is_hub_name(name)
    assert main(["inspect", "w1 w2", "--model", name, "-q"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (
        f"attnkit: error: --model {name!r} is neither a known model (smollm2, minilm, gemma3), a folder, nor a "
        "Hugging Face name ORG/NAME"
    )


@pytest.mark.parametrize("name", ["TinyLlama/TinyLlama-1.1B-Chat-v1.0", "a/b", "org_1/x.y", "meta-llama/Llama-3.1-8B"])
def test_names_the_hub_accepts_are_hugging_face_names(name: str) -> None:
    assert hub.is_hub_name(name)
