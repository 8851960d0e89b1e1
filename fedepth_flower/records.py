"""fedepth's types in Flower's records: what the Flower bridge puts into a Message and reads back.

One message per node and purpose, each a :class:`~flwr.app.RecordDict` with these records:

- descriptor round (``query``), server -> node: ``model`` (the initial state, whose frozen
  encoder describes the node's data), ``config`` (the run's :class:`~fedepth.sim.SimConfig` as
  JSON, the server's scenario directory, the summaries the strategy asks for);
  node -> server: ``client`` (id, sample count, partition, labels), ``descriptor`` (mean and
  variance, float64) and ``summaries`` (PACFL's basis when asked);
- training (``train``), server -> node: ``model`` (the node's own model: the mean of its
  clusters' models), ``hook-state.<name>`` (SCAFFOLD's control variate, ...), ``config`` (the
  round, the client id, the client hook and its parameters, and the round's
  :class:`~fedepth.recipe.TrainRecipe` as ``recipe.<field>`` keys);
  node -> server: ``model`` (the trained state), ``extra.<name>`` (the hook's extra state) and
  ``metrics`` (``num-examples``, the weight of Flower's strategies, steps, loss, seconds);
- evaluation (``evaluate``), server -> node: ``model`` and ``config``; node -> server:
  ``metrics`` (the depth metrics on the node's own data and ``num-examples``).

Arrays travel as numpy arrays with their dtype and shape (:class:`~flwr.app.Array`), so a state
comes back bit for bit. The functions here are plain conversions; the strategy and the apps
decide what to send.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedepth.descriptor import Descriptor
from fedepth.recipe import TrainRecipe
from fedepth.sim import SimConfig, config_dict
from fedepth.strategies import ClientInfo, ClientUpdate, State, TrainTask

#: Record names (the keys of a message's RecordDict).
MODEL = "model"
CONFIG = "config"
METRICS = "metrics"
CLIENT = "client"
DESCRIPTOR = "descriptor"
SUMMARIES = "summaries"
HOOK_STATE = "hook-state."
EXTRA = "extra."
#: Flower's weight key (its strategies weigh replies by it): the client's sample count.
NUM_EXAMPLES = "num-examples"
_RECIPE = "recipe."
_HOOK_PARAM = "hook-param."


class RecordError(ValueError):
    """A message lacks a record or holds one of the wrong kind (the message names the key)."""


# -- states ----------------------------------------------------------------------------------
def state_to_record(state: Mapping[str, np.ndarray]) -> ArrayRecord:
    """A state as an ArrayRecord, key by key in its order (dtype and shape kept)."""
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in state.items()})


def record_to_state(record: ArrayRecord) -> dict[str, np.ndarray]:
    """The state of :func:`state_to_record`'s record."""
    return {k: a.numpy() for k, a in record.items()}


def _arrays(content: RecordDict, key: str) -> ArrayRecord:
    try:
        return content.array_records[key]
    except KeyError:
        raise RecordError(f"the message has no array record {key!r}") from None


def _config(content: RecordDict, key: str) -> ConfigRecord:
    try:
        return content.config_records[key]
    except KeyError:
        raise RecordError(f"the message has no config record {key!r}") from None


def _metrics(content: RecordDict, key: str) -> MetricRecord:
    try:
        return content.metric_records[key]
    except KeyError:
        raise RecordError(f"the message has no metric record {key!r}") from None


def get_int(record: Mapping[str, object], key: str) -> int:
    """``record[key]`` as an int (RecordError when missing or not an integer)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{key!r} must be an integer, got {value!r}")
    return value


def get_float(record: Mapping[str, object], key: str) -> float:
    """``record[key]`` as a float (RecordError when missing or not a number)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{key!r} must be a number, got {value!r}")
    return float(value)


def get_str(record: Mapping[str, object], key: str) -> str:
    """``record[key]`` as a str (RecordError when missing or not a string)."""
    value = record.get(key)
    if not isinstance(value, str):
        raise RecordError(f"{key!r} must be a string, got {value!r}")
    return value


def _groups(content: RecordDict, prefix: str) -> dict[str, State]:
    return {
        k.removeprefix(prefix): record_to_state(r)
        for k, r in content.array_records.items()
        if k.startswith(prefix)
    }


# -- the run's configuration -----------------------------------------------------------------
def sim_config_to_json(config: SimConfig) -> str:
    """The run's SimConfig as JSON (what a node needs to build the model and describe its data
    exactly as the server's benchmark does)."""
    return json.dumps(config_dict(config), sort_keys=True)


def sim_config_from_json(text: str) -> SimConfig:
    """The SimConfig of :func:`sim_config_to_json`."""
    data = dict(json.loads(text))
    data["image_size"] = tuple(data["image_size"])
    return SimConfig(**data)


def recipe_to_config(recipe: TrainRecipe, into: ConfigRecord) -> None:
    """Write the recipe into a ConfigRecord as ``recipe.<field>`` keys (a field that is None
    is left out)."""
    for key, value in recipe.to_dict().items():
        if value is not None:
            into[_RECIPE + key] = value


def recipe_from_config(config: ConfigRecord) -> TrainRecipe | None:
    """The recipe of :func:`recipe_to_config` (None when the record carries none)."""
    found = {k.removeprefix(_RECIPE): v for k, v in config.items() if k.startswith(_RECIPE)}
    if not found:
        return None
    data: dict[str, Any] = {f.name: None for f in fields(TrainRecipe)}
    data.update(found)
    return TrainRecipe.from_dict(data)


