"""Policy serving for the robot: the shipped warm start served in process and over TCP, with the
wire format's refusals (oversized, malformed, pickled, a bad observation) and the bound address."""

from __future__ import annotations

import json
import pickle
import socket
import struct
import threading

import numpy as np
import pytest
from shipped_paths import SHIPPED_WARM_START

from vla_trainer.deploy.serve import PolicyClient, PolicyServer, PolicyService, ProtocolError, decode, encode, read_frame


@pytest.fixture(scope="module")
def service():
    return PolicyService(SHIPPED_WARM_START)


@pytest.fixture(scope="module")
def server(service):
    srv = PolicyServer(service, port=0, max_message_bytes=2**20)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _obs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), rng.normal(size=16).astype(np.float32)


def test_the_service_reads_what_the_checkpoint_expects(service):
    spec = service.spec
    assert (spec.image_size, spec.state_dim, spec.chunk_size, spec.action_dim) == (64, 16, 8, 7)
    assert spec.camera_crop == (190, 80, 460, 350)  # from the warm start's made_by.json
    assert spec.camera_hw == (480, 640)  # of the default camera its demos were rendered with
    assert spec.task == "PutOnPlateInScene25Main-v3"
    image, state = _obs()
    actions = service.act(image, "put carrot on plate", state)
    assert actions.shape == (8, 7) and actions.dtype == np.float32 and np.abs(actions).max() <= 1.0


@pytest.mark.reliability(fault='what the policy server listens on', cases=1,
                         outcome='127.0.0.1 unless told otherwise')
def test_the_server_binds_loopback_and_answers_like_the_service(service, server):
    assert server.server_address[0] == "127.0.0.1"
    image, state = _obs(1)
    with PolicyClient(port=server.server_address[1]) as client:
        assert client.describe() == service.spec
        np.testing.assert_array_equal(client.act(image, "put lime on plate", state),
                                      service.act(image, "put lime on plate", state))
        # a bad observation is refused with the policy's own message; the connection stays usable
        with pytest.raises(RuntimeError, match="64"):
            client.act(image[:32], "put lime on plate", state)
        with pytest.raises(RuntimeError, match="state"):
            client.act(image, "put lime on plate", None)
        assert client.act(image, "put lime on plate", state).shape == (8, 7)


def _raw(server, payload: bytes) -> tuple[dict, dict] | None:
    with socket.create_connection(server.server_address[:2], timeout=5) as s:
        s.sendall(payload)
        try:
            return decode(read_frame(s))
        except ConnectionError:
            return None


@pytest.mark.parametrize("payload,message", [
    (struct.pack(">I", 2**20 + 1), "exceeds the limit"),                                  # oversized, refused unread
    (struct.pack(">I", 9) + struct.pack(">I", 5) + b"{nope", "not UTF-8 JSON"),             # malformed header
    (lambda: (lambda p: struct.pack(">I", len(p)) + p)(pickle.dumps({"type": "act"})), "header"),  # never unpickled
    (encode({"type": "act", "instruction": "x"}), "needs an 'image'"),
    (encode({"type": "shutdown"}), "unknown request type"),
])
@pytest.mark.reliability(fault='malformed or oversized policy-server messages', cases=1,
                         outcome='refused with an error; the server keeps serving; nothing unpickled')
def test_malformed_requests_get_an_error_and_the_server_keeps_serving(server, payload, message):
    payload = payload() if callable(payload) else payload
    header, _ = _raw(server, payload)
    assert header["type"] == "error" and message in header["message"] and header["closed"] is True
    image, state = _obs()
    with PolicyClient(port=server.server_address[1]) as client:  # still serving
        assert client.act(image, "put corn on plate", state).shape == (8, 7)


class _SlowOnce:
    """The real service, answering its first request after ``delay_s`` (a GPU box under load)."""

    def __init__(self, service, delay_s):
        self.spec, self._service, self._delay_s = service.spec, service, delay_s

    def act(self, *args):
        delay, self._delay_s = self._delay_s, 0.0
        threading.Event().wait(delay)
        return self._service.act(*args)


@pytest.mark.reliability(fault='a policy reply that arrives after the client timed out', cases=1,
                         outcome='the connection is closed; no later call returns the stale chunk')
