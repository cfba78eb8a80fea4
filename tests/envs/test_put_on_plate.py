"""PutOnPlateInScene25: task data, success/reward functions, asset packs, and the real
ManiSkill scene on the CPU backend with the procedural pack."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from expert_policy import ExpertAsPolicy
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_demos import write_demos

from vla_envs.camera_file import DEFAULT_CAMERA_FILE, load_camera_file
from vla_envs.core.backend import env_rows
from vla_envs.errors import AssetsMissingError
from vla_envs.tasks.put_on_plate import episodes, rewards
from vla_envs.tasks.put_on_plate.assets import load_pack, resolve_pack


@pytest.fixture(scope="session")
def asset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("assets")
    with pytest.warns(UserWarning, match="procedural pack"):
        resolve_pack("auto", root)  # generates the procedural pack once for the session
    return root


# ------------------------------------------------------------------ episodes
def test_splits_have_the_stated_sizes():
    pairs = episodes.position_pairs()
    assert pairs.shape == (784, 2, 2)
    assert (np.linalg.norm(pairs[:, 0] - pairs[:, 1], axis=1) > 0.07).all()
    assert episodes.get_split("train").num_episodes == 16 * 1 * 16 * 784 * 4 == 802_816
    assert episodes.get_split("test").num_episodes == 9 * 1 * 5 * 784 * 4
    with pytest.raises(ValueError, match=r"valid splits: \['all', 'test', 'train'\]"):
        episodes.get_split("validation")


@settings(max_examples=200, deadline=None)
@given(split=st.sampled_from(["train", "test", "all"]), data=st.data())
def test_episode_id_decoding_round_trips(split, data):
    s = episodes.get_split(split)
    eid = data.draw(st.integers(0, s.num_episodes - 1))
    d = {k: int(v[0]) for k, v in episodes.decode(np.array([eid]), s).items()}
    assert d["object"] in s.objects and d["overlay"] in s.overlays and d["plate"] in s.plates
    assert 0 <= d["position"] < 784 and 0 <= d["yaw"] < 4 and d["distractor"] == -1
    assert episodes.encode(episodes.Episode(**d), s) == eid


def test_mixed_radix_order_is_object_plate_distractor_overlay_position_yaw():
    s = episodes.get_split("test")
    d = episodes.decode(np.array([0, 1, 4, 4 * 784, 4 * 784 * 5]), s)
    assert d["yaw"].tolist() == [0, 1, 0, 0, 0]
    assert d["position"].tolist() == [0, 0, 1, 0, 0]
    assert d["overlay"].tolist() == [16, 16, 16, 17, 16]
    assert d["object"].tolist() == [16, 16, 16, 16, 17]
    with pytest.raises(ValueError, match="out of range"):
        episodes.decode(np.array([s.num_episodes]), s)
    # a distractor digit after the plate: every other model of the kind, never the chosen one
    s = episodes.Split("d", range(0, 2), range(1, 4), range(0, 1), layout="third_far_from_plate", distractor="plate")
    assert s.radices == (2, 3, 2, 1, 2104, 4)
    d = episodes.decode(np.arange(3 * 2 * 2104 * 4, step=2104 * 4), s)
    assert d["plate"].tolist() == [1, 1, 2, 2, 3, 3] and d["distractor"].tolist() == [2, 3, 3, 1, 1, 2]
    with pytest.raises(ValueError, match="not another plate"):
        episodes.encode(episodes.Episode(0, 1, 0, 0, 0, distractor=1), s)
    with pytest.raises(ValueError, match="needs a layout with a third cell"):
        episodes.Split("d", range(0, 2), range(1, 4), range(0, 1), distractor="plate")


def test_a_split_of_some_positions_and_yaws_decodes_only_to_them():
    cells = episodes.pairs_between(object_cells=(6, 7), plate_cells=(17, 35))
    xy, pairs = episodes.grid_xy(), episodes.position_pairs()
    assert {tuple(pairs[k, 0]) for k in cells} == {tuple(xy[6]), tuple(xy[7])}
    assert {tuple(pairs[k, 1]) for k in cells} == {tuple(xy[17]), tuple(xy[35])}
    s = episodes.Split("s", range(3, 5), range(0, 1), range(2, 4), positions=cells, yaws=(2,))
    assert s.num_episodes == 2 * 2 * len(cells) == 16
    d = episodes.decode(np.arange(s.num_episodes), s)
    assert set(d["position"].tolist()) == set(cells) and set(d["yaw"].tolist()) == {2}
    for eid in range(s.num_episodes):
        one = {k: int(v[eid]) for k, v in d.items()}
        assert episodes.encode(episodes.Episode(**one), s) == eid
    with pytest.raises(ValueError, match="yaw 0 outside split"):
        episodes.encode(episodes.Episode(3, 0, 2, cells[0], 0), s)
    with pytest.raises(ValueError, match="no pair"):
        episodes.pairs_between(object_cells=(0,), plate_cells=(1,))  # neighbours: 3 cm apart
    with pytest.raises(ValueError, match=r"grid cells \[36\] outside"):
        episodes.pairs_between(object_cells=(36,), plate_cells=(1,))


def test_every_eepose_episode_moves_every_joint_by_half_the_noise_at_least():
    ids = np.array([0, 1, 2, 5, 123457, 802815])
    offsets = episodes.arm_pose_offsets(ids, 0.15)
    assert offsets.shape == (6, 7) and np.all(np.abs(offsets) >= 0.075) and np.all(np.abs(offsets) <= 0.15)
    assert np.array_equal(episodes.arm_pose_offsets(ids[::-1], 0.15), offsets[::-1])  # a function of the id
    assert len({tuple(row) for row in np.sign(offsets)}) > 1  # the directions differ between episodes


@pytest.mark.parametrize("k", [2, 3, 4])
def test_expert_start_phases_are_drawn_independently_of_the_yaw(k):
    """Each phase takes about 1/k of the episodes of every yaw (the yaw is the id's last digit: a
    hash read from its low bits gave each yaw one phase)."""
    s = episodes.get_split("train")
    ids = np.arange(0, s.num_episodes, 7)
    phase, yaw = episodes.start_phase_index(ids, k), episodes.decode(ids, s)["yaw"]
    assert phase.min() == 0 and phase.max() == k - 1
    for y in np.unique(yaw):
        shares = np.bincount(phase[yaw == y], minlength=k) / (yaw == y).sum()
        assert np.all(np.abs(shares - 1 / k) < 0.02), (y, shares)
    assert np.array_equal(episodes.start_phase_index(ids, k), phase)  # a function of the id


def test_the_curriculum_variant_and_its_held_out_twin_share_every_factor_but_no_initial_state():
    from vla_envs.tasks.put_on_plate.variants import CURRICULUM, VARIANTS, get_variant

    train, held = (get_variant(f"PutOnPlateInScene25{n}-v3").split() for n in ("Easy", "EasyHeldOut"))
    states = []
    for s in (train, held):
        d = episodes.decode(np.arange(s.num_episodes), s)
        states.append({tuple(row) for row in np.stack([d[k] for k in sorted(d)], axis=1).tolist()})
        for k in ("object", "overlay", "position"):
            assert len(set(d[k].tolist())) == {"object": 16, "overlay": 16, "position": 4}[k]
    assert len(states[0]) == len(states[1]) == 16 * 16 * 4 // 2
    assert not states[0] & states[1]
    with pytest.raises(ValueError, match="other parity"):
        one = episodes.decode(np.array([0]), held)
        episodes.encode(episodes.Episode(**{k: int(v[0]) for k, v in one.items()}), train)
    assert not set(CURRICULUM) & set(VARIANTS)  # --ood evaluates the paper's conditions only


# ------------------------------------------------------------------ success and reward
def _state(obj_xyz, force=1.0):
    plate_bbox = torch.tensor([[0.17, 0.17, 0.022]])
    obj_bbox = torch.tensor([[0.09, 0.026, 0.026]])
    return (torch.tensor([obj_xyz]), torch.tensor([[0.0, 0.0, 0.881]]), obj_bbox, plate_bbox,
            torch.tensor([force]))



def test_no_initial_state_starts_solved():
    """Every object-plate pair is farther apart than any procedural plate's success radius."""
    from vla_envs.tasks.put_on_plate.procedural import PLATES

    pairs = episodes.position_pairs()
    closest = np.linalg.norm(pairs[:, 0] - pairs[:, 1], axis=1).min()
    largest = max(radius for _, radius, _ in PLATES) + rewards.XY_MARGIN_M
    assert closest > largest


