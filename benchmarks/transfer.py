"""Benchmark of the coordinator's data path: model transfer and aggregation throughput.

1. Transfer: a robot downloads its model from a coordinator child process and uploads its
   update (gRPC on loopback, streamed chunks, the upload spilled to a blob and fsynced), against
   a plain TCP socket copy of the same number of bytes to/from a child process, measured in the
   same run and interleaved so both see the same machine load. Both receivers write into a
   freshly allocated buffer, as a robot receiving a model does. Target: gRPC >= 1/2 of TCP.
   For reference, bare grpcio (bytes messages of the same size, no protobuf, no coordinator)
   shows how much of the gap is gRPC's own. With the SQLite store, the disk's share follows: the
   same bytes through the coordinator's blob writer (write, then commit: fsync, rename,
   directory fsync) and written plainly with one fsync, as fractions of the median upload.
   ``--max-update-norm`` turns the norm bound on (the robots send back what they downloaded).
   Figures, with the machine and its load: docs/coordinator.md.
2. Aggregation: FedAvg over N spilled updates exactly as the coordinator runs it (tensors read
   back from the blob files one at a time), against a plain numpy sum of the same arrays held
   in memory.

    PYTHONPATH=. python benchmarks/transfer.py [--size-mb 64] [--repeats 5] [--updates 16]
        [--max-update-norm X] [--json OUT]

(``PYTHONPATH=.``: measure this checkout even where another copy of the packages is installed.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientInfo, ClientUpdate, create_strategy
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.blobs import BlobReader, write_blob
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.config import config_from_dict
from fedepth_coordinator.server import synthetic_model
from fedepth_coordinator.simulate import CoordinatorProcess
from fedepth_coordinator.state import SqliteStore


# -- plain TCP ----------------------------------------------------------------------------------
def _tcp_server(port_queue: Any, nbytes: int) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port_queue.put(srv.getsockname()[1])
    payload = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    while True:
        conn, _ = srv.accept()
        with conn:
            mode = conn.recv(1)
            if mode == b"q":
                return
            if mode == b"d":
                conn.sendall(payload)
            else:
                buf = np.empty(nbytes, dtype=np.uint8)
                view, got = memoryview(buf), 0
                while got < nbytes:
                    got += conn.recv_into(view[got:])
                conn.sendall(b"k")


class TcpBaseline:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        self.proc = ctx.Process(target=_tcp_server, args=(q, nbytes), daemon=True)
        self.proc.start()
        self.port = int(q.get(timeout=60))
        self.payload = bytes(nbytes)

    def download(self) -> float:
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", self.port)) as c:
            c.sendall(b"d")
            buf = np.empty(self.nbytes, dtype=np.uint8)
            view, got = memoryview(buf), 0
            while got < self.nbytes:
                got += c.recv_into(view[got:])
        return time.perf_counter() - t0

    def upload(self) -> float:
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", self.port)) as c:
            c.sendall(b"u")
            c.sendall(self.payload)
            c.recv(1)
        return time.perf_counter() - t0

    def close(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as c:
            c.sendall(b"q")
        self.proc.join(10)


# -- bare gRPC: the ceiling of grpcio itself ----------------------------------------------------
def _raw_grpc_server(port_queue: Any, nbytes: int, chunk: int) -> None:
    from concurrent import futures

    import grpc

    payload = bytes(chunk)
    last = bytes(nbytes % chunk)

    def down(_request: bytes, _context: Any) -> Any:
        for _ in range(nbytes // chunk):
            yield payload
        if last:
            yield last

    def up(requests: Any, _context: Any) -> bytes:
        for _ in requests:
            pass
        return b"k"

    handler = grpc.method_handlers_generic_handler(
        "bench.Raw",
        {
            "Down": grpc.unary_stream_rpc_method_handler(down),
            "Up": grpc.stream_unary_rpc_method_handler(up),
        },
    )
    limit = [("grpc.max_receive_message_length", chunk + (1 << 20))]
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler], options=limit)
    port_queue.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


class RawGrpc:
    """Bytes messages through grpcio with no protobuf and no coordinator logic."""

    def __init__(self, nbytes: int, chunk: int) -> None:
        import grpc

        self.nbytes, self.chunk = nbytes, chunk
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        self.proc = ctx.Process(target=_raw_grpc_server, args=(q, nbytes, chunk), daemon=True)
        self.proc.start()
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{q.get(timeout=60)}",
            options=[("grpc.max_receive_message_length", chunk + (1 << 20))],
        )
        self._down = self.channel.unary_stream("/bench.Raw/Down")
        self._up = self.channel.stream_unary("/bench.Raw/Up")
        self.payload = bytes(chunk)

    def download(self) -> float:
        t0 = time.perf_counter()
        buf = np.empty(self.nbytes, dtype=np.uint8)
        view, got = memoryview(buf), 0
        for message in self._down(b""):
            view[got : got + len(message)] = message
            got += len(message)
        return time.perf_counter() - t0

    def upload(self) -> float:
        n, rest = divmod(self.nbytes, self.chunk)
        t0 = time.perf_counter()
        self._up(iter([self.payload] * n + ([bytes(rest)] if rest else [])))
        return time.perf_counter() - t0

    def close(self) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.join(10)


# -- the disk: what the coordinator's upload pays that the TCP copy does not -------------------
def disk_cost(nbytes: int, chunk: int, workdir: Path, repeats: int = 3) -> dict[str, float]:
    """Median seconds to spill ``nbytes`` as the coordinator does (its SQLite store's blob
    writer: preallocated, early writeback, commit = fsync + rename + directory fsync), and to
    write the same bytes plainly and fsync them once at the end."""
    payload = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8).tobytes()
    view = memoryview(payload)
    store = SqliteStore(workdir / "disk")
    runs: dict[str, list[float]] = {k: [] for k in ("write", "commit", "plain_write", "fsync")}
    for i in range(repeats):
        t0 = time.perf_counter()
        writer = store.blob_writer(f"spill-{i}", size=nbytes)
        for pos in range(0, nbytes, chunk):
            writer.write(view[pos : pos + chunk])
        t1 = time.perf_counter()
        writer.commit()
        t2 = time.perf_counter()
        store.delete_blob(f"spill-{i}")
        path = workdir / "disk" / f"plain-{i}.bin"
        t3 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            for pos in range(0, nbytes, chunk):
                f.write(view[pos : pos + chunk])
            t4 = time.perf_counter()
            os.fsync(f.fileno())
        t5 = time.perf_counter()
        path.unlink()
        for k, v in zip(runs, (t1 - t0, t2 - t1, t4 - t3, t5 - t4), strict=True):
            runs[k].append(v)
    store.close()
    return {k: statistics.median(v) for k, v in runs.items()}


# -- the coordinator ----------------------------------------------------------------------------
class GrpcPath:
    """Robot a is timed; robot b uploads afterwards so that each round closes."""

    def __init__(
        self,
        workdir: Path,
        size_mb: float,
        chunk: int,
        backend: str,
        bdp: bool,
        max_update_norm: float | None = None,
    ) -> None:
        creds = workdir / "credentials.yaml"
        self.tokens = {r: add_principal(creds, r) for r in ("a", "b")}
        config = config_from_dict(
            {
                "server": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "chunk_bytes": chunk,
                    "max_message_bytes": chunk + (1 << 20),
                    "bdp_probe": bdp,
                },
                "auth": {"credentials_file": str(creds)},
                "rounds": {"num_rounds": 1000, "min_robots": 2, "quorum": 1.0},
                "strategy": {"name": "fedavg", "params": {}},
                "model": {"name": None, "synthetic": {"num_tensors": 8, "size_mb": size_mb}},
                "state": {"dir": str(workdir / f"state-{backend}"), "backend": backend},
                "validation": {"max_update_norm": max_update_norm},
                "log_level": "WARNING",
            }
        )
        self.child = CoordinatorProcess(config, log_path=workdir / f"coordinator-{backend}.log")
        port = self.child.start()
        self.clients = {
            r: CoordinatorClient(
                open_channel(f"127.0.0.1:{port}", max_message_bytes=chunk + (1 << 20)),
                r,
                t,
                chunk_bytes=chunk,
            )
            for r, t in self.tokens.items()
        }
        for c in self.clients.values():
            c.register(100)
            c.upload_descriptor(Descriptor(np.zeros(4), np.ones(4), 8))
        self.round = 0

    def one_round(self) -> tuple[float, float, int]:
        a, b = self.clients["a"], self.clients["b"]
        t0 = time.perf_counter()
        model = a.download_model(self.round)
        t1 = time.perf_counter()
        a.upload_update(self.round, ClientUpdate("a", model.task.state, 100))
        t2 = time.perf_counter()
        other = b.download_model(self.round)
        b.upload_update(self.round, ClientUpdate("b", other.task.state, 100))
        self.round += 1
        return t1 - t0, t2 - t1, sum(v.nbytes for v in model.task.state.values())

    def close(self) -> None:
        for c in self.clients.values():
            c.close()
        self.child.stop()


def transfer(
    size_mb: float,
    repeats: int,
    chunk: int,
    backend: str,
    bdp: bool,
    workdir: Path,
    max_update_norm: float | None = None,
) -> dict[str, Any]:
    grpc_path = GrpcPath(workdir, size_mb, chunk, backend, bdp, max_update_norm)
    _, _, nbytes = grpc_path.one_round()  # warm-up, and the exact byte count
    tcp = TcpBaseline(nbytes)
    raw = RawGrpc(nbytes, chunk)
    tcp.download(), tcp.upload(), raw.download(), raw.upload()
    keys = ("tcp_down", "tcp_up", "raw_down", "raw_up", "grpc_down", "grpc_up")
    times: dict[str, list[float]] = {k: [] for k in keys}
    try:
        for _ in range(repeats):
            times["tcp_down"].append(tcp.download())
            times["raw_down"].append(raw.download())
            down, up, _ = grpc_path.one_round()
            times["grpc_down"].append(down)
            times["grpc_up"].append(up)
            times["raw_up"].append(raw.upload())
            times["tcp_up"].append(tcp.upload())
    finally:
        grpc_path.close()
        tcp.close()
        raw.close()
    disk = disk_cost(nbytes, chunk, workdir) if backend == "sqlite" else None
    mbps = {k: [nbytes / t / 1e6 for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in mbps.items()}
    upload_s = statistics.median(times["grpc_up"])
    return {
        "backend": backend,
        "chunk_bytes": chunk,
        "bdp_probe": bdp,
        "max_update_norm": max_update_norm,
        "model_bytes": nbytes,
        "repeats": repeats,
        "median_upload_s": upload_s,
        "disk_s": disk,
        "commit_share_of_upload": None if disk is None else disk["commit"] / upload_s,
        "plain_fsync_share_of_upload": None if disk is None else disk["fsync"] / upload_s,
        "median_MBps": med,
        "best_MBps": {k: max(v) for k, v in mbps.items()},
        "download_ratio": med["grpc_down"] / med["tcp_down"],
        "upload_ratio": med["grpc_up"] / med["tcp_up"],
        "download_vs_bare_grpc": med["grpc_down"] / med["raw_down"],
        "upload_vs_bare_grpc": med["grpc_up"] / med["raw_up"],
    }


# -- aggregation --------------------------------------------------------------------------------
def aggregation(size_mb: float, updates: int, workdir: Path) -> dict[str, Any]:
    initial = synthetic_model(8, size_mb)
    ids = [f"r{i:02d}" for i in range(updates)]
    desc = Descriptor(np.zeros(4), np.ones(4), 8)
    store = SqliteStore(workdir / "agg")
    states = []
    for i, rid in enumerate(ids):
        state = {k: v + np.float32(i) for k, v in initial.items()}
        write_blob(store, f"upd-{rid}", {"state": state})
        states.append(state)
    nbytes = updates * sum(v.nbytes for v in initial.values())

    def coordinator_path() -> float:
        strategy = create_strategy("fedavg")
        strategy.initialize([ClientInfo(r, 100, desc) for r in ids], initial)
        lazy = [
            ClientUpdate(r, BlobReader(store, f"upd-{r}").lazy("state", list(initial)), 100)
            for r in ids
        ]
        t0 = time.perf_counter()
        strategy.aggregate_train(0, lazy)
        return time.perf_counter() - t0

    def in_memory_mean() -> float:
        strategy = create_strategy("fedavg")
        strategy.initialize([ClientInfo(r, 100, desc) for r in ids], initial)
        ups = [ClientUpdate(r, s, 100) for r, s in zip(ids, states, strict=True)]
        t0 = time.perf_counter()
        strategy.aggregate_train(0, ups)
        return time.perf_counter() - t0

    def numpy_sum() -> float:
        t0 = time.perf_counter()
        for name in initial:
            acc = np.zeros_like(initial[name])
            for s in states:
                acc += s[name]
        return time.perf_counter() - t0

    runs = {"coordinator": [], "in_memory_weighted_mean": [], "numpy_sum": []}
    for _ in range(3):
        runs["coordinator"].append(coordinator_path())
        runs["in_memory_weighted_mean"].append(in_memory_mean())
        runs["numpy_sum"].append(numpy_sum())
    store.close()
    gbps = {k: nbytes / min(v) / 1e9 for k, v in runs.items()}
    return {
        "updates": updates,
        "update_bytes": nbytes,
        "best_GBps": gbps,
        "coordinator_vs_numpy": gbps["coordinator"] / gbps["numpy_sum"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=64.0, help="model size (default 64)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunk-kb", type=int, default=1024, help="stream chunk size (default 1024)")
    p.add_argument("--backend", choices=["sqlite", "memory"], default="sqlite")
    p.add_argument("--bdp", action="store_true", help="server.bdp_probe on (default off)")
    p.add_argument(
        "--max-update-norm",
        type=float,
        help="validation.max_update_norm (default none); the robots send back what they got",
    )
    p.add_argument("--skip-aggregation", action="store_true")
    p.add_argument("--updates", type=int, default=16, help="updates to aggregate (default 16)")
    p.add_argument("--agg-size-mb", type=float, default=10.0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fedepth-transfer-") as tmp:
        work = Path(tmp)
        t = transfer(
            args.size_mb,
            args.repeats,
            args.chunk_kb << 10,
            args.backend,
            args.bdp,
            work,
            args.max_update_norm,
        )
        a = None if args.skip_aggregation else aggregation(args.agg_size_mb, args.updates, work)
    m = t["median_MBps"]
    lines = [
        f"transfer of a {t['model_bytes'] / 1e6:.1f} MB model, {t['repeats']} repeats, chunks of "
        f"{t['chunk_bytes'] >> 10} KiB, state backend {t['backend']} (median MB/s):",
        f"  download  coordinator {m['grpc_down']:6.0f}   TCP {m['tcp_down']:6.0f}   ratio "
        f"{t['download_ratio']:.2f}   (bare grpcio {m['raw_down']:6.0f})",
        f"  upload    coordinator {m['grpc_up']:6.0f}   TCP {m['tcp_up']:6.0f}   ratio "
        f"{t['upload_ratio']:.2f}   (bare grpcio {m['raw_up']:6.0f})",
        "  (coordinator uploads are checked"
        + ("" if t["max_update_norm"] is None else " with a norm bound")
        + f" and spilled to the {t['backend']} store)",
    ]
    d = t["disk_s"]
    if d is not None:
        ms = {k: v * 1e3 for k, v in d.items()}
        up_ms = t["median_upload_s"] * 1e3
        lines += [
            f"  disk, the same bytes written in a loop (median ms; upload {up_ms:.0f}): the "
            f"coordinator's blob writer {ms['write']:.0f} + commit {ms['commit']:.0f} (fsync, "
            f"rename, directory fsync: {t['commit_share_of_upload']:.0%} of the upload; less "
            "in an upload, whose stream overlaps the early writeback); plain writes "
            f"{ms['plain_write']:.0f} + one fsync {ms['fsync']:.0f} "
            f"({t['plain_fsync_share_of_upload']:.0%}). The TCP copy never touches the disk.",
        ]
    if a is not None:
        lines += [
            f"aggregation of {a['updates']} updates, {a['update_bytes'] / 1e6:.0f} MB "
            "(best GB/s):",
            f"  coordinator (FedAvg over spilled blobs) {a['best_GBps']['coordinator']:.2f}   "
            f"in-memory weighted mean {a['best_GBps']['in_memory_weighted_mean']:.2f}   "
            f"numpy sum {a['best_GBps']['numpy_sum']:.2f}   ratio {a['coordinator_vs_numpy']:.2f}",
        ]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"transfer": t, "aggregation": a}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
