"""Serving a policy to the robot: load any checkpoint ``vla-eval`` loads, answer action requests.

Two ways to use it, one policy object (``PolicyService``):

* in process: ``franka-eval`` (and the ROS 2 policy node) call ``service.act(obs)``;
* over the network, for a robot PC that calls a GPU box: ``vla-serve --checkpoint CKPT`` runs a
  ``PolicyServer``; the robot side uses ``PolicyClient``. The server binds 127.0.0.1 unless an
  address is given.

Wire format (no pickle: network input is never unpickled). Every message is one frame::

    frame   = length (4 bytes, big-endian, of what follows) + payload       length <= max_message_bytes
    payload = header_length (4 bytes, big-endian) + header (UTF-8 JSON) + array bytes

The header is ``{"type": ..., "arrays": [{"name", "dtype", "shape"}, ...], ...}``; the arrays'
raw C-order bytes follow in that order. Requests: ``{"type": "describe"}`` and
``{"type": "act", "instruction": str}`` with arrays ``image`` (uint8 ``[H, W, 3]``) and, for
models that read it, ``state`` (float32 ``[S]``). Replies: ``{"type": "spec", ...}``,
``{"type": "actions"}`` with array ``actions`` (float32 ``[C, 7]``), or
``{"type": "error", "message": str}``, with ``"closed": true`` when the server closes the
connection after it. A malformed or oversized request gets such an error reply (when the frame
could be read) and the connection is closed, as is one more than the server serves at once; the
server keeps serving. An observation the policy refuses gets an error reply; its connection stays open.
"""

from __future__ import annotations

import json
import math
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5555
MAX_MESSAGE_BYTES = 16 * 2**20
"""A 640x480 RGB frame is 0.9 MiB; nothing the robot sends comes near 16 MiB."""
IDLE_TIMEOUT_S = 60.0
"""A connection that sends nothing for this long (between or within frames) is closed."""
MAX_CONNECTIONS = 16
"""Connections served at once; more are answered with an error and closed."""
ALLOWED_DTYPES = ("uint8", "float32", "float64", "int64")
MAX_INSTRUCTION_CHARS = 1000


class ProtocolError(ValueError):
    """A message that does not follow the wire format (the text says what was wrong)."""