@pytest.mark.parametrize("obj_xyz, force, expected", [
    ((0.02, 0.01, 0.905), 0.5, True),     # resting on the plate
    ((0.02, 0.01, 0.905), 0.0, False),    # same place, no contact: held just above it
    ((0.02, 0.01, 0.990), 0.5, False),    # hovering 8 cm above
    ((0.12, 0.00, 0.882), 0.5, False),    # dropped beside the plate (xy beyond 8.5 + 1 cm)
    ((0.09, 0.00, 0.905), 0.5, True),     # on the rim: within half-extent + 1 cm
    ((0.00, 0.00, 0.860), 0.5, False),    # below the plate
])
def test_success_on_constructed_states(obj_xyz, force, expected):
    assert rewards.object_on_plate(*_state(obj_xyz, force)).item() is expected


def test_on_plate_radius_is_the_success_tests_reach():
    plate_bbox = _state((0, 0, 0))[3]
    assert rewards.on_plate_radius(plate_bbox).item() == pytest.approx(0.085 + 0.01)
    for x, inside in ((0.0949, True), (0.0951, False)):  # resting on the plate, at the radius's edge
        assert rewards.object_on_plate(*_state((x, 0.0, 0.905), 0.5)).item() is inside


def test_dense_reward_telescopes_and_needs_a_grasp():
    grasped = torch.tensor([False, True, True, True, True, True, True, False, False])
    success = torch.tensor([False, False, False, False, False, False, False, True, True])
    streak, ever_g, ever_c, prev, total = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool), torch.zeros(1), 0.0
    per_step = []
    for g, s in zip(grasped, success):
        streak = rewards.update_grasp_streak(streak, g.reshape(1))
        ever_g |= g
        ever_c |= streak >= 5
        score = rewards.staged_score(ever_g, ever_c, s.reshape(1))
        r = rewards.dense_reward(score, prev)
        prev = score
        per_step.append(round(r.item(), 6))
        total += r.item()
    assert per_step == [0.0, 0.1, 0.0, 0.0, 0.0, 0.1, 0.0, 1.0, 0.0]
    assert total == pytest.approx(1.2)
    # pushed onto the plate without ever grasping: no success reward
    pushed = rewards.staged_score(torch.tensor([False]), torch.tensor([False]), torch.tensor([True]))
    assert pushed.item() == 0.0


def test_sparse_reward_pays_only_success_after_a_grasp():
    success = torch.tensor([False, True, True, False])
    ever_grasped = torch.tensor([True, True, False, False])
    assert rewards.sparse_reward(success, ever_grasped).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_shaping_potential_pays_the_reach_then_the_place():
    near, far = rewards.closeness(torch.tensor([0.0])).item(), rewards.closeness(torch.tensor([0.2])).item()
    assert near == 1.0 and far == pytest.approx(1 - np.tanh(1.0))
    d_tcp, d_plate = torch.tensor([0.2, 0.0, 0.2, 0.2]), torch.tensor([0.3, 0.3, 0.0, 0.2])
    grasped = torch.tensor([False, False, True, True])
    phi = rewards.shaping_potential(d_tcp, d_plate, grasped, weight=0.1)
    # not grasped: reach only; grasped: reach saturated at 1 plus the place term
    assert phi.tolist() == pytest.approx([0.1 * far, 0.1, 0.1 * (1 + 1), 0.1 * (1 + far)])
    assert rewards.shaping_potential(d_tcp, d_plate, grasped, weight=0.0).abs().sum() == 0


def test_green_screen_keeps_foreground_and_replaces_the_rest():
    pytest.importorskip("mani_skill")
    from vla_envs.tasks.put_on_plate.env import composite

    rgb = torch.full((1, 2, 2, 3), 200, dtype=torch.uint8)
    seg = torch.tensor([[[[5], [7]], [[0], [9]]]], dtype=torch.int16)
    overlay = torch.full((1, 2, 2, 3), 10, dtype=torch.uint8)
    out, keep = composite(rgb, seg, overlay, torch.tensor([5, 9]))
    assert out[0, :, :, 0].tolist() == [[200, 10], [10, 200]]
    assert keep[0].tolist() == [[True, False], [False, True]]


# ------------------------------------------------------------------ asset packs
def _make_and_read_pack(root: str) -> tuple[int, int]:
    """In a worker process: ensure the procedural pack, then read every overlay image (what each
    env's constructor does). Returns (pack.json's inode, overlays read)."""
    from PIL import Image

    from vla_envs.tasks.put_on_plate.procedural import ensure_procedural_pack

    pack = load_pack(ensure_procedural_pack(Path(root)), "procedural")
    for overlay in pack.overlays:
        Image.open(overlay.image_file).convert("RGB")
    return (Path(root) / "pack.json").stat().st_ino, len(pack.overlays)


def test_env_workers_starting_together_make_one_procedural_pack(tmp_path):
    """Concurrent first use (several env workers on a fresh asset folder): one pack is generated
    and kept; a later generator used to delete it while others were reading its images."""
    import multiprocessing

    root = tmp_path / "assets" / "procedural"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.map(_make_and_read_pack, [str(root)] * 3)
    assert len({inode for inode, _ in results}) == 1 and all(n > 0 for _, n in results)
    assert (root / "pack.json").stat().st_ino == results[0][0]


def test_procedural_pack_has_the_official_shape(asset_root):
    pack = resolve_pack("procedural", asset_root)
    assert pack.kind == "procedural"
    assert len(pack.objects) == 25 and len({m.name for m in pack.objects}) == 25
    assert len(pack.overlays) == 21 and len(pack.plates) == 17  # the official pack's counts: 16 unseen plates
    assert len({m.name for m in pack.plates}) == 17
    assert all((m.bbox_size > 0).all() for m in pack.objects + pack.plates)
    # Main-v3's plate is the first one; object names make the instruction
    assert pack.plates[0].name == "plate" and pack.objects[0].name == "carrot"


def _lay_out_official(root: Path, procedural: Path) -> None:
    """A tiny pack in the official layout: other ids, .glb-less folders, bare model_db fields."""
    src, dst = procedural / "carrot", root / "official" / "carrot"
    for folder in ("more_carrot", "more_plate"):
        db = json.loads((src / folder / "model_db.json").read_text())
        out = {}
        for i, (model_id, entry) in enumerate(db.items()):
            new_id = f"bridge_{folder}_{i}"
            shutil.copytree(src / folder / model_id, dst / folder / new_id)
            out[new_id] = {"name": entry["name"], "bbox": entry["bbox"]}  # no scale, no density
        (dst / folder / "model_db.json").write_text(json.dumps(out))
    shutil.copytree(src / "more_table", dst / "more_table")


def test_same_loader_reads_an_official_layout_pack(asset_root, tmp_path):
    _lay_out_official(tmp_path, asset_root / "procedural")
    pack = resolve_pack("auto", tmp_path)  # official present: no warning, official wins
    assert pack.kind == "official" and len(pack.objects) == 25
    assert pack.objects[0].model_id == "bridge_more_carrot_0" and pack.objects[0].density == 1000.0


def test_bad_packs_name_the_file_and_field(asset_root, tmp_path):
    _lay_out_official(tmp_path, asset_root / "procedural")
    db = tmp_path / "official" / "carrot" / "more_carrot" / "model_db.json"
    entries = json.loads(db.read_text())
    first = next(iter(entries))
    del entries[first]["bbox"]
    db.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match=f"{db}.*lacks the field 'bbox'"):
        load_pack(tmp_path / "official", "official")
    db.write_text("{not json")
    with pytest.raises(ValueError, match=f"{db} is not valid JSON"):
        load_pack(tmp_path / "official", "official")
    with pytest.raises(AssetsMissingError, match="official/carrot"):
        resolve_pack("official", tmp_path / "empty")
    with pytest.raises(ValueError, match="allowed"):
        resolve_pack("bridge", tmp_path)


class FolderHub:
    """The hub's side of a fetch served from a folder laid out like the dataset; its checksums
    come from hashlib and from git itself (``git hash-object``), not from the code under test."""

    def __init__(self, root: Path, corrupt: str | None = None, only_missing: bool = False):
        """``only_missing``: download only the files not there yet, as huggingface_hub resumes a
        download into a folder (by its own record of what it fetched, not by checking contents)."""
        self.root, self.corrupt, self.only_missing = root, corrupt, only_missing

    def list_files(self, repo, revision):
        from vla_envs.tasks.put_on_plate.fetch import RemoteFile

        files = []
        for path in sorted(p for p in (self.root / "carrot").rglob("*") if p.is_file()):
            rel = path.relative_to(self.root).as_posix()
            if path.suffix == ".json":  # stored in git: the hub records the blob id
                blob = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True,
                                      check=True).stdout.strip()
                files.append(RemoteFile(rel, path.stat().st_size, None, blob))
            else:  # LFS: the hub records sha256
                files.append(RemoteFile(rel, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest(), None))
        return "c0ffee" + revision, files

    def download(self, repo, commit, local_dir):
        if self.only_missing:
            for path in (p for p in (self.root / "carrot").rglob("*") if p.is_file()):
                target = Path(local_dir) / path.relative_to(self.root)
                if not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
        else:
            shutil.copytree(self.root / "carrot", Path(local_dir) / "carrot", dirs_exist_ok=True)
        if self.corrupt:
            target = Path(local_dir) / self.corrupt
            data = bytearray(target.read_bytes())
            data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
            target.write_bytes(bytes(data))


