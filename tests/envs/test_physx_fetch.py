"""SAPIEN's PhysX GPU library: the check before a GPU env (a clear error offline instead of
SAPIEN's download traceback) and ``vla-envs fetch-physx`` against a zip served from loopback."""

from __future__ import annotations

import functools
import http.server
import io
import random
import threading
import zipfile

import pytest

pytest.importorskip("sapien", reason="needs the [maniskill] extra")

from vla_envs.backends.maniskill.physx import LIBRARY, check_physx_library, fetch_physx, physx_folder  # noqa: E402
from vla_envs.cli import main  # noqa: E402
from vla_envs.errors import AssetsMissingError  # noqa: E402

PAYLOAD = random.Random(0).randbytes(1_300_000)  # stands in for the library (incompressible, above the floor)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def served(tmp_path):
    """A loopback HTTP server over a folder; yields (folder, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_missing_library_is_named_with_the_url_and_the_command(tmp_path):
    with pytest.raises(AssetsMissingError) as info:
        check_physx_library(home=tmp_path)
    text = str(info.value)
    assert str(physx_folder(tmp_path) / LIBRARY) in text
    assert "github.com/sapien-sim/physx-precompiled/releases/download" in text and "linux-so.zip" in text
    assert "vla-envs fetch-physx" in text and "physx_cpu" in text
    truncated = physx_folder(tmp_path) / LIBRARY
    truncated.parent.mkdir(parents=True)
    truncated.write_bytes(b"\0" * 100)  # what a racing or interrupted download leaves
    with pytest.raises(AssetsMissingError, match="is truncated"):
        check_physx_library(home=tmp_path)


def test_fetch_installs_a_verified_library_atomically(served, tmp_path):
    root, url = served
    (root / "good.zip").write_bytes(_zip({LIBRARY: PAYLOAD}))
    home = tmp_path / "shared"
    path = fetch_physx(home=home, url=f"{url}/good.zip")
    assert path.read_bytes() == PAYLOAD and check_physx_library(home=home) == path
    # a bad download later leaves the installed library as it was, and nothing half-written
    (root / "cut.zip").write_bytes(_zip({LIBRARY: PAYLOAD})[:50_000])
    (root / "other.zip").write_bytes(_zip({"README": b"x" * 2_000_000}))
    (root / "small.zip").write_bytes(_zip({LIBRARY: b"tiny"}))
    for name, message in (("cut.zip", "not a zip archive"), ("other.zip", f"not {LIBRARY}"),
                          ("small.zip", "below"), ("absent.zip", "404")):
        with pytest.raises(RuntimeError, match=message):
            fetch_physx(home=home, url=f"{url}/{name}")
        assert path.read_bytes() == PAYLOAD
        assert [p.name for p in path.parent.parent.iterdir()] == [path.parent.name]  # no temp folder left


def test_the_cli_fetches_and_list_reports_it(served, tmp_path, capsys, monkeypatch):
    root, url = served
    (root / "good.zip").write_bytes(_zip({LIBRARY: PAYLOAD}))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["list"]) == 0
    assert "PhysX GPU library (sim_backend='physx_cuda'): missing" in capsys.readouterr().out
    assert main(["fetch-physx", "--url", f"{url}/good.zip"]) == 0
    assert main(["list"]) == 0
    assert "PhysX GPU library (sim_backend='physx_cuda'): present" in capsys.readouterr().out
    assert main(["fetch-physx", "--url", f"{url}/absent.zip"]) == 1
    assert "nothing was installed" in capsys.readouterr().err


class _CutHandler(http.server.BaseHTTPRequestHandler):
    """Sends the first 50,000 bytes of a good archive and hangs up: chunked (``/chunked``, which urllib
    reports as http.client.IncompleteRead, no OSError) or with the whole length declared."""

    body = b""

    def do_GET(self) -> None:
        part = self.body[:50_000]
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))  # no terminating chunk
        else:
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(part)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("path, message", [("/chunked", "IncompleteRead"), ("/declared", "truncated, 50000 of")])
def test_a_download_cut_short_is_named_and_installs_nothing(tmp_path, capsys, monkeypatch, path, message):
    _CutHandler.body = _zip({LIBRARY: PAYLOAD})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CutHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HOME", str(tmp_path))
        assert main(["fetch-physx", "--url", f"http://127.0.0.1:{server.server_address[1]}{path}"]) == 1
        err = capsys.readouterr().err
        assert message in err and "nothing was installed" in err and "Traceback" not in err
        assert not physx_folder(tmp_path).exists()
    finally:
        server.shutdown()
        server.server_close()