def test_a_reply_after_the_client_timed_out_is_never_taken_for_the_next_observation(service):
    srv = PolicyServer(_SlowOnce(service, 1.5), port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        image, _ = _obs(1)
        state_a, state_b = np.zeros(16, np.float32), np.ones(16, np.float32)
        chunk_b = service.act(image, "put lime on plate", state_b)
        assert not np.array_equal(service.act(image, "put lime on plate", state_a), chunk_b)
        with PolicyClient(port=srv.server_address[1], timeout_s=0.5) as client:
            with pytest.raises(TimeoutError):
                client.act(image, "put lime on plate", state_a)
            threading.Event().wait(1.5)  # the late reply for state_a has arrived by now
            with pytest.raises(ConnectionError, match="earlier failure.*new PolicyClient"):
                client.act(image, "put lime on plate", state_b)
        with PolicyClient(port=srv.server_address[1]) as client:  # a new client is answered afresh
            np.testing.assert_array_equal(client.act(image, "put lime on plate", state_b), chunk_b)
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_client_refuses_what_the_server_would_misread_before_sending(server):
    image, state = _obs()
    with PolicyClient(port=server.server_address[1], max_message_bytes=2**20) as client:
        with pytest.raises(ValueError, match="uint8 \\[H, W, 3\\]"):
            client.act(image / 255.0, "put lime on plate", state)  # would arrive as zeros
        with pytest.raises(ValueError, match="exceeds the server's limit of 1048576"):
            client.act(np.zeros((1000, 1000, 3), np.uint8), "put lime on plate", state)
        assert client.act(image, "put lime on plate", state).shape == (8, 7)  # nothing was sent


def test_decode_refuses_arrays_that_do_not_match_their_bytes():
    frame = encode({"type": "act"}, {"image": np.zeros((2, 2, 3), np.uint8)})
    with pytest.raises(ProtocolError, match="runs past the end"):
        decode(frame[4:-1])
    with pytest.raises(ProtocolError, match="dtype"):
        encode({"type": "act"}, {"x": np.zeros(2, object)})
    for shape in ([2**40, 2**40], [10**30], [2**62, 4]):  # sizes an int64 product would wrap or overflow
        header = json.dumps({"type": "act", "arrays": [{"name": "x", "dtype": "uint8", "shape": shape}]}).encode()
        with pytest.raises(ProtocolError, match="'x' .* runs past the end of the message"):
            decode(struct.pack(">I", len(header)) + header + b"\0" * 16)


def test_a_missing_server_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}.*vla-serve"):
        PolicyClient(port=port, timeout_s=1)


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded although an argument was bad")


