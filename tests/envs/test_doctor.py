"""``vla-envs doctor`` on this machine (CPU, lavapipe, EGL): what passes, what is reported absent,
and a broken Vulkan setup reported with its fix (exit 1) instead of failing inside a worker."""

from __future__ import annotations

import pytest

from vla_envs.cli import main


def _rows(text: str) -> dict[str, str]:
    """{check: status} of the report, whose columns are as wide as their longest cell."""
    width = text.splitlines()[0].index("status")
    return {line[:width].strip(): line[width:].split()[0] for line in text.splitlines()[1:] if line.strip()}


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
