"""Any fedepth strategy as a Flower strategy on the Message API: :class:`FedepthStrategy`.

It wraps a :class:`fedepth.strategies.Strategy` (FedAvg, FedProx, SCAFFOLD, FedDyn, FedClust,
PACFL, hard clustering, FeDepth, the label groups; not CL, which trains one pooled participant)
and drives it with the round driver the simulation and the coordinator use
(:class:`fedepth.rounds.RoundDriver`: select, plan with the round's recipe, validate each
update, aggregate in the fleet's order), so the numbers are the in-process benchmark's:

1. :meth:`FedepthStrategy.describe`, the descriptor round before the first training round
   (:meth:`start` runs it): every node gets the initial model and the run's configuration,
   describes its own data (its descriptor, its sample count, its labels, and the summaries the
   strategy asks for: PACFL's subspace basis) and the strategy is initialized with the nodes
   that answered well, in the fleet's order;
2. :meth:`configure_train`: each selected node gets its OWN model (the mean of its clusters'
   models, computed here), its client hook and hook state, and the round's
   :class:`~fedepth.recipe.TrainRecipe` in the message's ConfigRecord;
3. :meth:`aggregate_train`: the replies are checked as the coordinator checks uploads and
   folded into the strategy in the fleet's order;
4. :meth:`configure_evaluate` / :meth:`aggregate_evaluate`: optional federated evaluation of
   each node's own model on its own data (``fraction_evaluate``; off by default, as the
   benchmark scores routed models on unseen sequences on the server).

A node that fails (an error reply, an empty partition, a descriptor of another dimension than
the fleet's, an update the bounds reject, no reply in time) gets one log line at ERROR that
names it and is left out, of the run in the descriptor round and of the round afterwards, as
the coordinator leaves out a robot whose registration or upload it rejects; the run goes on
with the others. The record formats are in :mod:`fedepth_flower.records`.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedepth.rounds import RoundDriver, RoundRules
from fedepth.sim import SimConfig
from fedepth.strategies import ClientInfo, ClientUpdate, TrainTask
from fedepth.strategies import Strategy as FedepthAlgorithm
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth.updates import UpdateRejectedError
from fedepth_flower.records import (
    CONFIG,
    METRICS,
    MODEL,
    NUM_EXAMPLES,
    content_to_info,
    content_to_update,
    record_to_state,
    sim_config_to_json,
    state_to_record,
    task_to_content,
)

#: The bridge's log lines go through Flower's logger (they show in ``flwr run --stream``).
log = logging.getLogger("flwr").getChild("fedepth")


class FlowerBridgeError(RuntimeError):
    """The run cannot go on (no node described its data, a round before the descriptor round)."""


def one_line(reason: str | None) -> str:
    """An error reply's reason in one line: a ClientApp's own message, not Flower's traceback
    around it."""
    text = (reason or "no reason given").strip()
    found = re.findall(r"Message: (.+?)(?:'>)?$", text, flags=re.MULTILINE)
    if found:
        return found[-1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


@dataclass
class RoundLog:
    """What one training round did: the tasks sent, the updates accepted (in the fleet's
    order), those left out and why, and where the time went (seconds)."""

    round: int
    selected: tuple[str, ...]
    tasks: dict[str, TrainTask]
    accepted: list[ClientUpdate] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    #: seconds each node reported training
    train_s: dict[str, float] = field(default_factory=dict)
    configure_s: float = 0.0
    #: from the end of configure_train to the start of aggregate_train: the messages' way to
    #: the nodes, their training, the replies' way back
    collect_s: float = 0.0
    aggregate_s: float = 0.0


class FedepthStrategy(Strategy):
    """A fedepth strategy (``algorithm``, not initialized yet) as a Flower strategy.

    ``config`` is the run's :class:`~fedepth.sim.SimConfig`: the recipe of every round, the
    update bounds, and what the nodes need to build the model and describe their data as the
    benchmark does. ``data_dir``: the scenario directory a node reads when its node config
    names none (the simulation's nodes share the server's). ``order``: client ids in the order
    the fleet is initialized and aggregated (the benchmark's scenario order); clients not in
    it follow by partition index. ``descriptor_dim``: the descriptors' dimension (None: the
    one most nodes report). ``fraction_train`` / ``fraction_evaluate``: the share of nodes
    selected for training (seeded by ``config.seed`` and the round, as the round driver
    does) and for federated evaluation (0: none).
    """

    def __init__(
        self,
        algorithm: FedepthAlgorithm,
        config: SimConfig,
        *,
        data_dir: str | None = None,
        order: Sequence[str] = (),
        descriptor_dim: int | None = None,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
    ) -> None:
        if getattr(algorithm, "pooled", False):
            raise ValueError(
                f"{algorithm.name} trains one pooled participant, not a federation of nodes; "
                "run it in-process (fedepth bench)"
            )
        if not 0.0 <= fraction_evaluate <= 1.0:
            raise ValueError(f"fraction_evaluate must lie in [0, 1], got {fraction_evaluate}")
        self.algorithm = algorithm
        self.config = config
        self.data_dir = data_dir
        self.order = list(order)
        self.descriptor_dim = descriptor_dim
        self.fraction_evaluate = fraction_evaluate
        self.driver = RoundDriver(
            algorithm,
            RoundRules(config.rounds, fraction=fraction_train, seed=config.seed),
            recipe=config.recipe,
            bounds=config.update_bounds(),
        )
        self._evaluation = (
            RoundDriver(
                algorithm,
                RoundRules(config.rounds, fraction=fraction_evaluate, seed=config.seed + 1),
            )
            if fraction_evaluate > 0
            else None
        )
        #: the clients in the strategy, in its order, and their nodes
        self.members: list[str] = []
        self.node_of: dict[str, int] = {}
        self.cid_of: dict[int, str] = {}
        self.partition_of: dict[str, int] = {}
        #: nodes left out of the run in the descriptor round: node id -> why
        self.excluded: dict[int, str] = {}
        self.rounds: list[RoundLog] = []
        self.describe_s = 0.0
        #: this federation's token: a node trains only for the session it described its data in
        self.session = secrets.token_hex(8)
        self._sent_at = 0.0
        self._initial: dict[str, np.ndarray] = {}
        self._num_rounds = config.rounds
        self._started = False

    # -- the descriptor round ----------------------------------------------------------------
    def summaries(self) -> tuple[str, ...]:
        """The summaries of their data the nodes are asked for besides the descriptor."""
        return tuple(self.algorithm.client_summaries)

    def describe(self, grid: Grid, initial: ArrayRecord, *, timeout: float | None = None) -> None:
        """The descriptor round: ask every node of ``grid`` to describe its data with the
        initial model's frozen encoder, then initialize the strategy with those that did."""
        t0 = time.perf_counter()
        messages = self.configure_describe(grid.get_node_ids(), initial)
        replies = grid.send_and_receive(messages, timeout=timeout)
        self.aggregate_describe(
            [m.metadata.dst_node_id for m in messages], replies, initial, timeout=timeout
        )
        self.describe_s = time.perf_counter() - t0
        log.info(
            "%s: %d node(s) described their data, %d left out, in %.1f s",
            self.algorithm.name,
            len(self.members),
            len(self.excluded),
            self.describe_s,
        )

    def configure_describe(self, nodes: Iterable[int], initial: ArrayRecord) -> list[Message]:
        """The descriptor round's messages to ``nodes``: the initial model, the run's
        configuration, this federation's session, the summaries to send."""
        config = ConfigRecord(
            {
                "session": self.session,
                "sim-config": sim_config_to_json(self.config),
                "summaries": ",".join(self.summaries()),
            }
        )
        if self.data_dir is not None:
            config["data-dir"] = str(self.data_dir)
        content = RecordDict({MODEL: initial, CONFIG: config})
        return [
            Message(content, dst_node_id=n, message_type=MessageType.QUERY) for n in sorted(nodes)
        ]

    def aggregate_describe(
        self,
        nodes: Sequence[int],
        replies: Iterable[Message],
        initial: ArrayRecord,
        *,
        timeout: float | None = None,
    ) -> None:
        """Initialize the strategy with the ``nodes`` whose reply describes their data well
        (in the fleet's order); every other node is left out of the run with an error line."""
        self._initial = record_to_state(initial)
        by_node = {r.metadata.src_node_id: r for r in replies}
        found: list[tuple[ClientInfo, int, int]] = []
        for node in nodes:
            reply = by_node.get(node)
            if reply is None:
                self._exclude(node, None, f"no reply within {timeout} s")
                continue
            if reply.has_error():
                self._exclude(node, None, one_line(reply.error.reason))
                continue
            try:
                info, partition = content_to_info(reply.content)
            except (KeyError, TypeError, ValueError) as exc:
                self._exclude(node, None, f"a malformed descriptor reply: {exc}")
                continue
            found.append((info, partition, node))
        self._admit(found)

    def _exclude(self, node: int, partition: int | None, why: str) -> None:
        where = f"node {node}" + ("" if partition is None else f" (partition {partition})")
        self.excluded[node] = why
        log.error("%s: %s; left out of the run", where, why)

    def _admit(self, found: list[tuple[ClientInfo, int, int]]) -> None:
        dims = [i.descriptor.dim for i, _, _ in found if i.descriptor is not None]
        expected = self.descriptor_dim
        if expected is None and dims:
            expected = Counter(dims).most_common(1)[0][0]
        rank = {cid: k for k, cid in enumerate(self.order)}
        found.sort(key=lambda f: (rank.get(f[0].cid, len(rank)), f[1], f[0].cid))
        infos: list[ClientInfo] = []
        for info, partition, node in found:
            problem = self._check(info, expected)
            if problem is not None:
                self._exclude(node, partition, f"client {info.cid!r}: {problem}")
                continue
            infos.append(info)
            self.node_of[info.cid] = node
            self.cid_of[node] = info.cid
            self.partition_of[info.cid] = partition
        if not infos:
            raise FlowerBridgeError(
                f"{self.algorithm.name}: no node described its data "
                f"({len(self.excluded)} left out: see the errors above)"
            )
        self.members = [i.cid for i in infos]
        self.algorithm.initialize(infos, self._initial)

    def _check(self, info: ClientInfo, expected: int | None) -> str | None:
        """Why a node's description may not join the fleet (None: it may)."""
        d = info.descriptor
        if d is None:
            return "no descriptor"
        if info.cid in self.node_of:
            return f"another node already described client {info.cid!r}"
        if expected is not None and d.dim != expected:
            return (
                f"descriptor has {d.dim} dimensions but the fleet's have {expected}: compute "
                "it with the same encoder as the other nodes"
            )
        missing = [k for k in self.summaries() if k not in info.extra]
        if missing:
            return f"the summaries {', '.join(missing)} the strategy asked for are missing"
        basis = info.extra.get(BASIS_KEY)
        if basis is not None and (np.ndim(basis) != 2 or np.shape(basis)[0] != d.dim):
            return (
                f"summary {BASIS_KEY!r} must be a D x p basis with D = {d.dim}, got shape "
                f"{list(np.shape(basis))}"
            )
        return None

    # -- the loop ----------------------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int | None = None,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's loop (:meth:`flwr.serverapp.strategy.Strategy.start`) after the descriptor
        round, for ``num_rounds`` rounds (None: the config's). The result's ``arrays`` hold the
        whole server state at the end (:meth:`server_arrays`: every cluster's model, ...)."""
        if self._started:
            raise FlowerBridgeError("a FedepthStrategy runs one federation; make a new one")
        self._started = True
        self._num_rounds = self.config.rounds if num_rounds is None else num_rounds
        self.describe(grid, initial_arrays, timeout=timeout)
        return super().start(
            grid,
            initial_arrays,
            self._num_rounds,
            timeout,
            train_config,
            evaluate_config,
            evaluate_fn,
        )

    def server_arrays(self) -> ArrayRecord:
        """The strategy's server state (:meth:`fedepth.strategies.Strategy.state_dict`'s named
        states) as one ArrayRecord, keys ``<group>/<tensor>`` (``cluster/0/...``)."""
        _, states = self.algorithm.state_dict()
        return state_to_record(
            {
                f"{group}/{name}": arr
                for group, state in states.items()
                for name, arr in state.items()
            }
        )

    def summary(self) -> None:
        log.info("\t├──> fedepth strategy: %s", self.algorithm.name)
        log.info("\t├──> nodes in the fleet: %d", len(self.members))
        log.info("\t└──> federated evaluation: fraction %.2f", self.fraction_evaluate)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Each selected node's own task of (Flower's 1-based) ``server_round``: its model,
        client hook and hook state, the round's recipe (``arrays`` is not used: nodes of
        different clusters get different models)."""
        if not self.members:
            raise FlowerBridgeError("configure_train before the descriptor round (describe)")
        rnd = server_round - 1
        t0 = time.perf_counter()
        selected = self.driver.select(rnd, self.members)
        tasks = self.driver.tasks(rnd, selected)
        models: dict[int, ArrayRecord] = {}  # one record per distinct model
        messages = []
        for cid in selected:
            task = tasks[cid]
            key = id(task.state)
            if key not in models:
                models[key] = state_to_record(task.state)
            content = task_to_content(task, cid=cid, rnd=rnd, model=models[key])
            cfg = content.config_records[CONFIG]
            for k, v in config.items():
                cfg.setdefault(k, v)
            cfg["server-round"] = server_round
            cfg["session"] = self.session
            messages.append(
                Message(
                    content,
                    dst_node_id=self.node_of[cid],
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        self.rounds.append(RoundLog(rnd, selected, tasks, configure_s=time.perf_counter() - t0))
        self._sent_at = time.perf_counter()
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply as the coordinator checks an upload, then fold the accepted
        updates into the strategy in the fleet's order. Returns the round's metrics weighted
        by the nodes' sample counts, and arrays only after the last round (each node has its
        own model; then :meth:`server_arrays`, the whole server state, becomes the result's)."""
        rnd = server_round - 1
        out = self.rounds[-1]
        if out.round != rnd:
            raise FlowerBridgeError(f"aggregate_train of round {server_round} was not configured")
        out.collect_s = time.perf_counter() - self._sent_at
        accepted: dict[str, ClientUpdate] = {}
        contents: list[RecordDict] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            cid = self.cid_of.get(node)
            if cid is None or cid not in out.tasks or cid in accepted or cid in out.left_out:
                log.error(
                    "round %d: a reply from node %d, which was not asked for one or already "
                    "answered; ignored",
                    server_round,
                    node,
                )
                continue
            got = self._accept(reply, cid, out)
            if isinstance(got, str):
                self._leave_out(out, server_round, cid, got)
                continue
            accepted[cid], out.train_s[cid] = got
            contents.append(reply.content)
        for cid in out.selected:
            if cid not in accepted and cid not in out.left_out:
                self._leave_out(out, server_round, cid, "no reply before the round's timeout")
        t0 = time.perf_counter()
        out.accepted = self.driver.aggregate(rnd, out.selected, accepted)
        out.aggregate_s = time.perf_counter() - t0
        if not contents:
            return (self.server_arrays() if server_round == self._num_rounds else None), None
        metrics = aggregate_metricrecords(contents, NUM_EXAMPLES)
        metrics["accepted"] = len(out.accepted)
        metrics["left-out"] = len(out.left_out)
        return (self.server_arrays() if server_round == self._num_rounds else None), metrics

    def _accept(self, reply: Message, cid: str, out: RoundLog) -> tuple[ClientUpdate, float] | str:
        """A node's training reply as (update, seconds trained), or why it may not touch an
        aggregate."""
        if reply.has_error():
            return one_line(reply.error.reason)
        try:
            update, seconds = content_to_update(reply.content)
        except (KeyError, TypeError, ValueError) as exc:
            return f"a malformed update: {exc}"
        if update.cid != cid:
            return f"the update is of client {update.cid!r}, the node trains {cid!r}"
        try:
            self.driver.validate(update, out.tasks[cid])
        except UpdateRejectedError as exc:
            return str(exc)
        return update, seconds

    def _leave_out(self, out: RoundLog, server_round: int, cid: str, why: str) -> None:
        out.left_out[cid] = why
        log.error(
            "round %d: node %d (client %s, partition %d): %s; its update is left out of the round",
            server_round,
            self.node_of[cid],
            cid,
            self.partition_of[cid],
            why,
        )

    # -- federated evaluation ----------------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Each selected node's own model, to score on its own data (none when
        ``fraction_evaluate`` is 0)."""
        if self._evaluation is None:
            return []
        rnd = server_round - 1
        messages = []
        for cid in self._evaluation.select(rnd, self.members):
            cfg = ConfigRecord(
                {"cid": cid, "round": rnd, "server-round": server_round, "session": self.session}
            )
            for k, v in config.items():
                cfg.setdefault(k, v)
            content = RecordDict(
                {MODEL: state_to_record(self.algorithm.model_for(cid)), CONFIG: cfg}
            )
            messages.append(
                Message(
                    content,
                    dst_node_id=self.node_of[cid],
                    message_type=MessageType.EVALUATE,
                    group_id=str(server_round),
                )
            )
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The nodes' metrics, weighted by how many frames each scored."""
        contents = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.error(
                    "round %d: node %d: evaluation failed: %s",
                    server_round,
                    node,
                    one_line(reply.error.reason),
                )
            elif METRICS in reply.content.metric_records:
                contents.append(reply.content)
            else:
                log.error(
                    "round %d: node %d: an evaluation reply without metrics", server_round, node
                )
        return aggregate_metricrecords(contents, NUM_EXAMPLES) if contents else None