@pytest.mark.parametrize("where", ["port in use", "not this machine's address"])
def test_vla_serve_names_an_address_it_cannot_listen_on_before_loading(where, monkeypatch, capsys):
    from vla_trainer.deploy import serve

    monkeypatch.setattr(serve, "PolicyService", _no_model)  # a 7B checkpoint takes minutes to load
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        host, port = ("127.0.0.1", busy.getsockname()[1]) if where == "port in use" else ("10.255.255.1", 0)
        assert serve.main(["--checkpoint", "m", "--host", host, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --host/--port: cannot listen on ") and f"{host}:{port}" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_ctrl_c_while_loading_ends_vla_serve_with_130_and_frees_the_port(monkeypatch, capsys):
    from vla_trainer.deploy import serve

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(serve, "PolicyService", interrupted)
    assert serve.main(["--checkpoint", "m", "--port", str(port)]) == 130
    err = capsys.readouterr().err
    assert err == "interrupted while loading the checkpoint; nothing was served\n"
    with socket.socket() as again:  # closed on the way out: the next start can listen there
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize("device, message", [("gpu", "expected cpu, cuda or cuda:N, got 'gpu'"),
                                             ("cuda:99", "cuda:99")])
def test_vla_serve_refuses_a_device_it_cannot_use_before_loading(device, message, monkeypatch, capsys):
    import torch

    from vla_trainer.deploy import serve

    monkeypatch.setattr(serve, "PolicyService", _no_model)
    with pytest.raises(SystemExit) as e:
        serve.main(["--checkpoint", "m", "--device", device])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device" in err and message in err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            serve.main(["--checkpoint", "m", "--device", "cuda"])
        assert e.value.code == 2 and "'cuda': no CUDA GPU here" in capsys.readouterr().err


def test_vla_serve_help_shows_the_default_port(capsys):
    from vla_trainer.deploy.serve import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "(default: 5555)" in " ".join(capsys.readouterr().out.split())


def test_the_vla_serve_command_serves_the_checkpoint_until_ctrl_c(service, tmp_path):
    """The command as a robot PC's operator starts it: it listens, loads, answers like the service
    in this process, and Ctrl-C ends it with exit 0."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    cli = Path(sys.executable).with_name("vla-serve")
    log = tmp_path / "stderr.log"  # the loading progress bar
    with open(log, "wb") as err:
        # SIGINT as a terminal gives it: the test process may hold it ignored (an xdist worker), which a
        # child inherits, and Python then never turns it into KeyboardInterrupt
        proc = subprocess.Popen([str(cli), "--checkpoint", str(SHIPPED_WARM_START), "--port", "0"],
                                stdout=subprocess.PIPE, stderr=err, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()  # "serving <model> on 127.0.0.1:<port> (Ctrl-C stops)"; "" if it died
        assert line.startswith("serving ") and " on 127.0.0.1:" in line, line + log.read_text()
        port = int(line.split(" on 127.0.0.1:")[1].split()[0])
        image, state = _obs(3)
        with PolicyClient(port=port, timeout_s=60) as client:
            assert client.describe() == service.spec
            np.testing.assert_allclose(client.act(image, "put carrot on plate", state),
                                       service.act(image, "put carrot on plate", state), atol=1e-6)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_model_with_several_action_statistics_acts_with_its_runs_set(tmp_path):
    """Official OpenVLA checkpoints carry several statistics sets (bridge_orig, fractal, ...); a run
    fine-tuned from one names its set in actor.model.unnorm_key. Serving and vla-eval act with that
    set (they refused the model before, asking for an option vla-eval did not have); a bare model
    folder still needs it named."""
    import argparse

    from tiny_vla import tiny

    from vla_trainer.checkpoint import save_model
    from vla_trainer.cli.eval import unnorm_key
    from vla_trainer.config import load_config
    from vla_trainer.config.loading import to_yaml
    from vla_trainer.models import UnknownUnnormKeyError, VLAPolicy

    stats = {k: {"action": {"q01": [-s] * 7, "q99": [s] * 7}} for k, s in (("bridge_orig", 1.0), ("fractal", 0.5))}
    model, tokenizer = tiny("tiny-openvla-oft", norm_stats=stats)
    save_model(VLAPolicy(model, tokenizer, unnorm_key="bridge_orig"), tmp_path / "ckpt" / "model")
    (tmp_path / "ckpt" / "config.yaml").write_text(
        to_yaml(load_config("cpu_grpo_tiny_put_on_plate", ["actor.model.unnorm_key=fractal"])))
    assert PolicyService(tmp_path / "ckpt").policy.unnorm_key == "fractal"
    assert PolicyService(tmp_path / "ckpt", unnorm_key="bridge_orig").policy.unnorm_key == "bridge_orig"
    args = argparse.Namespace(unnorm_key=None, recipe_unnorm_key="bridge_orig")
    assert unnorm_key(args, tmp_path / "ckpt" / "model", model) == "fractal"  # the checkpoint's run first
    bare = tmp_path / "bare"
    save_model(VLAPolicy(model, tokenizer, unnorm_key="bridge_orig"), bare)
    assert unnorm_key(args, bare, model) == "bridge_orig"  # then --env-from's, which the model holds
    assert unnorm_key(argparse.Namespace(unnorm_key=None, recipe_unnorm_key="libero"), bare, model) is None
    with pytest.raises(UnknownUnnormKeyError, match="pass unnorm_key"):
        PolicyService(bare)  # a bare folder with several sets: which one is the user's to say
    # the other commands that act with a checkpoint (sft-report, collect-corrections) choose alike
    from vla_trainer.sft.start import checkpoint_policy

    assert checkpoint_policy(tmp_path / "ckpt").unnorm_key == "fractal"
    assert checkpoint_policy(tmp_path / "ckpt", unnorm_key="bridge_orig").unnorm_key == "bridge_orig"
    with pytest.raises(UnknownUnnormKeyError, match="pass unnorm_key"):
        checkpoint_policy(bare)


def test_a_training_checkpoint_records_the_statistics_its_policy_acted_with(tmp_path):
    """A run that leaves actor.model.unnorm_key to its model_path (an SFT output fine-tuned with one
    of several sets) acts with that set; its checkpoints say so, and serving, vla-eval and a resume
    act with it too (they found the run's null and refused the model), also once model_path moved."""
    import json
    import shutil

    import torch
    from tiny_vla import tiny

    from vla_trainer.build import build_policy
    from vla_trainer.checkpoint import recorded_unnorm_key, save_model, save_train_checkpoint
    from vla_trainer.config import load_config
    from vla_trainer.models import VLAPolicy

    stats = {k: {"action": {"q01": [-s] * 7, "q99": [s] * 7}} for k, s in (("bridge_orig", 1.0), ("fractal", 0.5))}
    model, tokenizer = tiny("tiny-openvla-oft", norm_stats=stats)
    sft = tmp_path / "sft"
    save_model(VLAPolicy(model, tokenizer, unnorm_key="fractal"), sft)
    (sft / "sft_metrics.json").write_text(json.dumps({"unnorm_key": "fractal"}))
    cfg = load_config("cpu_grpo_tiny_put_on_plate", [f"actor.model.model_path={sft}"])
    assert cfg.actor.model.unnorm_key is None
    policy = build_policy(cfg, device="cpu")
    assert policy.unnorm_key == "fractal"
    ckpt = save_train_checkpoint(tmp_path / "run", cfg, policy, torch.optim.Adam(policy.model.parameters()),
                                 {"iteration": 1, "env_steps": 0, "asset_pack": "none", "wall_time_s": 0.0})
    assert recorded_unnorm_key(ckpt / "model") == "fractal"
    assert PolicyService(ckpt).policy.unnorm_key == "fractal"
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "unnorm_key"}))
    assert recorded_unnorm_key(ckpt / "model") == "fractal"  # a checkpoint without it: through model_path
    (ckpt / "meta.json").write_text(json.dumps(meta))
    shutil.move(sft, tmp_path / "moved")
    assert recorded_unnorm_key(ckpt / "model") == "fractal"
    assert build_policy(cfg, resume_model_dir=ckpt / "model", device="cpu").unnorm_key == "fractal"


