"""``vla-envs doctor`` on this machine (CPU, lavapipe, EGL): what passes, what is reported absent,
and a broken Vulkan setup reported with its fix (exit 1) instead of failing inside a worker."""

from __future__ import annotations

import pytest

from vla_envs.cli import main


def _rows(text: str) -> dict[str, str]:
    """{check: status} of the report, whose columns are as wide as their longest cell."""
    width = text.splitlines()[0].index("status")
    return {line[:width].strip(): line[width:].split()[0] for line in text.splitlines()[1:] if line[:width].strip()}


@pytest.mark.maniskill
def test_doctor_reports_this_machine(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no PhysX GPU library under this home
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["Vulkan (SAPIEN, ManiSkill)"] == "ok" and rows["EGL / OSMesa (MuJoCo, LIBERO)"] == "ok"
    assert rows["CUDA"] == "absent" and rows["PhysX GPU library"] == "absent"
    assert "vla-envs fetch-physx" in out
    assert any(name.startswith("assets: put-on-plate") and status == "ok" for name, status in rows.items())


@pytest.mark.maniskill
def test_a_broken_vulkan_setup_is_missing_with_its_fix(capsys, monkeypatch):
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/icd.json")
    monkeypatch.setenv("VK_DRIVER_FILES", "/nonexistent/icd.json")
    assert main(["doctor"]) == 1
    captured = capsys.readouterr()
    assert _rows(captured.out)["Vulkan (SAPIEN, ManiSkill)"] == "missing"
    assert "mesa-vulkan-drivers" in captured.out and "missing: Vulkan" in captured.err


@pytest.mark.maniskill
def test_the_physx_library_is_named_truncated_and_missing_where_cuda_would_use_it(monkeypatch, tmp_path):
    from vla_envs.backends.maniskill.physx import LIBRARY, physx_folder
    from vla_envs.doctor import check_physx

    monkeypatch.setenv("HOME", str(tmp_path))
    assert check_physx().status == "absent" and "is missing" in check_physx().detail
    cut = physx_folder() / LIBRARY
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"\0" * 100)  # what an interrupted download leaves
    assert "is truncated" in check_physx().detail
    on_gpu = check_physx(cuda=True)  # sim_backend='auto' would pick physx_cuda there
    assert on_gpu.status == "missing" and "picks 'physx_cuda'" in on_gpu.detail


def test_franky_sim_is_looked_for_where_the_setup_put_it(monkeypatch, tmp_path):
    pytest.importorskip("franky")
    from vla_envs.doctor import check_robot

    def franky_sim_row():
        (row,) = [c for c in check_robot() if c.name.startswith("franky-sim")]
        return row

    monkeypatch.setenv("VLA_FRANKY_SIM_VENV", str(tmp_path))
    assert franky_sim_row().status == "absent" and franky_sim_row().detail == str(tmp_path / "bin" / "franky-sim")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "franky-sim").touch()
    assert franky_sim_row().status == "ok"


def test_the_ros_arms_message_packages_are_reported_with_the_fix(monkeypatch):
    pytest.importorskip("rclpy")
    from vla_envs import doctor

    def ros_messages_row():
        (row,) = [c for c in doctor.check_robot() if c.name.startswith("ROS arm messages")]
        return row

    installed = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda m: installed(m) and m != "franka_msgs")  # a PC without them
    row = ros_messages_row()
    assert row.status == "absent" and "franka_msgs: not found" in row.detail
    assert "source the robot PC's ROS workspace" in row.fix
    monkeypatch.setattr(doctor, "_installed", lambda m: True if m.endswith("_msgs") else installed(m))
    assert ros_messages_row().status == "ok"


def test_a_long_detail_wraps_instead_of_losing_what_it_says():
    """The detail column was cut at 60 characters: a PhysX path ended '.../libPhysXGpu_64.' and never
    said 'is missing'."""
    from vla_envs.doctor import Check, report

    text = report([Check("PhysX GPU library", "missing", "/home/user/.sapien/physx/105.1-physx-5.3.1.patch0/"
                         "libPhysXGpu_64.so is missing (sim_backend picks 'physx_cuda')", "vla-envs fetch-physx")])
    assert "is missing" in text and "picks 'physx_cuda'" in text and text.count("vla-envs fetch-physx") == 1
    assert _rows(text) == {"PhysX GPU library": "missing"}


@pytest.mark.maniskill
def test_an_official_pack_that_does_not_load_is_missing_not_ok(monkeypatch, tmp_path):
    """An empty official/carrot folder was reported 'ok | official' while every PutOnPlate env failed
    (auto picks the official pack whenever its folder exists)."""
    from vla_envs.doctor import check_assets

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path))
    (tmp_path / "official" / "carrot").mkdir(parents=True)
    (row,) = [c for c in check_assets() if c.name.startswith("assets: put-on-plate")]
    assert row.status == "missing" and "official pack does not load" in row.detail and "model_db.json" in row.detail


def test_libero_task_files_that_are_not_there_are_named_before_any_worker(monkeypatch, tmp_path):
    """LIBERO's config pointing at missing files: doctor said 'ok | present' and a rollout died in a
    worker with a bare AssertionError."""
    pytest.importorskip("libero")
    import gymnasium as gym

    import vla_envs  # noqa: F401
    from vla_envs.doctor import check_assets
    from vla_envs.errors import AssetsMissingError

    (tmp_path / "config.yaml").write_text("assets: /nonexistent/assets\nbddl_files: /nonexistent/bddl\n"
                                          "init_states: /nonexistent/init\n")
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path))
    (row,) = [c for c in check_assets() if c.name.startswith("assets: libero")]
    assert row.status == "missing" and "/nonexistent/assets" in row.detail
    with pytest.raises(AssetsMissingError, match=r"libero_spatial: .* missing, e\.g\. /nonexistent/assets"):
        gym.make("libero_spatial", num_envs=1, vectorization="serial")


@pytest.mark.libero
def test_a_mujoco_gl_set_by_the_user_is_the_one_checked(monkeypatch):
    """LIBERO renders with the user's ``MUJOCO_GL`` when set: the doctor and the env probe that one
    (a value that cannot render was reported ok, and failed in every LIBERO worker)."""
    from vla_envs.backends.libero import rendering
    from vla_envs.doctor import check_egl

    monkeypatch.delenv("PYOPENGL_PLATFORM", raising=False)  # restored after: ensure_gl sets it
    monkeypatch.setenv("MUJOCO_GL", "opengl")  # not a MuJoCo backend: MuJoCo refuses it
    check = check_egl()
    assert check.status == "missing" and "MUJOCO_GL=opengl is set" in check.detail, check
    assert "unset MUJOCO_GL" in check.fix
    with pytest.raises(rendering.RenderingUnavailableError, match="MUJOCO_GL=opengl is set in the environment"):
        rendering.ensure_gl()
    monkeypatch.setenv("MUJOCO_GL", "egl")
    check = check_egl()
    assert check.status == "ok" and "set in the environment" in check.detail, check
    assert rendering.ensure_gl() == "egl"