@pytest.fixture
def hub_folder(asset_root, tmp_path):
    _lay_out_official(tmp_path / "hub", asset_root / "procedural")
    return tmp_path / "hub" / "official"


def test_fetch_assets_installs_a_verified_pack_and_check_finds_later_changes(hub_folder, tmp_path):
    from vla_envs.tasks.put_on_plate.fetch import AssetChecksumError, check_official, fetch_official

    assets = tmp_path / "assets"
    manifest = fetch_official(assets, "some/dataset", "v1", hub=FolderHub(hub_folder))
    assert manifest["commit"] == "c0ffeev1" and not (assets / "official.partial").exists()
    pack = resolve_pack("official", assets)
    assert pack.kind == "official" and len(pack.objects) == 25 and len(pack.overlays) == 21
    image = pack.overlays[3].image_file
    rel = image.relative_to(assets / "official").as_posix()
    assert manifest["files"][rel]["sha256"] == hashlib.sha256(image.read_bytes()).hexdigest()
    assert check_official(assets)["commit"] == "c0ffeev1"
    image.write_bytes(image.read_bytes()[:-1] + b"x")
    with pytest.raises(AssetChecksumError, match=f"{rel}: sha256"):
        check_official(assets)


@pytest.mark.reliability(fault='a corrupt asset download (a mesh, the asset database) or an offline fetch', cases=3,
                         outcome='refused naming the file and its checksum; the installed pack untouched')
def test_a_corrupt_or_failed_fetch_leaves_the_installed_pack_untouched(hub_folder, tmp_path, monkeypatch):
    from vla_envs.errors import VlaEnvError
    from vla_envs.tasks.put_on_plate.fetch import AssetChecksumError, HubDataset, check_official, fetch_official

    assets = tmp_path / "assets"
    fetch_official(assets, hub=FolderHub(hub_folder))
    mesh = "carrot/more_carrot/bridge_more_carrot_2/collision.obj"
    with pytest.raises(AssetChecksumError, match=f"{mesh}: sha256 .*, expected"):
        fetch_official(assets, hub=FolderHub(hub_folder, corrupt=mesh))
    db = "carrot/more_plate/model_db.json"
    with pytest.raises(AssetChecksumError, match=f"{db}: git blob id"):
        fetch_official(assets, hub=FolderHub(hub_folder, corrupt=db))
    assert check_official(assets)["commit"] == "c0ffeemain"  # the good pack is still there, whole
    # the real hub client, offline: a clear error, no partial install
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
    with pytest.raises(VlaEnvError, match="could not list RLinf/maniskill_assets@main.*machine with internet"):
        fetch_official(tmp_path / "other", hub=HubDataset())
    assert not (tmp_path / "other" / "official").exists()


@pytest.mark.reliability(fault="a fetch run again after a refused download; an interrupted download of another "
                               "revision", cases=2, outcome="the refused files are fetched again; nothing of the "
                               "other revision is installed")
def test_a_fetch_resumes_only_its_own_commit_and_fetches_refused_files_again(hub_folder, tmp_path):
    from vla_envs.tasks.put_on_plate.fetch import AssetChecksumError, check_official, fetch_official

    assets = tmp_path / "assets"
    partial = assets / "official.partial"
    mesh = "carrot/more_carrot/bridge_more_carrot_2/collision.obj"
    with pytest.raises(AssetChecksumError, match=f"{mesh}: sha256(.|\n)*removed from the download"):
        fetch_official(assets, "some/dataset", "v1", hub=FolderHub(hub_folder, corrupt=mesh))
    assert not (partial / mesh).exists() and (partial / "carrot/more_plate/model_db.json").is_file()
    fetch_official(assets, "some/dataset", "v1", hub=FolderHub(hub_folder, only_missing=True))  # resumed
    assert check_official(assets)["commit"] == "c0ffeev1"
    # a download of v1 cut short, holding a file v2 does not have; then v2 is fetched
    shutil.copytree(assets / "official", partial)
    (partial / ".commit").write_text("c0ffeev1\n")
    (partial / "carrot" / "only_in_v1.json").write_text("{}")
    fetch_official(assets, "some/dataset", "v2", hub=FolderHub(hub_folder, only_missing=True))
    assert check_official(assets)["commit"] == "c0ffeev2" and not (assets / "official/carrot/only_in_v1.json").exists()


def test_fetch_assets_cli_check_without_a_fetched_pack_names_the_manifest(tmp_path, capsys):
    from vla_envs.cli import main

    assert main(["fetch-assets", "--check", "--asset-dir", str(tmp_path)]) == 2
    assert "FETCHED.json is missing" in capsys.readouterr().err


@pytest.mark.reliability(fault='a malformed camera file (size, intrinsics, a pose that is not rigid)', cases=3,
                         outcome='refused naming the field')
def test_camera_file_errors_name_the_field(tmp_path):
    cam = load_camera_file()
    assert cam.intrinsic_for(240, 320)[0, 0] == pytest.approx(cam.intrinsic[0, 0] / 2)
    data = json.loads(DEFAULT_CAMERA_FILE.read_text())
    for field, value, text in [("width", -3, "'width'"), ("intrinsic", [[1, 0], [0, 1]], "'intrinsic'"),
                               ("T_base_from_cam", [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
                                "'T_base_from_cam' is not a rigid")]:
        bad = dict(data, **{field: value})
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=text):
            load_camera_file(path)
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)))
    (tmp_path / "list.json").write_text("[1, 2]")
    for name, text in (("binary.json", "is not valid JSON"), ("list.json", "holds a JSON list"), ("", "is a folder")):
        with pytest.raises(ValueError, match=text):
            load_camera_file(tmp_path / name)


def test_camera_crop_is_the_pinhole_camera_of_the_region():
    cam = load_camera_file()
    point = np.array([0.05, -0.02, 0.6])  # in front of the camera, OpenCV axes
    u, v, _ = cam.intrinsic @ point / point[2]
    crop = (200, 80, 440, 320)
    uc, vc, _ = cam.intrinsic_for(64, 64, crop) @ point / point[2]
    # OpenCV pixel centres: the centre of source pixel x is at x, its area [x - 0.5, x + 0.5)
    assert (uc, vc) == pytest.approx(((u + 0.5 - 200) * 64 / 240 - 0.5, (v + 0.5 - 80) * 64 / 240 - 0.5))
    np.testing.assert_allclose(cam.intrinsic_for(480, 640), cam.intrinsic)  # the whole image, unscaled
    np.testing.assert_allclose(cam.render_intrinsic_for(480, 640)[:2, 2], cam.intrinsic[:2, 2] + 0.5)
    np.testing.assert_allclose(cam.intrinsic_for(48, 64, None), cam.intrinsic_for(48, 64))
    assert cam.crop_fractions(crop) == pytest.approx((200 / 640, 80 / 480, 440 / 640, 320 / 480))
    for bad in [(0, 0, 700, 100), (100, 50, 100, 60), (-1, 0, 10, 10), (1, 2, 3), "left"]:
        with pytest.raises(ValueError, match="camera_crop"):
            cam.check_crop(bad)


# ------------------------------------------------------------------ the simulated task
@pytest.fixture(scope="module")
def sim_env(asset_root, monkeypatch_module):
    pytest.importorskip("mani_skill")
    import gymnasium as gym

    import vla_envs  # noqa: F401

    monkeypatch_module.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=64, low_poly=True,
                   vectorization="serial", time_limit=80)
    yield env
    env.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.slow
@pytest.mark.maniskill
def test_reset_matches_the_episode_id(sim_env):
    split = episodes.get_split("train")
    pairs = episodes.position_pairs()
    far = int(np.argmax(np.linalg.norm(pairs[:, 0] - pairs[:, 1], axis=1)))  # object well off the plate
    eid = episodes.encode(episodes.Episode(object=3, plate=0, overlay=5, position=far, yaw=2), split)
    obs, info = sim_env.reset(seed=0, options={"state_ids": np.array([eid])})
    assert info["state_id"][0] == eid
    assert obs["instruction"] == ("put yellow carrot on plate",)
    assert obs["image"].shape == (1, 64, 64, 3) and obs["image"].std() > 5
    again, _ = sim_env.reset(options={"state_ids": np.array([eid])})
    np.testing.assert_array_equal(obs["image"], again["image"])
    assert sim_env.asset_pack == "procedural"
    out = sim_env.chunk_step(np.zeros((1, 4, 7), np.float32))
    assert out.valid.all() and np.isfinite(out.rewards).all()