@pytest.mark.reliability(fault='clients that connect and send nothing, or stop mid-frame', cases=2,
                         outcome='closed after idle_timeout_s; the server keeps at most max_connections')
def test_silent_clients_are_closed_and_connections_are_bounded(service):
    srv = PolicyServer(service, port=0, idle_timeout_s=0.5, max_connections=2)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    address = ("127.0.0.1", srv.server_address[1])
    try:
        silent = socket.create_connection(address)
        half = socket.create_connection(address)
        half.sendall(struct.pack(">I", 1000) + b"x" * 10)  # announces 1000 bytes, sends 10, stops
        third = socket.create_connection(address)  # over max_connections: an error, then closed
        third.settimeout(5.0)
        header, _ = decode(read_frame(third))
        assert header["type"] == "error" and "serves 2 connections at a time" in header["message"]
        # a client is told why and knows the connection is gone
        over = PolicyClient(port=address[1])
        with pytest.raises(ConnectionError, match="serves 2 connections at a time.*new PolicyClient"):
            over.describe()
        with pytest.raises(ConnectionError, match="earlier failure.*serves 2 connections"):
            over.describe()
        for sock in (silent, half):  # the server closes both after 0.5 s of silence
            sock.settimeout(5.0)
            assert sock.recv(1) == b""
        image, state = _obs()
        with PolicyClient(port=address[1]) as client:  # their slots are free again
            assert client.act(image, "put corn on plate", state).shape == (8, 7)
    finally:
        srv.shutdown()
        srv.server_close()
        for sock in (silent, half, third):
            sock.close()
