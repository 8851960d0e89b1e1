"""The Flower ClientApp of a fedepth node: ``app``, three handlers over fedepth's client code.

- ``query`` (the descriptor round, the first message of a federation): build the run's model,
  load the initial weights it came with, describe this node's training data with
  :func:`fedepth.sim.describe_client` (the benchmark's own description: frozen encoder, GeM,
  Gaussian descriptor, PACFL basis) and reply with the descriptor, the sample count, the
  labels and the summaries the strategy asked for;
- ``train``: :func:`fedepth.client.train_round`, the one client-round function, on this node's
  data with the message's task (model, client hook and hook state, recipe); the hook's memory
  (SCAFFOLD's c_i, FedDyn's gradient) stays in the node's ``context.state`` between rounds;
- ``evaluate``: the message's model scored on this node's own sequences
  (:func:`fedepth.sim.evaluate_sequence`).

Which data is the node's: the scenario directory (``fedepth data synth`` output) named by the
node config's ``data-dir``, else by the server (the simulation's nodes share the server's), and
in it the training client at index ``partition-id`` of the node config (Flower's simulation
numbers its nodes so) or the one named ``client``. A node whose partition is empty, or whose
node config names none, replies with an error that says so; the server leaves it out.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedepth.client import train_round
from fedepth.data.scenario import Client, Scenario, load_scenario
from fedepth.metrics import mean_errors
from fedepth.models import DepthModel, set_state
from fedepth.models.base import FeatureExtractor
from fedepth.sim import SimConfig, describe_client, evaluate_sequence, fleet_extractor
from fedepth.sim.executors import ModelCache
from fedepth.strategies import State
from fedepth_flower.records import (
    CONFIG,
    METRICS,
    MODEL,
    NUM_EXAMPLES,
    RecordError,
    content_to_task,
    get_int,
    info_to_content,
    record_to_state,
    sim_config_from_json,
    state_to_record,
    update_to_content,
)

#: ``context.state`` records of a node: what it learned in the descriptor round, and its
#: client hook's memory (one ArrayRecord per group)
NODE = "fedepth.node"
MEMORY = "fedepth.memory."

app = ClientApp()

#: This process's scenarios (by directory) and model: a simulation's worker serves many nodes
#: and rounds; every round loads the task's weights into the model before training.
_SCENARIOS: dict[str, Scenario] = {}
_MODEL = ModelCache()


class NodeDataError(ValueError):
    """This node cannot take part: the message says why, in one line (sent back as the
    reply's error)."""


def _scenario(data_dir: str) -> Scenario:
    if data_dir not in _SCENARIOS:
        try:
            _SCENARIOS[data_dir] = load_scenario(data_dir)
        except (OSError, ValueError) as exc:
            raise NodeDataError(f"cannot read the scenario at {data_dir!r}: {exc}") from exc
    return _SCENARIOS[data_dir]


def node_client(node_config: Mapping[str, object], scenario: Scenario) -> tuple[Client, int]:
    """This node's training client and its partition index, from the node config's
    ``client`` (a client's name) or ``partition-id`` (its index in the scenario)."""
    names = [c.name for c in scenario.clients]
    n = len(names)
    if node_config.get("client"):
        name = str(node_config["client"])
        if name not in names:
            raise NodeDataError(
                f"client {name!r} is not in the scenario at {scenario.root} "
                f"(its clients: {', '.join(names)})"
            )
        partition = names.index(name)
    elif "partition-id" in node_config:
        try:
            partition = get_int(node_config, "partition-id")
        except RecordError as exc:
            raise NodeDataError(f"node config: {exc}") from None
    else:
        raise NodeDataError("the node config names neither a partition-id nor a client")
    if not 0 <= partition < n:
        raise NodeDataError(
            f"partition {partition} is empty: the scenario at {scenario.root} has {n} training "
            f"clients (partitions 0 to {n - 1})"
        )
    client = scenario.clients[partition]
    if client.num_samples == 0:
        raise NodeDataError(
            f"partition {partition} (client {client.name!r}) is empty: it has no training frames"
        )
    return client, partition


def _error(msg: Message, exc: Exception) -> Message:
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, str(exc)), reply_to=msg)