@pytest.mark.slow
@pytest.mark.maniskill
def test_camera_crop_renders_the_region_of_the_full_view(asset_root, monkeypatch):
    """The cropped camera sees what cropping the full image shows (same pixel centres)."""
    import gymnasium as gym

    import vla_envs  # noqa: F401

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    images = {}
    for name, kwargs in [("full", dict(image_size=(240, 320))),
                         ("crop", dict(image_size=120, camera_crop=(200, 80, 440, 320)))]:
        env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, low_poly=True, vectorization="serial", **kwargs)
        obs, _ = env.reset(seed=0, options={"state_ids": np.array([1234])})
        images[name] = obs["image"][0].astype(np.float32)
        env.close()
    region = images["full"][40:160, 100:220]  # the crop at half the file's resolution
    assert np.abs(images["crop"] - region).mean() < 6.0
    shifted = images["full"][40:160, 90:210]  # 10 px off: clearly different
    assert np.abs(images["crop"] - shifted).mean() > 2 * np.abs(images["crop"] - region).mean()
    with pytest.raises(ValueError, match="camera_crop"):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, camera_crop=(0, 0, 641, 480))


@pytest.mark.slow
@pytest.mark.maniskill
def test_the_policy_sees_what_a_real_frame_of_the_rendered_view_becomes(asset_root, monkeypatch):
    """``native_render`` (the default): the 64 px picture of a crop is what a real camera's frame of
    the whole view becomes on the robot (``twin_image``: the crop, then ``resize_rgb``), so the
    twin's picture and the real one differ by the scene only. Rendered at 64 px directly
    (``native_render=False``) its edges are aliased, as no camera's are."""
    import gymnasium as gym

    import vla_envs  # noqa: F401
    from vla_envs.backends.franka.twin import twin_image

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    crop = (190, 80, 460, 350)
    images = {}
    for name, kwargs in [("view", {}), ("native", dict(image_size=64, camera_crop=crop)),
                         ("direct", dict(image_size=64, camera_crop=crop, native_render=False))]:
        env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, low_poly=True, vectorization="serial", **kwargs)
        obs, _ = env.reset(seed=0, options={"state_ids": np.array([1234])})
        images[name] = obs["image"][0].astype(int)
        env.close()
    assert images["view"].shape == (480, 640, 3)  # the camera file's own resolution
    real = twin_image(images["view"].astype(np.uint8), 64, crop, (480, 640)).astype(int)
    native, direct = np.abs(images["native"] - real).mean(), np.abs(images["direct"] - real).mean()
    assert native < 0.3, native  # measured 0.08: the few edge pixels the two renders draw apart
    assert direct > 5 * native and direct > 1.0, (direct, native)  # measured 2.6


@pytest.mark.slow
@pytest.mark.maniskill
def test_object_set_on_the_plate_in_the_simulator_succeeds(sim_env):
    import sapien

    sim_env.reset(seed=1)
    task = sim_env.backend.envs[0]._env.unwrapped
    obj = task.objects[int(task.sel["object"][0])]
    plate = task.plates[int(task.sel["plate"][0])]
    p = plate.pose.p[0].numpy()
    obj.set_pose(sapien.Pose(p=[p[0], p[1], p[2] + 0.03]))
    _, reward, _, _, info = sim_env.step(np.zeros((1, 7), np.float32))
    assert info["success"][0]
    assert reward[0] == 0.0 and not info["grasped"][0]  # never grasped: no success reward
    obj.set_pose(sapien.Pose(p=[p[0] + 0.2, p[1], p[2] + 0.03]))  # dropped beside the plate
    _, _, _, _, info = sim_env.step(np.zeros((1, 7), np.float32))
    assert not info["success"][0]


@pytest.mark.slow
@pytest.mark.maniskill
@pytest.mark.parametrize("seed,max_speed", [(1, 1.0), (2, 1.0), (1, 0.3)])  # episodes 546460, 203791
def test_scripted_expert_solves_fixed_seeds(sim_env, seed, max_speed):
    success, fastest = run_expert_episode(sim_env, seed, max_speed)
    assert fastest <= max_speed + 1e-6
    assert success


@pytest.mark.slow
@pytest.mark.maniskill
def test_grasp_is_reported_per_step_and_per_episode(sim_env):
    """The task's ``grasped`` progress flag: the expert's episode holds the object at some
    steps (and ends with it released on the plate); an arm that never moves never grasps."""
    assert sim_env.progress_flags == ("grasped",)
    infos = []
    success, _ = run_expert_episode(sim_env, 1, on_step=infos.append)
    grasped_steps = [bool(info["grasped"][0]) for info in infos]
    assert success and any(grasped_steps) and not grasped_steps[0]
    assert infos[-1]["episode"]["grasped_once"][0]
    sim_env.reset(seed=1)
    for _ in range(80):
        _, _, terminated, truncated, info = sim_env.step(np.zeros((1, 7), np.float32))
        if terminated[0] or truncated[0]:
            break
    assert not info["episode"]["grasped_once"][0] and not info["episode"]["success_once"][0]


@pytest.mark.slow
@pytest.mark.maniskill
def test_evaluate_counts_each_control_step_once(sim_env):
    """ManiSkill's reset() calls evaluate() for the whole batch; on a GPU batch's partial reset the
    other envs must not count their last step again (a grasp streak paid a step early, the
    PositionChange object moved twice). Extra evaluate() calls change nothing."""
    task = sim_env.backend.envs[0]._env.unwrapped
    seen = []

    def state():
        return [t.clone() for t in (task.grasp_streak, task.ever_grasped, task.ever_consecutive, task.score)]

    def on_step(info):
        if info["grasped"][0] and not seen:
            before = state()
            for _ in range(3):
                task.get_info()
            seen.append((before, state()))

    assert run_expert_episode(sim_env, 1, on_step=on_step)[0]
    (before, after), = seen
    assert before[0][0] >= 1  # the streak counts the step that grasped
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def run_expert_episode(env, seed: int, max_speed: float = 1.0, on_step=None) -> tuple[bool, float]:
    """One scripted-expert episode on a 1-env PutOnPlate env: (success_once, largest translation command)."""
    from vla_envs.tasks.put_on_plate.expert import ScriptedExpert

    env.reset(seed=seed)
    expert = ScriptedExpert(1, max_speed=max_speed)
    success, fastest = False, 0.0
    for _ in range(80):
        action = expert.act(env_rows(env.expert_state()))
        fastest = max(fastest, float(np.abs(action[:, :3]).max()))
        _, _, terminated, truncated, info = env.step(action)
        success |= bool(info["success"][0])
        if on_step is not None:
            on_step(info)
        if terminated[0] or truncated[0]:
            break
    return success, fastest


@pytest.mark.maniskill
def test_expert_state_is_one_batched_call_on_every_backend(asset_root, monkeypatch):
    """The task's privileged state through the contract (``env.expert_state()``, ``[N, ...]``),
    alike from the worker pool, the serial backend and the batched in-process backend (the GPU
    code path, here on CPU physics with one env), for the same initial states; and the scripted
    expert solves an episode driven through the batched backend."""
    import gymnasium as gym

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    common = dict(image_size=32, low_poly=True, sim_freq=100, time_limit=80, sim_backend="physx_cpu")
    envs = {v: gym.make("PutOnPlateInScene25Main-v3", num_envs=n, vectorization=v, **common)
            for v, n in (("serial", 2), ("pool", 2), ("batched", 1))}
    try:
        states = {}
        for v, env in envs.items():
            env.reset(options={"state_ids": np.array([3, 11][: env.num_envs])})
            states[v] = env.expert_state()
        assert set(states["pool"]) == set(states["serial"]) == set(states["batched"]) >= {"tcp", "object", "grasped"}
        for key, value in states["serial"].items():
            assert value.shape[0] == 2 and states["batched"][key].shape == (1, *value.shape[1:]), key
            np.testing.assert_allclose(states["pool"][key], value, atol=1e-5, err_msg=key)
            np.testing.assert_allclose(states["batched"][key], value[:1], atol=1e-4, err_msg=key)
        assert states["serial"]["tcp"].shape == (2, 7) and not states["serial"]["grasped"].any()
        success, _ = run_expert_episode(envs["batched"], seed=1)
        assert success
    finally:
        for env in envs.values():
            env.close()