# -- training --------------------------------------------------------------------------------
def task_to_content(
    task: TrainTask, *, cid: str, rnd: int, model: ArrayRecord | None = None
) -> RecordDict:
    """A train message's content: the task of client ``cid`` in (fedepth's, 0-based) round
    ``rnd``; ``model``: the task's state as a record already (one record serves every node
    that gets the same model)."""
    config = ConfigRecord({"cid": cid, "round": rnd})
    if task.hook is not None:
        config["hook"] = task.hook
    for name, value in task.hook_params.items():
        config[_HOOK_PARAM + name] = float(value)
    if task.recipe is not None:
        recipe_to_config(task.recipe, config)
    record = state_to_record(task.state) if model is None else model
    content = RecordDict({MODEL: record, CONFIG: config})
    for name, state in task.hook_state.items():
        content[HOOK_STATE + name] = state_to_record(state)
    return content


def content_to_task(content: RecordDict) -> tuple[TrainTask, str, int]:
    """(task, client id, round) of :func:`task_to_content`'s content."""
    config = _config(content, CONFIG)
    hook = config.get("hook")
    task = TrainTask(
        state=record_to_state(_arrays(content, MODEL)),
        hook=None if hook is None else get_str(config, "hook"),
        hook_params={
            k.removeprefix(_HOOK_PARAM): get_float(config, k)
            for k in config
            if k.startswith(_HOOK_PARAM)
        },
        hook_state=_groups(content, HOOK_STATE),
        recipe=recipe_from_config(config),
    )
    return task, get_str(config, "cid"), get_int(config, "round")


def update_to_content(update: ClientUpdate, *, seconds: float) -> RecordDict:
    """A train reply's content: the update (its sample count as ``num-examples``)."""
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: int(update.num_samples),
            "num-steps": int(update.num_steps),
            "train-seconds": float(seconds),
            **{k: float(v) for k, v in update.metrics.items()},
        }
    )
    content = RecordDict(
        {
            MODEL: state_to_record(update.state),
            METRICS: metrics,
            CLIENT: ConfigRecord({"cid": update.cid}),
        }
    )
    for name, state in update.extra.items():
        content[EXTRA + name] = state_to_record(state)
    return content


def content_to_update(content: RecordDict) -> tuple[ClientUpdate, float]:
    """(update, seconds the node trained) of :func:`update_to_content`'s content."""
    metrics = _metrics(content, METRICS)
    own = (NUM_EXAMPLES, "num-steps", "train-seconds")
    update = ClientUpdate(
        cid=get_str(_config(content, CLIENT), "cid"),
        state=record_to_state(_arrays(content, MODEL)),
        num_samples=get_int(metrics, NUM_EXAMPLES),
        num_steps=get_int(metrics, "num-steps"),
        extra=dict(_groups(content, EXTRA)),
        metrics={k: get_float(metrics, k) for k in metrics if k not in own},
    )
    return update, get_float(metrics, "train-seconds")


# -- the descriptor round --------------------------------------------------------------------
def info_to_content(info: ClientInfo, *, partition: int, summaries: tuple[str, ...]) -> RecordDict:
    """A descriptor reply's content: the node's client (its partition index, its labels, its
    descriptor) and the ``summaries`` the strategy asked for."""
    if info.descriptor is None:
        raise ValueError(f"client {info.cid!r} has no descriptor")
    client = ConfigRecord(
        {
            "cid": info.cid,
            NUM_EXAMPLES: int(info.num_samples),
            "partition-id": int(partition),
            "num-frames": int(info.descriptor.num_frames),
            **{f"label.{k}": str(v) for k, v in info.labels.items()},
        }
    )
    content = RecordDict(
        {
            CLIENT: client,
            DESCRIPTOR: ArrayRecord(
                {"mean": Array(info.descriptor.mean), "var": Array(info.descriptor.var)}
            ),
        }
    )
    wanted = {k: np.asarray(v) for k, v in info.extra.items() if k in summaries}
    if wanted:
        content[SUMMARIES] = state_to_record(wanted)
    return content


def content_to_info(content: RecordDict) -> tuple[ClientInfo, int]:
    """(client info, partition index) of :func:`info_to_content`'s content. Raises
    ValueError (one line) for a malformed descriptor or sample count."""
    client = _config(content, CLIENT)
    arrays = record_to_state(_arrays(content, DESCRIPTOR))
    if "mean" not in arrays or "var" not in arrays:
        raise RecordError("the descriptor record needs 'mean' and 'var'")
    descriptor = Descriptor(
        mean=np.asarray(arrays["mean"], dtype=np.float64),
        var=np.asarray(arrays["var"], dtype=np.float64),
        num_frames=get_int(client, "num-frames"),
    )
    summaries = content.array_records.get(SUMMARIES)
    info = ClientInfo(
        cid=get_str(client, "cid"),
        num_samples=get_int(client, NUM_EXAMPLES),
        descriptor=descriptor,
        labels={
            k.removeprefix("label."): get_str(client, k) for k in client if k.startswith("label.")
        },
        extra={} if summaries is None else record_to_state(summaries),
    )
    return info, get_int(client, "partition-id")