def _model(config: SimConfig, state: State | None = None) -> DepthModel:
    torch.set_num_threads(config.threads)  # as the benchmark's executors: same numbers
    model = _MODEL.get(config)
    if state is not None:
        set_state(model, state)
    return model


@app.query()
def describe(msg: Message, context: Context) -> Message:
    """The descriptor round: this node's descriptor, sample count, labels and summaries."""
    try:
        cfg = msg.content.config_records[CONFIG]
        config = sim_config_from_json(str(cfg["sim-config"]))
        data_dir = str(context.node_config.get("data-dir") or cfg.get("data-dir") or "")
        if not data_dir:
            raise NodeDataError("neither the node config nor the server names a data-dir")
        client, partition = node_client(context.node_config, _scenario(data_dir))
    except NodeDataError as exc:
        return _error(msg, exc)
    model = _model(config, record_to_state(msg.content.array_records[MODEL]))
    describer = (
        FeatureExtractor.imagenet(model.encoder.name)
        if config.descriptor_encoder == "imagenet"
        else model
    )
    info = describe_client(client, fleet_extractor(describer, config), config)
    # a new federation: the hook memory of an earlier one does not carry over
    for key in [k for k in context.state.array_records if k.startswith(MEMORY)]:
        del context.state[key]
    context.state[NODE] = ConfigRecord(
        {
            "session": str(cfg["session"]),
            "sim-config": str(cfg["sim-config"]),
            "data-dir": data_dir,
            "cid": client.name,
            "partition-id": partition,
        }
    )
    summaries = tuple(k for k in str(cfg.get("summaries", "")).split(",") if k)
    return Message(info_to_content(info, partition=partition, summaries=summaries), reply_to=msg)


def _described(msg: Message, context: Context) -> tuple[ConfigRecord, SimConfig, Client]:
    """What the descriptor round of this message's federation left in ``context.state``."""
    node = context.state.config_records.get(NODE)
    session = msg.content.config_records[CONFIG].get("session")
    if node is None or node["session"] != session:
        raise NodeDataError(
            "this node did not describe its data in this federation (no descriptor round "
            "reached it, or it restarted since)"
        )
    return node, sim_config_from_json(str(node["sim-config"])), _client(node)


def _client(node: ConfigRecord) -> Client:
    return _scenario(str(node["data-dir"])).client(str(node["cid"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training with :func:`fedepth.client.train_round`."""
    try:
        node, config, client = _described(msg, context)
        task, cid, rnd = content_to_task(msg.content)
        if cid != node["cid"]:
            raise NodeDataError(f"a task for client {cid!r}; this node is {node['cid']!r}")
    except NodeDataError as exc:
        return _error(msg, exc)
    memory = {
        k.removeprefix(MEMORY): record_to_state(r)
        for k, r in context.state.array_records.items()
        if k.startswith(MEMORY)
    }
    result = train_round(_model(config), task, client.sequences, cid=cid, rnd=rnd, memory=memory)
    for name, state in result.memory.items():
        context.state[MEMORY + name] = state_to_record(state)
    return Message(update_to_content(result.update, seconds=result.seconds), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The message's model on this node's own sequences: mean depth metrics over them."""
    try:
        _, config, client = _described(msg, context)
    except NodeDataError as exc:
        return _error(msg, exc)
    model = _model(config, record_to_state(msg.content.array_records[MODEL]))
    rows = [evaluate_sequence(model, seq, config)[0] for seq in client.sequences]
    metrics = MetricRecord({**mean_errors(rows), NUM_EXAMPLES: len(rows)})
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)