@pytest.mark.slow
@pytest.mark.maniskill
def test_lower_sim_freq_takes_fewer_sub_steps_and_the_expert_still_solves(asset_root, monkeypatch):
    import gymnasium as gym

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=64, low_poly=True, sim_freq=100,
                   vectorization="serial", time_limit=80)
    try:
        task = env.backend.envs[0]._env.unwrapped
        assert (task.sim_freq, task.control_freq, task._sim_steps_per_control) == (100, 5, 20)
        assert run_expert_episode(env, seed=1)[0]
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.maniskill
def test_reward_shaping_pays_the_expert_its_progress_and_telescopes(asset_root, monkeypatch):
    import gymnasium as gym

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=64, low_poly=True, sim_freq=100,
                   vectorization="serial", time_limit=80, reward_shaping=0.1, auto_reset=False)
    try:
        from vla_envs.tasks.put_on_plate.expert import ScriptedExpert

        env.reset(seed=1)
        task = env.backend.envs[0]._env.unwrapped
        first = float(task.score[0])
        assert 0 < first < 0.1  # the gripper starts away from the object
        expert, rewards_seen, success = ScriptedExpert(1), [], False
        for _ in range(80):
            _, reward, terminated, truncated, info = env.step(expert.act(env_rows(env.expert_state())))
            rewards_seen.append(float(reward[0]))
            success |= bool(info["success"][0])
            if terminated[0] or truncated[0]:
                break
        assert success
        # the first step pays its own progress, not the starting potential; the sum telescopes
        assert 0 < rewards_seen[0] < first
        assert sum(rewards_seen) == pytest.approx(float(task.score[0]) - first, abs=1e-5)
        assert sum(rewards_seen) > rewards.MAX_STAGED_SCORE  # grasp, hold, success, and the shaping
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.maniskill
def test_sparse_reward_pays_the_expert_once_at_its_success(asset_root, monkeypatch):
    import gymnasium as gym

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=64, low_poly=True, sim_freq=100,
                   vectorization="serial", time_limit=80, reward_mode="sparse", auto_reset=False)
    try:
        from vla_envs.tasks.put_on_plate.expert import ScriptedExpert

        env.reset(seed=1)
        expert, rewards_seen, grasped = ScriptedExpert(1), [], []
        for _ in range(80):
            _, reward, terminated, truncated, info = env.step(expert.act(env_rows(env.expert_state())))
            rewards_seen.append(float(reward[0]))
            grasped.append(bool(info["grasped"][0]))
            if terminated[0] or truncated[0]:
                break
        assert terminated[0] and info["success"][0]
        # nothing for the grasp (it held the object for steps before), 1 at the success that ends it
        assert any(grasped) and rewards_seen[-1] == 1.0 and sum(rewards_seen) == 1.0
    finally:
        env.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"reward_mode": "normalized_dense"},
     r"reward_mode='normalized_dense'; must be one of \['dense', 'sparse', 'none'\]"),
    ({"reward_mode": "sparse", "reward_shaping": 0.1}, r"reward_shaping=0.1 with reward_mode='sparse'"),
])
def test_reward_mode_must_be_known_and_not_shaped(kwargs, message):
    import gymnasium as gym

    import vla_envs  # noqa: F401

    with pytest.raises(ValueError, match=message):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, **kwargs)


@pytest.mark.parametrize("bad", [-0.1, True, "0.1", float("nan")])
def test_reward_shaping_must_be_a_non_negative_number(bad):
    import gymnasium as gym

    import vla_envs  # noqa: F401

    with pytest.raises(ValueError, match=r"reward_shaping=.*must be a number >= 0"):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, reward_shaping=bad)


@pytest.mark.parametrize("bad", [0, 7, 100.0, True, -5])
def test_sim_freq_must_be_a_multiple_of_the_control_frequency(bad):
    import gymnasium as gym

    import vla_envs  # noqa: F401

    with pytest.raises(ValueError, match=r"sim_freq=.*multiple of the 5 Hz control frequency"):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, sim_freq=bad)


def test_perturb_adds_noise_to_translation_and_yaw_only():
    from vla_envs.cli import PERTURBED_DIMS, perturb

    actions = np.tile(np.array([0.5, -0.5, 0.0, 0.0, 0.0, 0.9, 1.0], np.float32), (64, 1, 1))
    assert perturb(actions, 0.0, np.random.default_rng(0)) is actions
    out = perturb(actions, 0.5, np.random.default_rng(0))
    assert out.shape == actions.shape and out.dtype == np.float32
    kept = [d for d in range(7) if d not in PERTURBED_DIMS]
    np.testing.assert_array_equal(out[..., kept], actions[..., kept])
    assert (out[..., PERTURBED_DIMS] != actions[..., PERTURBED_DIMS]).mean() > 0.9
    assert out.min() >= -1.0 and out.max() <= 1.0 and (out[..., 5] == 1.0).any()  # clipped
    np.testing.assert_array_equal(out, perturb(actions, 0.5, np.random.default_rng(0)))


@pytest.mark.slow
@pytest.mark.maniskill
def test_expert_taking_over_a_held_object_carries_it_on_to_the_plate(sim_env):
    """What a late ``collect-corrections`` hand-over relies on: ``expert_state`` says the object is
    held, and a new expert taking over then keeps it closed in the gripper up to the release
    (the old take-over opened it and started over above the object) and solves the episode."""
    from vla_envs.tasks.put_on_plate.expert import CLOSE, PHASES, ScriptedExpert

    sim_env.reset(seed=1)
    first = ScriptedExpert(1)
    state = env_rows(sim_env.expert_state())[0]
    assert not state["grasped"]
    for _ in range(80):  # the first expert grasps and lifts, then hands over at the carry
        sim_env.step(first.act([state]))
        state = env_rows(sim_env.expert_state())[0]
        if PHASES[first.phase[0]] == "carry":
            break
    assert PHASES[first.phase[0]] == "carry" and state["grasped"]
    second = ScriptedExpert(1)
    second.take_over(np.array([0]), [state])
    success, grips = False, []
    for _ in range(40):
        action = second.act(env_rows(sim_env.expert_state()))
        if PHASES[second.phase[0]] not in ("open", "retreat"):
            grips.append(float(action[0, 6]))
        _, _, terminated, truncated, info = sim_env.step(action)
        success |= bool(info["success"][0])
        if terminated[0] or truncated[0]:
            break
    assert grips and all(g == CLOSE for g in grips) and success


@pytest.mark.slow
@pytest.mark.maniskill
def test_scripted_expert_recovers_from_perturbed_actions(sim_env):
    """What ``collect-demos --action-noise`` relies on: executing noisy actions, the closed-loop
    expert still solves the episode, so the recorded recoveries are successful demos."""
    from vla_envs.cli import perturb
    from vla_envs.tasks.put_on_plate.expert import ScriptedExpert

    sim_env.reset(seed=1)
    expert, rng = ScriptedExpert(1), np.random.default_rng(0)
    success, moved_off = False, 0.0
    for _ in range(80):
        action = expert.act([env_rows(sim_env.expert_state())[0]])
        executed = perturb(action[:, None], 0.1, rng)[:, 0]
        moved_off = max(moved_off, float(np.abs(executed - action).max()))
        _, _, terminated, truncated, info = sim_env.step(executed)
        success |= bool(info["success"][0])
        if terminated[0] or truncated[0]:
            break
    assert moved_off > 0.1 and success


