"""``vla-envs fetch-assets``: the official PutOnPlateInScene25 pack from the Hugging Face hub.

The reference keeps the Bridge real2sim objects, plates and table photos in the ``carrot/`` folder
of the hub dataset ``RLinf/maniskill_assets`` (the layout ``assets.py`` documents). Fetching:

1. lists the files under ``carrot/`` at the requested revision, resolved to its commit, with the
   checksums the hub records for each (sha256 for LFS files, the git blob id for the others);
2. downloads that commit into ``<asset dir>/official.partial`` (a download interrupted or refused
   resumes there; one of another commit is started afresh);
3. checks every file's size and checksum, then reads the result with the task's own loader;
4. only then swaps it in as ``<asset dir>/official`` and writes ``official/FETCHED.json`` (repo,
   commit, and each file's size and sha256), which ``--check`` verifies offline later.

A failed fetch leaves the pack that was there before untouched. The hub is reached through
``HubDataset`` alone, so the rest runs (and is tested) without a network.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from vla_envs.errors import AssetsMissingError, VlaEnvError

OFFICIAL_REPO = "RLinf/maniskill_assets"
PACK_FOLDER = "carrot"
MANIFEST = "FETCHED.json"
PARTIAL_COMMIT = ".commit"
"""In ``official.partial``: the commit being downloaded there (a download of another one starts afresh)."""


class AssetChecksumError(VlaEnvError, ValueError):
    """Downloaded or installed asset files differ from the checksums recorded for them."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    """Relative to the dataset's root, e.g. ``carrot/more_carrot/model_db.json``."""
    size: int
    sha256: str | None
    """Recorded for LFS files (meshes, images); None for files stored in git itself."""
    blob_id: str | None
    """The git blob id (sha1 of ``b"blob <size>\\0" + content``)."""


class HubDataset:
    """The hub's side of a fetch (network); everything else here is local."""

    def list_files(self, repo: str, revision: str) -> tuple[str, list[RemoteFile]]:
        """The commit ``revision`` resolves to, and the files under ``carrot/`` with checksums."""
        from huggingface_hub import HfApi

        info = HfApi().dataset_info(repo, revision=revision, files_metadata=True)
        files = [RemoteFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs else None, s.blob_id)
                 for s in info.siblings or () if s.rfilename.startswith(PACK_FOLDER + "/")]
        return info.sha, files

    def download(self, repo: str, commit: str, local_dir: Path) -> None:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id=repo, repo_type="dataset", revision=commit,
                          allow_patterns=[PACK_FOLDER + "/**"], local_dir=str(local_dir))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_blob_id(path: Path) -> str:
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    digest.update(path.read_bytes())
    return digest.hexdigest()


def file_problem(local: Path, remote: RemoteFile) -> str | None:
    """Why ``local`` is not ``remote`` (missing, size, checksum), or None when it is."""
    if not local.is_file():
        return "missing"
    size = local.stat().st_size
    if size != remote.size:
        return f"{size} bytes, expected {remote.size}"
    if remote.sha256 is not None:
        found = sha256_of(local)
        return None if found == remote.sha256 else f"sha256 {found}, expected {remote.sha256}"
    if remote.blob_id is not None:
        found = git_blob_id(local)
        return None if found == remote.blob_id else f"git blob id {found}, expected {remote.blob_id}"
    return "the hub records no checksum for it"


def _raise_problems(problems: list[str], where: Path, advice: str) -> None:
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise AssetChecksumError(f"{len(problems)} asset file(s) under {where} failed verification:\n  {shown}\n{advice}")


def fetch_official(asset_dir: Path, repo: str = OFFICIAL_REPO, revision: str = "main",
                   hub: HubDataset | None = None) -> dict:
    """Downloads, verifies and installs the official pack as ``asset_dir/official``.

    Returns:
        The manifest written to ``official/FETCHED.json``.

    Raises:
        AssetChecksumError: a downloaded file is missing or differs from the hub's record (the
            rest of the download stays in ``official.partial``, where the next fetch of the same
            commit resumes it; ``official`` is untouched).
        AssetsMissingError: the revision has no ``carrot/`` folder.
        VlaEnvError: the hub could not be reached.
    """
    from vla_envs.tasks.put_on_plate.assets import load_pack

    hub = hub or HubDataset()
    asset_dir = Path(asset_dir)
    try:
        commit, files = hub.list_files(repo, revision)
    except Exception as e:  # the hub client raises many kinds (HTTP, offline mode, DNS)
        raise VlaEnvError(f"could not list {repo}@{revision} on the Hugging Face hub ({type(e).__name__}: {e}); "
                          "fetch on a machine with internet, then copy the folder it writes") from e
    if not files:
        raise AssetsMissingError(f"{repo}@{revision} has no {PACK_FOLDER}/ folder; allowed: a revision of "
                                 f"the dataset that holds it")
    partial = asset_dir / "official.partial"
    stamp = partial / PARTIAL_COMMIT
    if partial.exists() and not (stamp.is_file() and stamp.read_text().strip() == commit):
        shutil.rmtree(partial)  # another commit's interrupted download: its files would mix into this one
    partial.mkdir(parents=True, exist_ok=True)
    stamp.write_text(commit + "\n")
    try:
        hub.download(repo, commit, partial)
    except Exception as e:
        raise VlaEnvError(f"downloading {repo}@{commit} failed ({type(e).__name__}: {e}); run "
                          "vla-envs fetch-assets again to resume") from e
    failed = [(f, why) for f in files if (why := file_problem(partial / f.path, f))]
    for f, _ in failed:  # the hub client resumes by its own record of what is done: a bad file must go

        (partial / f.path).unlink(missing_ok=True)  # to be fetched again
    _raise_problems([f"{f.path}: {why}" for f, why in failed], partial,
                    "official was left as it was; those files were removed from the download, which "
                    "vla-envs fetch-assets resumes")
    load_pack(partial, "official")  # the task's own checks: databases parse, meshes and photos exist
    manifest = {"repo": repo, "revision": revision, "commit": commit,
                "files": {f.path: {"size": f.size, "sha256": f.sha256 or sha256_of(partial / f.path)}
                          for f in files}}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    stamp.unlink()
    official, old = asset_dir / "official", asset_dir / "official.old"
    shutil.rmtree(old, ignore_errors=True)
    if official.exists():
        official.rename(old)
    partial.rename(official)
    shutil.rmtree(old, ignore_errors=True)
    return manifest


def check_official(asset_dir: Path) -> dict:
    """Verifies an installed official pack against its ``FETCHED.json`` (offline).

    Raises:
        AssetsMissingError: no fetched pack (or one installed by hand, without a manifest).
        AssetChecksumError: a file is missing or changed since the fetch.
    """
    official = Path(asset_dir) / "official"
    path = official / MANIFEST
    if not path.is_file():
        raise AssetsMissingError(f"{path} is missing: the pack under {official} was not installed by "
                                 "vla-envs fetch-assets, so there is nothing to check it against")
    manifest = json.loads(path.read_text())
    problems = [f"{name}: {why}" for name, rec in manifest["files"].items()
                if (why := file_problem(official / name, RemoteFile(name, rec["size"], rec["sha256"], None)))]
    _raise_problems(problems, official, "run vla-envs fetch-assets to replace the pack")
    return manifest
