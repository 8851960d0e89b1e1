"""Reading rosbag2 bags without ROS (rosbags): storage detection, summaries, clear errors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Reader

MCAP_MAGIC = b"\x89MCAP0\r\n"
SQLITE_MAGIC = b"SQLite format 3\x00"
STORAGE_SUFFIX = {"mcap": ".mcap", "sqlite3": ".db3"}


class BagError(Exception):
    """A bag cannot be used: missing, corrupt, empty or lacking a topic. Names the bag."""


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """One topic of a bag: name, message type and number of messages."""

    name: str
    msgtype: str
    count: int
    #: messages per second of log time (None: fewer than two messages)
    rate_hz: float | None = None
    #: Image topics: the first message's encoding and width x height
    encoding: str | None = None
    resolution: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class BagInfo:
    """What ``fedepth bag info`` prints: storage, topics, counts and time span."""

    path: Path
    storage: str
    topics: tuple[TopicSummary, ...]
    message_count: int
    start_ns: int  # log time of the first message
    end_ns: int  # log time of the last message
    #: the bag's custom metadata (fedepth.sequence, fedepth.split, ...)
    metadata: dict[str, str] | None = None

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "storage": self.storage,
            "message_count": self.message_count,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_s": self.duration_ns / 1e9,
            "topics": [
                {
                    "name": t.name,
                    "type": t.msgtype,
                    "count": t.count,
                    "rate_hz": t.rate_hz,
                    "encoding": t.encoding,
                    "resolution": None if t.resolution is None else list(t.resolution),
                }
                for t in self.topics
            ],
            "metadata": dict(self.metadata or {}),
        }


def _magic_storage(file: Path) -> str | None:
    with file.open("rb") as f:
        head = f.read(16)
    if head.startswith(MCAP_MAGIC):
        return "mcap"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite3"
    return None


def detect_storage(path: str | Path) -> str:
    """``"mcap"`` or ``"sqlite3"`` for a rosbag2 directory or a single .mcap / .db3 file."""
    path = Path(path)
    if not path.exists():
        raise BagError(f"bag {path}: no such file or directory")
    if path.is_dir():
        meta = path / "metadata.yaml"
        if not meta.is_file():
            raise BagError(f"bag {path}: not a rosbag2 directory (no metadata.yaml)")
        try:
            doc = yaml.safe_load(meta.read_text(encoding="utf-8"))
            storage = doc["rosbag2_bagfile_information"]["storage_identifier"]
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as exc:
            raise BagError(f"bag {path}: corrupt metadata.yaml ({exc!r})") from None
        if storage not in STORAGE_SUFFIX:
            raise BagError(f"bag {path}: unsupported storage {storage!r} (mcap or sqlite3)")
        return str(storage)
    try:
        storage = _magic_storage(path)
    except OSError as exc:
        raise BagError(f"bag {path}: cannot read ({exc})") from None
    if storage is None:
        raise BagError(f"bag {path}: neither an mcap nor a sqlite3 file (corrupt or not a bag)")
    if path.suffix != STORAGE_SUFFIX[storage]:
        raise BagError(f"bag {path}: {storage} content needs the suffix {STORAGE_SUFFIX[storage]}")
    return storage


@contextmanager
def open_bag(path: str | Path) -> Iterator[Reader]:
    """Open a rosbag2 directory or single storage file; any failure becomes a BagError."""
    path = Path(path)
    storage = detect_storage(path)
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # rosbags and its storage backends raise many types
        raise BagError(f"bag {path}: cannot open {storage} bag ({exc})") from None
    try:
        yield reader
    finally:
        reader.close()


def bag_info(path: str | Path) -> BagInfo:
    """Summarise a bag: storage, topics with types and counts, time span."""
    path = Path(path)
    storage = detect_storage(path)
    with open_bag(path) as reader:
        try:
            count = reader.message_count
            start, end = (reader.start_time, reader.end_time - 1) if count else (0, 0)
            custom = _custom_data(reader)
            stamps: dict[str, list[int]] = {}
            first: dict[str, bytes] = {}
            conns = list(reader.connections)
            if count:
                for conn, stamp, data in iter_messages(reader, path, conns):
                    stamps.setdefault(conn.topic, []).append(stamp)
                    if conn.msgtype == "sensor_msgs/msg/Image":
                        first.setdefault(conn.topic, data)
            topics = tuple(
                _summary(name, info.msgtype, info.msgcount, stamps.get(name, []), first.get(name))
                for name, info in sorted(reader.topics.items())
            )
        except BagError:
            raise
        except Exception as exc:  # a backend failing while reading its index
            raise BagError(f"bag {path}: cannot read its index ({exc})") from None
    return BagInfo(
        path, storage, topics, count, start, end, {k: str(v) for k, v in custom.items()}
    )


def custom_data(reader: Any) -> dict[str, Any]:
    """The ``custom_data`` of an open bag's metadata.yaml (fedepth.sequence, ...)."""
    return _custom_data(reader)