# ---------------------------------------------------------------------------------------- wire
def encode(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """One frame: ``header`` (JSON) and ``arrays`` (raw bytes, described in the header)."""
    arrays = arrays or {}
    specs, blobs = [], []
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype.name not in ALLOWED_DTYPES:
            raise ProtocolError(f"array {name!r} has dtype {arr.dtype}; allowed: {', '.join(ALLOWED_DTYPES)}")
        specs.append({"name": name, "dtype": arr.dtype.name, "shape": list(arr.shape)})
        blobs.append(arr.tobytes())
    head = json.dumps({**header, "arrays": specs}).encode()
    payload = struct.pack(">I", len(head)) + head + b"".join(blobs)
    return struct.pack(">I", len(payload)) + payload


def decode(payload: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(header, arrays)`` of one frame's payload.

    Raises:
        ProtocolError: truncated, not JSON, an unknown dtype, a shape that does not match the bytes.
    """
    if len(payload) < 4:
        raise ProtocolError("payload shorter than its 4-byte header length")
    (n,) = struct.unpack(">I", payload[:4])
    if n > len(payload) - 4:
        raise ProtocolError(f"header length {n} exceeds the payload ({len(payload) - 4} bytes)")
    try:
        header = json.loads(payload[4:4 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"header is not UTF-8 JSON: {e}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise ProtocolError("header must be a JSON object with a string 'type'")
    specs = header.get("arrays", [])
    if not isinstance(specs, list):
        raise ProtocolError("header 'arrays' must be a list")
    arrays, offset = {}, 4 + n
    for spec in specs:
        try:
            name, dtype, shape = str(spec["name"]), str(spec["dtype"]), tuple(int(d) for d in spec["shape"])
        except (KeyError, TypeError, ValueError):
            raise ProtocolError("each array needs 'name', 'dtype' and 'shape' (a list of ints)") from None
        if dtype not in ALLOWED_DTYPES:
            raise ProtocolError(f"array {name!r} has dtype {dtype!r}; allowed: {', '.join(ALLOWED_DTYPES)}")
        if any(d < 0 for d in shape) or len(shape) > 4:
            raise ProtocolError(f"array {name!r} has shape {list(shape)}; at most 4 non-negative dims")
        size = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: a huge shape cannot wrap around
        if offset + size > len(payload):
            raise ProtocolError(f"array {name!r} ({size} bytes) runs past the end of the message")
        arrays[name] = np.frombuffer(payload, dtype=dtype, count=size // np.dtype(dtype).itemsize,
                                     offset=offset).reshape(shape).copy()  # writable, owns its memory
        offset += size
    if offset != len(payload):
        raise ProtocolError(f"{len(payload) - offset} bytes after the last array")
    return header, arrays


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
    """The payload of the next frame. Raises ProtocolError for a frame over ``max_bytes``
    (before reading it), ConnectionError when the peer closes."""
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > max_bytes:
        raise ProtocolError(f"message of {n} bytes exceeds the limit of {max_bytes} bytes")
    return _recv_exact(sock, n)


# ---------------------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class PolicySpec:
    """What a checkpoint expects of the env it runs in (compared with the robot env before moving)."""

    image_size: int
    """Side of the square image the model reads, in pixels."""
    state_dim: int
    """Width of ``obs["state"]`` the model reads; 0: it reads no state."""
    chunk_size: int
    """Actions per policy call."""
    action_dim: int
    """7: delta xyz, delta axis-angle, gripper (-1 open, +1 close)."""
    camera_crop: tuple[int, int, int, int] | None
    """The camera crop the policy was trained with, when the checkpoint records it."""
    model_dir: str
    """The model folder that was loaded."""
    camera_hw: tuple[int, int] | None = None
    """(height, width) of the training camera's images, whose pixels ``camera_crop`` counts, when known."""
    task: str | None = None
    """The env id the checkpoint was trained on, when recorded."""

    def crop_mismatch(self, crop: tuple[int, int, int, int] | None, camera_hw: tuple[int, int]) -> str | None:
        """Why ``crop`` on frames of ``camera_hw`` is not the view this checkpoint was trained on
        (a crop counts pixels: on frames of another size it is another part of the view); None if it is."""
        if crop is None or self.camera_hw is None or tuple(self.camera_hw) == tuple(camera_hw):
            return None
        (h, w), (th, tw) = camera_hw, self.camera_hw
        return (f"camera crop {tuple(crop)} counts pixels of the training camera's {tw}x{th} images; the camera "
                f"file gives {w}x{h} images, where it is another part of the view: calibrate at {tw}x{th}, or "
                f"train with this camera file")


def training_env(model_dir: Path) -> tuple[str | None, dict[str, Any]]:
    """``(task id, env options)`` a checkpoint was trained with, as far as recorded: the training
    run's ``config.yaml`` beside a checkpoint's ``model/`` (``env.train.task`` and ``env_kwargs``),
    a published warm start's ``made_by.json`` (its demos' ``env_id`` and ``env_kwargs``), or
    ``vla-train sft``'s ``sft_metrics.json`` (its demos' ``env_id`` and ``env_kwargs``)."""
    from vla_trainer.checkpoint import checkpoint_recipe

    cfg = checkpoint_recipe(model_dir)
    if cfg is not None:
        return cfg.env.train.task, dict(cfg.env.train.env_kwargs)
    for record, section in (("made_by.json", "demos"), ("sft_metrics.json", None)):
        if (model_dir / record).is_file():
            data = json.loads((model_dir / record).read_text())
            return _record(data.get(section) if section else data, "env_id", "env_kwargs")
    return None, {}


def _record(section: Any, task_key: str, kwargs_key: str) -> tuple[str | None, dict[str, Any]]:
    section = section if isinstance(section, dict) else {}
    task, kwargs = section.get(task_key), section.get(kwargs_key)
    return (task if isinstance(task, str) else None), (kwargs if isinstance(kwargs, dict) else {})


def _camera_hw(camera_file: str | None) -> tuple[int, int] | None:
    """(height, width) of a training run's camera file (None: the default camera); None when the
    file is not on this machine."""
    from vla_envs.camera_file import load_camera_file

    try:
        camera = load_camera_file(camera_file)
    except (OSError, ValueError):
        return None
    return camera.height, camera.width


class PolicyService:
    """A checkpoint ready to act on one robot observation at a time (thread-safe).

    Args:
        checkpoint: a model folder, training checkpoint or run folder (as ``vla-eval --checkpoint``;
            LoRA runs are merged into their base model).
        greedy: take the most likely action tokens (evaluation); False samples at ``temperature``.
        temperature: sampling temperature when not greedy.
        device: torch device for the model (``"cpu"``, ``"cuda"``).
        unnorm_key: which of the model's action statistics its actions mean, for a model that holds
            several; None: the one its training run used (a training checkpoint's config.yaml), or
            the only one.
    """

    def __init__(self, checkpoint: str | Path, *, greedy: bool = True, temperature: float = 1.0,
                 device: str = "cpu", unnorm_key: str | None = None):
        from vla_trainer.build import load_model
        from vla_trainer.checkpoint import recorded_unnorm_key
        from vla_trainer.models import VLAPolicy

        model, tokenizer, model_dir = load_model(checkpoint)
        unnorm_key = unnorm_key if unnorm_key is not None else recorded_unnorm_key(model_dir)
        self.policy = VLAPolicy(model.to(device), tokenizer, unnorm_key=unnorm_key)
        self.greedy, self.temperature = greedy, temperature
        task, kwargs = training_env(model_dir)
        crop = kwargs.get("camera_crop")
        cfg = self.policy.config
        self.spec = PolicySpec(image_size=int(cfg.image_size), state_dim=int(cfg.proprio_dim or 0),
                               chunk_size=int(cfg.chunk_size), action_dim=int(cfg.action_dim),
                               camera_crop=None if crop is None else tuple(int(v) for v in crop),
                               model_dir=str(model_dir),
                               camera_hw=None if crop is None else _camera_hw(kwargs.get("camera_file")),
                               task=task)
        self._lock = threading.Lock()

    def act(self, image: np.ndarray, instruction: str, state: np.ndarray | None = None) -> np.ndarray:
        """One action chunk float32 ``[C, 7]`` for one observation.

        Raises:
            vla_trainer.models.InvalidInputError: wrong image size or dtype, an empty instruction,
                a missing or wrong-width state (the message says what is allowed).
        """
        if not isinstance(instruction, str) or len(instruction) > MAX_INSTRUCTION_CHARS:
            raise ValueError(f"instruction must be a string of at most {MAX_INSTRUCTION_CHARS} characters")
        obs: dict[str, Any] = {"image": np.asarray(image)[None], "instruction": (instruction,)}
        if state is not None:
            obs["state"] = np.asarray(state, np.float32)[None]
        with self._lock:
            sample = self.policy.act(obs, greedy=self.greedy, temperature=self.temperature)
        return sample.actions[0].float().cpu().numpy()


# ---------------------------------------------------------------------------------------- server
class PolicyServer(socketserver.ThreadingTCPServer):
    """TCP server answering ``describe`` and ``act`` requests with a ``PolicyService``.

    Args:
        service: the policy; may be set after binding, before ``serve_forever`` (``vla-serve``
            listens before it loads the checkpoint).
        host: address to bind; 127.0.0.1 (this machine only) unless told otherwise.
        port: TCP port; 0 picks a free one (``server.server_address[1]``).
        max_message_bytes: larger requests are refused before they are read.
        idle_timeout_s: a connection silent this long is closed (its thread and buffer freed): a
            client that connects and sends nothing, or stops half-way through a frame, holds nothing.
        max_connections: connections served at once; one more is answered with an error and closed.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, service: PolicyService | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS):
        self.service, self.max_message_bytes = service, max_message_bytes
        self.idle_timeout_s, self.max_connections = idle_timeout_s, max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__((host, port), _Handler)


    def process_request(self, request: socket.socket, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(encode({"type": "error", "closed": True, "message": f"the server serves "
                                        f"{self.max_connections} connections at a time; close one or try again later"}))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: PolicyServer = self.server  # type: ignore[assignment]
        self.request.settimeout(server.idle_timeout_s)
        while True:
            try:
                header, arrays = decode(read_frame(self.request, server.max_message_bytes))
                reply = _answer(server.service, header, arrays)
            except (ConnectionError, TimeoutError):  # gone, or silent for idle_timeout_s: free its thread
                return
            except ProtocolError as e:  # the stream can no longer be trusted: answer, then close
                _send_quietly(self.request, encode({"type": "error", "closed": True, "message": str(e)}))
                return
            except Exception as e:  # noqa: BLE001  a bad observation must not stop the server
                reply = encode({"type": "error", "message": f"{type(e).__name__}: {e}"})
            if not _send_quietly(self.request, reply):
                return


def _send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Send ``data``; False when the client is gone (it gave up waiting), which ends its thread quietly."""
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _answer(service: PolicyService, header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    if header["type"] == "describe":
        return encode({"type": "spec", **{k: v for k, v in vars(service.spec).items()}})
    if header["type"] == "act":
        if "image" not in arrays or not isinstance(header.get("instruction"), str):
            raise ProtocolError("an 'act' request needs an 'image' array and an 'instruction' string")
        actions = service.act(arrays["image"], header["instruction"], arrays.get("state"))
        return encode({"type": "actions"}, {"actions": actions.astype(np.float32)})
    raise ProtocolError(f"unknown request type {header['type']!r}; allowed: 'describe', 'act'")


class PolicyClient:
    """The robot side of ``PolicyServer``: ``describe()`` and ``act(...)`` over one connection.

    A call that fails mid-way (a timeout, a broken or malformed reply) closes the connection:
    the server's late reply would otherwise be read as the answer to the next observation. So
    does an error after which the server closed it (a malformed request, or one connection more
    than it serves at once: ``ConnectionError``). Later calls raise ``ConnectionError``; make a
    new client to go on. An observation the policy refuses raises ``RuntimeError`` with its
    message, and the connection stays usable.

    Args:
        host, port: the server.
        timeout_s: for connecting and for each reply; a silent server fails within it.
        max_message_bytes: the server's limit; a larger request is refused here, before sending.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout_s: float = 5.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.address, self.max_message_bytes = f"{host}:{port}", max_message_bytes
        self._broken: str | None = None
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise ConnectionError(f"no policy server at {host}:{port} ({e}); start one with "
                                  f"`vla-serve --checkpoint CKPT --host {host} --port {port}`") from None

    def _call(self, header: dict, arrays: dict[str, np.ndarray] | None = None) -> tuple[dict, dict]:
        if self._broken is not None:
            raise ConnectionError(f"the connection to {self.address} was closed after an earlier failure "
                                  f"({self._broken}); make a new PolicyClient")
        frame = encode(header, arrays)
        if len(frame) - 4 > self.max_message_bytes:
            raise ValueError(f"request of {len(frame) - 4} bytes exceeds the server's limit of "
                             f"{self.max_message_bytes} bytes; send a smaller image")
        try:
            self.sock.sendall(frame)
            reply, out = decode(read_frame(self.sock, self.max_message_bytes))
        except (OSError, ProtocolError) as e:  # OSError covers timeouts and ConnectionError
            self._broken = f"{type(e).__name__}: {e}"
            self.sock.close()
            raise
        if reply["type"] == "error":
            if reply.get("closed"):  # said before the server closed it: the next call would find it gone
                self._broken = f"policy server: {reply.get('message')}"
                self.sock.close()
                raise ConnectionError(f"{self._broken}; it closed the connection to {self.address}, "
                                      "make a new PolicyClient")
            raise RuntimeError(f"policy server: {reply.get('message')}")
        return reply, out

    def describe(self) -> PolicySpec:
        reply, _ = self._call({"type": "describe"})
        crop, hw = reply.get("camera_crop"), reply.get("camera_hw")
        return PolicySpec(image_size=reply["image_size"], state_dim=reply["state_dim"], chunk_size=reply["chunk_size"],
                          action_dim=reply["action_dim"], camera_crop=None if crop is None else tuple(crop),
                          model_dir=reply["model_dir"], camera_hw=None if hw is None else tuple(hw),
                          task=reply.get("task"))

    def act(self, image: np.ndarray, instruction: str, state: np.ndarray | None = None) -> np.ndarray:
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"image must be uint8 [H, W, 3] (a camera frame), got {image.dtype} "
                             f"{list(image.shape)}; a float image would be cast to zeros")
        arrays = {"image": image}
        if state is not None:
            arrays["state"] = np.asarray(state, np.float32)
        _, out = self._call({"type": "act", "instruction": instruction}, arrays)
        return out["actions"].copy()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "PolicyClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def torch_device(text: str) -> str:
    """An argparse type: a torch device this machine has (cpu, cuda, cuda:N)."""
    import argparse

    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: no CUDA GPU here (torch {torch.__version__}, CUDA "
                                             f"{torch.version.cuda or 'not compiled in'}); use cpu")
        if device.index is not None and device.index >= count:
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {count} CUDA GPU(s): "
                                             f"cuda:0 to cuda:{count - 1}")
    return text


def main(argv: list[str] | None = None) -> int:
    """``vla-serve``: serve a checkpoint to a robot PC (see the module docstring for the format)."""
    import argparse
    import sys

    from vla_envs.arguments import positive_float, tcp_port

    p = argparse.ArgumentParser(prog="vla-serve", description="Serve a policy checkpoint over TCP (no pickle).")
    p.add_argument("--checkpoint", type=Path, required=True, help="model folder, training checkpoint or run folder")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=tcp_port, default=DEFAULT_PORT, help="0: any free port (default: %(default)s)")
    p.add_argument("--device", type=torch_device, default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--temperature", type=positive_float, default=None, help="sample at this temperature (default: greedy)")
    args = p.parse_args(argv)
    try:  # listen first: a busy port is named at once, not after minutes of loading a 7B model
        server = PolicyServer(None, args.host, args.port)
    except OSError as e:  # in use, not an address of this machine, or an unknown name
        print(f"error: --host/--port: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    with server:
        try:
            server.service = PolicyService(args.checkpoint, greedy=args.temperature is None,
                                           temperature=args.temperature or 1.0, device=args.device)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C while a large checkpoint loads
            print("interrupted while loading the checkpoint; nothing was served", file=sys.stderr)
            return 130
        host, port = server.server_address[:2]
        print(f"serving {server.service.spec.model_dir} on {host}:{port} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0