@pytest.mark.slow
@pytest.mark.maniskill
def test_collect_demos_writes_the_documented_format(asset_root, tmp_path, monkeypatch):
    from vla_envs.cli import main
    from vla_envs.demos import load_demos

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    out = tmp_path / "demos"
    assert main(["collect-demos", "PutOnPlateInScene25Main-v3", "--num-envs", "1", "--episodes", "1",
                 "--image-size", "32", "--all", "--out", str(out), "--action-noise", "0.2",
                 "--expert-kwargs", '{"max_speed": 0.5}', "--env-kwargs",
                 '{"low_poly": true, "vectorization": "serial", "time_limit": 12}']) == 0
    index, recorded = load_demos(out)
    assert index["asset_pack"] == "procedural" and len(recorded) == 1 and index["action_noise"] == 0.2
    assert index["expert_kwargs"] == {"max_speed": 0.5}
    ep = recorded[0]
    assert np.abs(ep["action"][:, :3]).max() <= 0.5 + 1e-6 and np.abs(ep["action"][:, :3]).max() > 0.4
    assert ep["image"].shape == (12, 32, 32, 3) and ep["action"].shape == (12, 7)
    assert str(ep["instruction"]).startswith("put ") and index["episodes"][0]["length"] == 12
    # the privileged poses (labels for vision pretraining): the object starts on the position grid
    assert index["scene_bodies"] == ["tcp", "object", "plate"] and ep["scene"].shape == (12, 21)
    object_xy = ep["scene"][0, 7:9]
    assert np.all(np.abs(object_xy - episodes.GRID_CENTER_XY) <= episodes.GRID_HALF_EDGE_M + 0.01)
    assert sorted(p.name for p in out.iterdir()) == ["episode_000000.npz", "index.json"]  # no temporary file left
    # the same command again must not overwrite these demos
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["collect-demos", "PutOnPlateInScene25Main-v3", "--episodes", "1", "--out", str(out)]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("args,named", [
    (["--action-noise", "1.5"], "--action-noise"), (["--action-noise", "-0.1"], "--action-noise"),
    (["--expert-kwargs", '{"max_speed": 1.5}'], "max_speed must be in (0, 1]"),
    (["--expert-kwargs", '{"speed": 0.3}'], "unexpected keyword argument 'speed'"),
])
def test_collect_demos_rejects_bad_expert_options(args, named, tmp_path, capsys):
    from vla_envs.cli import main

    assert main(["collect-demos", "PutOnPlateInScene25Main-v3", "--out", str(tmp_path / "d"), *args]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_collect_demos_of_a_task_without_an_expert_names_no_flag_it_lacks(tmp_path, capsys):
    from vla_envs.cli import main

    assert main(["collect-demos", "vla/PickCube-v1", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "vla/PickCube-v1 has no scripted expert" in err and "--policy" not in err


@pytest.mark.reliability(fault="demos recorded into a folder that already holds demos, or into a file", cases=2,
                         outcome="refused before the envs start; the earlier demos untouched")
def test_collect_demos_refuses_a_folder_with_demos_or_a_file_before_starting_envs(tmp_path, capsys):
    from vla_envs.cli import main

    write_demos(tmp_path / "old")
    (tmp_path / "a_file").write_text("x")
    for out, says in (("old", "already holds demos"), ("a_file", "is a file")):
        assert main(["collect-demos", "PutOnPlateInScene25Main-v3", "--out", str(tmp_path / out)]) == 2
        assert says in capsys.readouterr().err
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.slow
@pytest.mark.maniskill
def test_vla_eval_reports_success_and_the_env_kwargs(asset_root, tmp_path, monkeypatch, capsys):
    """``vla-eval`` of a (random) tiny policy on the cropped main task: both success notions and
    the env options it ran with, so a report says which view the policy saw."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_trainer.checkpoint import save_model
    from vla_trainer.cli.eval import main as vla_eval
    from vla_trainer.models import VLAPolicy, build_model

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    save_model(VLAPolicy(*build_model("tiny-openvla-oft", seed=0)), tmp_path / "model")
    kwargs = {"low_poly": True, "time_limit": 8, "camera_crop": [190, 80, 460, 350]}
    assert vla_eval(["--checkpoint", str(tmp_path / "model"), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--env-kwargs", json.dumps(kwargs),
                     "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["env_kwargs"] == kwargs
    row = report["rows"][0]
    assert row["env_id"] == "PutOnPlateInScene25Main-v3" and row["asset_pack"] == "procedural"
    assert 0.0 <= row["success_at_end"] <= row["success_once"] <= 1.0
    assert 0.0 <= row["grasped_once"] <= 1.0  # partial success, a column of the table too
    assert "| success_once | success_at_end | grasped_once |" in (tmp_path / "eval" / "eval.md").read_text()
    low, high = row["success_once_ci95"]
    assert low <= row["success_once"] <= high and high - low > 0.5  # one episode says little
    assert f"(95 % CI {low:.3f}-{high:.3f})" in (tmp_path / "eval" / "eval.md").read_text()
    assert vla_eval(["--checkpoint", str(tmp_path / "model"), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial",
                     "--env-kwargs", json.dumps({**kwargs, "camera_crop": [0, 0, 900, 10]})]) == 2
    # re-planning every 4 actions is recorded with the results; more than the chunk (8) is refused
    assert vla_eval(["--checkpoint", str(tmp_path / "model"), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--env-kwargs", json.dumps(kwargs), "--execute-steps", "4",
                     "--out", str(tmp_path / "eval4"), "--baseline", str(tmp_path / "eval")]) == 0
    compared = capsys.readouterr().out.split("against the baseline")[1]  # the first run as the baseline
    assert "success_once" in compared and "Fisher's exact test, two-sided: p = " in compared
    assert "initial states: the same 1 in both" in compared  # same --seed and --num-envs
    assert "settings: the same env options" in compared
    replanned = json.loads((tmp_path / "eval4" / "eval.json").read_text())
    assert replanned["sampling"] == "temperature 0.6, re-planning every 4 actions"
    assert replanned["rows"][0]["length"] == 8.0
    assert replanned["rows"][0]["episodes"]["state_id"] == row["episodes"]["state_id"]  # recorded in eval.json
    assert vla_eval(["--checkpoint", str(tmp_path / "model"), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--execute-steps", "9"]) == 2
    assert "from 1 to the policy's chunk (8)" in capsys.readouterr().err
    assert vla_eval(["--checkpoint", str(tmp_path / "model"), "--baseline", str(tmp_path / "model")]) == 2
    assert "not a vla-eval result (eval.json with rows)" in capsys.readouterr().err


def _noise(tmp_path, texture: np.ndarray, mix: float, image_hw=(4, 8), crop=(0.0, 0.0, 1.0, 1.0)):
    from PIL import Image

    from vla_envs.tasks.put_on_plate.assets import Overlay
    from vla_envs.tasks.put_on_plate.vision_noise import VisionNoise

    Image.fromarray(texture).save(tmp_path / "tex.png")
    return VisionNoise([Overlay(tmp_path / "tex.png", tmp_path / "tex.png", mix)], image_hw, crop)


def test_texture_noise_is_the_photos_own_texture_stretched_over_the_robot_and_objects(tmp_path):
    """As the reference's VisionTexture: weight = the variant's factor x the photo's mix, the texture
    stretched over the box around the kept pixels, only kept pixels changed."""
    ramp = np.repeat(np.repeat(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], 48, 0), 3, 2)  # left dark
    noise = _noise(tmp_path, ramp, mix=0.4)
    rgb = torch.full((2, 4, 8, 3), 200, dtype=torch.uint8)
    keep = torch.zeros(2, 4, 8, dtype=torch.bool)
    keep[0, 1:3, 2:4] = True  # a box of columns 2-3
    keep[1, 0:4, 0:8] = True  # the whole image
    out = noise(rgb, keep, torch.tensor([0, 0]), texture_weight=0.5, image_weight=0.0).int()
    assert (out[0][~keep[0]] == 200).all()  # the background is left alone
    # weight 0.2: 0.8 * 200 + 0.2 * texture, the box's left column from the texture's left half
    left, right = out[0, 1, 2, 0].item(), out[0, 1, 3, 0].item()
    assert 160 <= left < 160 + 0.2 * 128 <= right <= 160 + 51
    assert out[1, 0, 0, 0] < out[1, 0, 3, 0] < out[1, 0, 7, 0]  # stretched over each env's own box
    assert torch.equal(noise(rgb, keep, torch.tensor([0, 0]), 0.0, 0.0), rgb)
    assert torch.equal(_noise(tmp_path, ramp, mix=0.0)(rgb, keep, torch.tensor([0, 0]), 0.5, 0.0), rgb)


def test_image_noise_is_a_window_of_the_double_size_texture_at_the_boxs_centre(tmp_path):
    """As the reference's VisionWhole: every pixel blended, the window moving with the box."""
    ramp = np.repeat(np.repeat(np.linspace(0, 255, 64).astype(np.uint8)[None, :, None], 48, 0), 3, 2)
    rgb = torch.full((2, 4, 8, 3), 100, dtype=torch.uint8)
    keep = torch.zeros(2, 4, 8, dtype=torch.bool)
    keep[0, :, 0] = True  # box at the left edge: the window starts near the texture's left
    keep[1, :, 7] = True  # at the right edge: the window starts near the texture's middle
    ids = torch.tensor([0, 0])
    half = _noise(tmp_path, ramp, mix=0.2)(rgb, keep, ids, texture_weight=0.0, image_weight=0.5).float()
    assert ((half - 0.9 * 100) / 0.1)[0].mean() < 80 < 150 < ((half - 0.9 * 100) / 0.1)[1].mean()  # weight 0.1
    texture = _noise(tmp_path, ramp, mix=1.0)(rgb, keep, ids, texture_weight=0.0, image_weight=1.0).float()
    # each window spans half the texture and starts at the box's centre pixel (clamped to 1..W-1, as
    # the reference's): column 1 of 8 or column 7, so the first pixel's centre samples 3/32 or 15/32 of it
    assert texture[0, 0, 0, 0].item() == pytest.approx(255 * 3 / 32, abs=4)
    assert texture[1, 0, 0, 0].item() == pytest.approx(255 * 15 / 32, abs=4)
    assert texture[1, 0, 7, 0].item() == pytest.approx(255 * 29 / 32, abs=4)


@pytest.mark.slow
@pytest.mark.maniskill
def test_every_variant_makes_resets_and_steps(asset_root, monkeypatch):
    import gymnasium as gym

    import vla_envs  # noqa: F401
    from vla_envs.tasks.put_on_plate.variants import VARIANTS

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    judged = []  # where each evaluate() finds the object when it judges success
    on_plate = rewards.object_on_plate
    monkeypatch.setattr(rewards, "object_on_plate", lambda op, *a: judged.append(op[0].clone()) or on_plate(op, *a))
    for env_id, variant in VARIANTS.items():
        env = gym.make(env_id, num_envs=1, image_size=32, low_poly=True, vectorization="serial")
        try:
            obs, info = env.reset(seed=3)
            task = env.backend.envs[0]._env.unwrapped
            sel = {k: int(v[0]) for k, v in task.sel.items()}
            cells = episodes.layout_xy(task.split.layout)[sel["position"]]
            on_table = lambda group: [a for a in group if float(a.pose.p[0, 2]) < 1.0]  # noqa: E731
            objects, plates = on_table(task.objects), on_table(task.plates)
            assert len(objects) == (2 if variant.distractor == "object" else 1), env_id
            assert len(plates) == (2 if variant.distractor == "plate" else 1), env_id
            assert sel["object"] in task.split.objects and sel["overlay"] in task.split.overlays
            assert sel["plate"] in task.split.plates and sel["yaw"] in task.split.yaw_ids
            trained = "put {object} on {plate}".format(object=task.pack.objects[sel["object"]].name,
                                                       plate=task.pack.plates[sel["plate"]].name)
            assert (obs["instruction"][0] == trained) == ("Instruct" not in env_id), env_id
            if variant.distractor:  # another model of the variant's, on the layout's third cell
                group = task.objects if variant.distractor == "object" else task.plates
                pool = task.split.distractors if task.split.distractors is not None else task.split.distractor_pool
                assert sel["distractor"] in pool and sel["distractor"] != sel[variant.distractor]
                xy = group[sel["distractor"]].pose.p[0, :2].numpy()
                assert np.linalg.norm(xy - cells[2]) < 0.01, env_id
            for _ in range(variant.move_object_at_step or 1):
                start = task.objects[sel["object"]].pose.p[0].clone()
                out = env.chunk_step(np.zeros((1, 1, 7), np.float32))
            assert out.valid.all() and np.isfinite(out.rewards).all()
            if variant.move_object_at_step:  # the object was dropped on the third cell, more than 15 cm away
                moved = task.objects[sel["object"]].pose.p[0].numpy()
                assert np.linalg.norm(moved[:2] - cells[2]) < 0.01 and moved[2] < episodes.OBJECT_SPAWN_Z
                assert np.linalg.norm(moved[:2] - start[:2].numpy()) > 0.14
                # the step it jumps is judged where it landed (the step's picture shows it there)
                assert np.linalg.norm(judged[-1][:2].numpy() - cells[2]) < 0.01, judged[-1]
        finally:
            env.close()


def test_the_variants_draw_what_the_references_ood_evaluation_draws():
    """The reference's ``obj_set="test"`` of each variant: its layouts (the same counts), unseen
    plates, objects, yaws and photos."""
    from vla_envs.tasks.put_on_plate.variants import VARIANTS

    sizes = {name: len(episodes.layout_xy(name)) for name in episodes.LAYOUTS}
    assert sizes == {"grid": 784, "ring": 628, "third_far_from_object": 2104, "third_far_from_plate": 2104}
    for name, (from_object, from_plate) in (("third_far_from_object", (0.15, 0.07)),
                                            ("third_far_from_plate", (0.07, 0.15))):
        t = episodes.layout_xy(name)
        assert (np.linalg.norm(t[:, 0] - t[:, 1], axis=1) > 0.07).all()
        assert (np.linalg.norm(t[:, 2] - t[:, 0], axis=1) > from_object - 1e-9).all()
        assert (np.linalg.norm(t[:, 2] - t[:, 1], axis=1) > from_plate - 1e-9).all()
    ring, grid = episodes.ring_xy(), episodes.grid_xy()
    step = np.linalg.norm(ring[:, None] - grid[None], axis=-1).min(axis=1)  # to the nearest grid cell
    assert ring.shape == (28, 2) and np.allclose(step[np.isclose(step, 0.03)], 0.03) and (step > 0.029).all()
    assert np.isclose(step, 0.03).sum() == 24  # the 4 corners are a diagonal step out

    def split(name, n_plates=17):
        return VARIANTS[f"PutOnPlateInScene25{name}-v3"].split(n_plates)

    assert split("Plate").plates == range(1, 17) and split("Plate", 4).plates == range(1, 4)
    assert split("Position").layout == "ring" and {float(episodes.YAWS_RAD[y]) for y in split("Position").yaw_ids} == {
        -np.pi / 8, -3 * np.pi / 8, -5 * np.pi / 8, -7 * np.pi / 8}
    multi_carrot, multi_plate = split("MultiCarrot"), split("MultiPlate")
    assert multi_carrot.num_episodes == 9 * 8 * 16 * 2104 * 4  # the reference's total_num_trials
    assert multi_plate.num_episodes == 16 * 16 * 15 * 21 * 2104 * 4
    assert split("PositionChange").layout == "third_far_from_object"
    with pytest.raises(ValueError, match="has 1 plate"):
        split("Plate", 1)
    # the two train-set runs of the reference's semantic category
    ind, dist = split("MultiCarrotTrain"), split("MultiPlateTrain")
    assert ind.num_episodes == 16 * 15 * 16 * 2104 * 4 and ind.objects == range(0, 16)
    assert dist.num_episodes == 16 * 16 * 21 * 2104 * 4 and dist.plates == range(0, 1)
    d = episodes.decode(np.arange(0, dist.num_episodes, 21 * 2104 * 4 - 1), dist)
    assert set(d["distractor"].tolist()) == set(range(1, 17)) and set(d["plate"].tolist()) == {0}
    counts = {c: sum(v.category == c for v in VARIANTS.values()) for c in ("vision", "semantic", "execution")}
    assert counts == {"vision": 5, "semantic": 7, "execution": 3}  # the paper's Table 2 columns


def test_the_ood_average_is_the_mean_of_the_category_averages_as_the_papers():
    """The paper's Avg. is the mean of its three category averages (RLinf-PPO: (82.03 + 78.35 +
    85.42) / 3 = 81.93); the mean over the 15 variants would weigh the 7 semantic ones more."""
    from vla_envs.tasks.put_on_plate.variants import ood_table

    rows = ([{"env_id": f"v{i}", "category": "vision", "success_once": 1.0, "success_at_end": 1.0} for i in range(5)]
            + [{"env_id": f"s{i}", "category": "semantic", "success_once": 0.0, "success_at_end": 0.0} for i in range(7)]
            + [{"env_id": f"e{i}", "category": "execution", "success_once": 0.5, "success_at_end": 0.5} for i in range(3)])
    averages, table = ood_table(rows, "header")
    assert averages["ood_all"]["success_once"] == pytest.approx(0.5)  # not 6.5 / 15
    assert averages["semantic"]["success_once"] == 0.0 and "OOD average (of the 3 categories)" in table


def test_reach_report_bands_count_each_episode_once():
    from tools.reach_report import after_the_grasp, by_closest_lateral, markdown

    # held steps, lift, closest to the plate, carried over it
    carry = {0.2: (30, 12.0, 1.0, True), 1.0: (4, 0.5, 20.0, False), 1.5: (20, 9.0, 12.0, False)}
    rows = [{"closest_lateral_cm": d, "lateral_at_lowest_cm": d + 1, "lowest_height_cm": 0.5, "grasped": d < 2,
             "success": d < 1,
             **dict(zip(("held_steps", "max_lift_cm", "closest_to_plate_cm", "carried_over_plate"),
                        carry.get(d, (0, 0.0, float("nan"), False))))}
            for d in (0.2, 1.0, 1.5, 4.0, 30.0)]
    bands = {tuple(b["band_cm"]): (b["episodes"], b["grasped"], b["success"]) for b in by_closest_lateral(rows)}
    assert bands[(0, 1)] == (1, 1, 1) and bands[(1, 2)] == (2, 2, 0) and bands[(3, 5)] == (1, 0, 0)
    assert bands[(10, float("inf"))] == (1, 0, 0) and sum(e for e, _, _ in bands.values()) == 5
    text = markdown(rows, "h")
    assert "| >= 10 cm | 1 | 0 | 0 |" in text and "grasped (3): median closest sideways approach 1.0 cm" in text
    # of 3 grasps, 2 lifted the object (the 0.5 cm rise is not a lift), 1 of those carried it over the plate
    assert after_the_grasp(rows) == {"grasped": 3, "lifted": 2, "over_plate": 1, "success": 1,
                                     "median_held_steps": 20.0}
    assert "| then carried over the plate | 1 |" in text
    assert "after the grasp" not in markdown(rows[3:], "h")  # no grasp, no carry table


@pytest.mark.slow
@pytest.mark.maniskill
def test_reach_report_follows_the_expert_through_the_carry(asset_root, monkeypatch):
    """Driven by the scripted expert, an episode shows a grasp, a lift and the object brought onto
    the plate: the carry measures are read from the simulation, not defaults."""
    import gymnasium as gym

    from tools.reach_report import after_the_grasp, reach_report

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=32, low_poly=True, vectorization="serial",
                   time_limit=40, auto_reset=False, ignore_terminations=True)
    try:
        [row] = reach_report(env, ExpertAsPolicy(env), 1, seed=1)
    finally:
        env.close()
    assert row["grasped"] and row["success"], row
    assert row["closest_lateral_cm"] < 2 and 5 <= row["held_steps"] < 40
    assert row["max_lift_cm"] >= 5  # the expert carries 12 cm above the plate
    assert row["closest_to_plate_cm"] < 3 and row["carried_over_plate"]
    assert after_the_grasp([row]) == {"grasped": 1, "lifted": 1, "over_plate": 1, "success": 1,
                                      "median_held_steps": float(row["held_steps"])}


@pytest.mark.slow
@pytest.mark.maniskill
def test_reach_report_cli_measures_each_episode(asset_root, tmp_path, monkeypatch, capsys):
    """``python -m tools.reach_report`` on a random tiny policy: one row per episode with the gripper's
    closest sideways approach no farther than its offset at its lowest point; bad counts refused."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_trainer.checkpoint import save_model
    from tools.reach_report import main as reach_report
    from vla_trainer.models import VLAPolicy, build_model

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    save_model(VLAPolicy(*build_model("tiny-openvla-oft", seed=0)), tmp_path / "model")
    common = ["--checkpoint", str(tmp_path / "model"), "--vectorization", "serial",
              "--env-kwargs", json.dumps({"low_poly": True, "time_limit": 8})]
    assert reach_report(common + ["--num-envs", "1", "--num-episodes", "2", "--out", str(tmp_path / "reach")]) == 0
    report = json.loads((tmp_path / "reach" / "reach.json").read_text())
    assert len(report["episodes"]) == 2
    for row in report["episodes"]:
        assert 0 <= row["closest_lateral_cm"] <= row["lateral_at_lowest_cm"] < 100
        assert np.isfinite(row["lowest_height_cm"]) and isinstance(row["grasped"], bool)
        # the carry is measured after a grasp only
        assert row["grasped"] or (row["held_steps"] == 0 and row["max_lift_cm"] == 0
                                  and np.isnan(row["closest_to_plate_cm"]) and not row["carried_over_plate"])
        assert 0 <= row["held_steps"] <= 8
    assert "| closest sideways approach | episodes | grasped | success |" in (tmp_path / "reach" / "reach.md").read_text()
    assert reach_report(common + ["--num-envs", "2", "--num-episodes", "3"]) == 2
    assert "must be a multiple of --num-envs" in capsys.readouterr().err
    # vla-train names where the diagnostic lives instead of parsing it as `rl` options
    from vla_trainer.cli.train import main as vla_train

    assert vla_train(["reach-report", *common]) == 2
    assert "python -m tools.reach_report" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["lift", ["lift", "fly"], None])
def test_expert_start_phases_must_name_the_experts_phases(bad):
    import gymnasium as gym

    import vla_envs  # noqa: F401

    with pytest.raises(ValueError, match=r"expert_start_phases=.*must be a list of the scripted expert's phases "
                                         r"\['above', 'descend', 'close', 'lift'"):
        gym.make("PutOnPlateInScene25Main-v3", num_envs=1, expert_start_phases=bad)


@pytest.mark.slow
@pytest.mark.maniskill
def test_expert_start_phases_start_where_the_expert_enters_them(asset_root, monkeypatch):
    """Each phase's start is the expert's state there: "above" is the episode's own start, "lift"
    holds the object on the table, "lower" holds it high over the plate; the grasp was evaluated
    (its reward is paid before the policy's first step), the time limit counts from the hand-over,
    and envs of a GRPO group (one initial state) start alike."""
    import gymnasium as gym

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    common = dict(num_envs=2, image_size=64, low_poly=True, sim_freq=100, vectorization="serial", time_limit=6,
                  auto_reset=False, use_fixed_reset_state_ids=True, group_size=2)
    starts = {}
    for phase in ("above", "lift", "lower"):
        env = gym.make("PutOnPlateInScene25Main-v3", expert_start_phases=[phase], **common)
        try:
            obs, info = env.reset(seed=4)
            np.testing.assert_array_equal(obs["image"][0], obs["image"][1])  # one group, one start
            states = env_rows(env.expert_state())
            task = env.backend.envs[0]._env.unwrapped
            starts[phase] = (obs["image"][0], states[0], bool(task.ever_grasped[0]))
            hold = np.zeros((2, 6, 7), np.float32)
            hold[..., 6] = 1.0  # keep the gripper closed
            out = env.chunk_step(hold)
            assert out.truncated[:, -1].all() and out.valid.all()  # 6 policy steps, whatever the expert took
        finally:
            env.close()
    plain = gym.make("PutOnPlateInScene25Main-v3", **common)
    try:
        obs, _ = plain.reset(seed=4)
        np.testing.assert_array_equal(obs["image"][0], starts["above"][0])
    finally:
        plain.close()
    above, lift, lower = (starts[p][1] for p in ("above", "lift", "lower"))
    assert not above["grasped"] and not starts["above"][2]
    assert lift["grasped"] and starts["lift"][2]
    assert np.linalg.norm(lift["object"][:3] - above["object"][:3]) < 0.02  # still where it stood
    assert lower["grasped"] and lower["object"][2] > lift["object"][2] + 0.05
    assert np.linalg.norm(lower["object"][:2] - lower["plate"][:2]) < float(lower["on_plate_radius"])


@pytest.mark.slow
@pytest.mark.maniskill
def test_a_seed_gives_the_same_pixels_after_other_episodes_as_in_a_new_env(asset_root, monkeypatch):
    """``reset(seed=s)`` makes what follows deterministic whatever the env ran before: the same
    states and the same pixels as a new env (parked models once landed on their shelf a little
    differently after each episode, and their shadows moved pixels of the view)."""
    import gymnasium as gym

    import vla_envs  # noqa: F401

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    kw = dict(num_envs=4, image_size=64, low_poly=True, assets="procedural", vectorization="serial",
              camera_crop=[190, 80, 460, 350])
    rng = np.random.default_rng(0)
    pushes = [rng.uniform(-1, 1, (4, 8, 7)).astype(np.float32) for _ in range(2)]

    def episode(env, seed):
        obs, _ = env.reset(seed=seed)
        frames, states = [obs["image"]], [obs["state"]]
        for a in pushes:
            obs = env.chunk_step(a).obs
            frames.append(obs["image"])
            states.append(obs["state"])
        return np.stack(frames), np.stack(states)

    env = gym.make("PutOnPlateInScene25Main-v3", **kw)
    try:
        frames_new, states_new = episode(env, 5)  # as a new env runs it
        episode(env, 6)  # another episode: the arm swings, the models are swapped
        frames, states = episode(env, 5)
    finally:
        env.close()
    np.testing.assert_array_equal(states, states_new)
    assert (frames != frames_new).sum() == 0


@pytest.mark.slow
@pytest.mark.maniskill
def test_eval_ood_runs_every_episode_to_the_time_limit_and_counts_exactly_the_episodes_asked(
        asset_root, monkeypatch, tmp_path):
    """``vla-envs eval-ood``: with terminations on, success_at_end would equal success_once. Every
    episode runs to the time limit instead, and exactly ``--episodes`` are counted."""
    import vla_envs.cli as cli
    from vla_envs.tasks.put_on_plate import variants

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(asset_root))
    monkeypatch.setattr(variants, "VARIANTS", {k: v for k, v in variants.VARIANTS.items() if k == "PutOnPlateInScene25Main-v3"})
    summaries = []
    run = cli.run_episodes
    monkeypatch.setattr(cli, "run_episodes", lambda a: summaries.append(run(a)) or summaries[-1])
    out = tmp_path / "ood"
    assert cli.main(["eval-ood", "--policy", "expert", "--episodes", "3", "--num-envs", "2", "--image-size", "32",
                     "--env-kwargs", '{"low_poly": true, "sim_freq": 100, "vectorization": "serial"}',
                     "--out", str(out)]) == 0
    (row,) = json.loads((out / "ood_eval.json").read_text())["rows"]
    assert row["episodes"] == 3 and summaries[0]["episodes"] == 3  # 4 ended together; 3 counted
    assert summaries[0]["length"] == 80  # not cut at the first success
    assert row["success_once"] > 0  # the expert solves some in 3 episodes
    assert "each ending at the time limit" in (out / "ood_eval.md").read_text()