def _custom_data(reader: Any) -> dict[str, Any]:
    """The ``custom_data`` of a bag's metadata.yaml. rosbags keeps it on the storage reader's
    metadata (``reader.storage.metadata.custom``; a single .mcap / .db3 file has none), not
    on :class:`Reader` itself."""
    meta = getattr(getattr(reader, "storage", None), "metadata", None)
    custom = getattr(meta, "custom", None)
    return dict(custom) if isinstance(custom, Mapping) else {}


def _summary(
    name: str, msgtype: str | None, count: int, stamps: list[int], image: bytes | None
) -> TopicSummary:
    rate = None
    if len(stamps) >= 2 and max(stamps) > min(stamps):
        rate = (len(stamps) - 1) / ((max(stamps) - min(stamps)) / 1e9)
    encoding = resolution = None
    if image is not None:
        from rosbags.typesys import Stores, get_typestore

        msg: Any = get_typestore(Stores.ROS2_KILTED).deserialize_cdr(
            image, "sensor_msgs/msg/Image"
        )
        encoding, resolution = str(msg.encoding), (int(msg.width), int(msg.height))
    return TopicSummary(name, msgtype or "(mixed types)", count, rate, encoding, resolution)


def _norm(topic: str) -> str:
    return "/" + topic.lstrip("/")


def select_connections(
    reader: Reader, path: str | Path, topics: Sequence[str] = ()
) -> list[Connection]:
    """Connections of the requested topics (all if none), checked to exist and hold messages."""
    connections = list(reader.connections)
    if not connections or reader.message_count == 0:
        raise BagError(f"bag {path}: contains no messages")
    if topics:
        wanted = {_norm(t) for t in topics}
        have = {_norm(c.topic) for c in connections}
        if missing := sorted(wanted - have):
            raise BagError(
                f"bag {path}: no topic {', '.join(missing)} "
                f"(its topics: {', '.join(sorted(have))})"
            )
        connections = [c for c in connections if _norm(c.topic) in wanted]
        if sum(c.msgcount for c in connections) == 0:
            raise BagError(f"bag {path}: topics {', '.join(sorted(wanted))} hold no messages")
    return connections


def iter_messages(
    reader: Reader,
    path: str | Path,
    connections: Sequence[Connection],
    start_ns: int | None = None,
) -> Iterator[tuple[Connection, int, bytes]]:
    """``(connection, log time ns, raw CDR bytes)``; a read failure becomes a BagError."""
    stream = reader.messages(connections, start=start_ns)
    while True:
        try:
            item = next(stream)
        except StopIteration:
            return
        except Exception as exc:  # corrupt chunk / page, truncated file
            raise BagError(f"bag {path}: corrupt data while reading messages ({exc})") from None
        conn, stamp, data = item
        yield conn, stamp, bytes(data)
