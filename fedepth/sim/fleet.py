"""A scenario prepared for simulation: descriptors of its clients and unseen test sequences.

:func:`prepare_fleet` describes every client (and its PACFL subspace basis) from frames
sampled over its data, and every test sequence from its first frames, into a :class:`Fleet`;
:func:`describe_client` is its description of one client, which a federated node (the Flower
bridge's ClientApp) runs on its own data.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from fedepth import clustering
from fedepth.data.holdout import holdout_validation
from fedepth.data.scenario import Client, Scenario
from fedepth.data.sequence import Sequence as RGBDSequence
from fedepth.data.torchdata import descriptor_rgb
from fedepth.descriptor import Descriptor, DescriptorExtractor
from fedepth.models.base import FeatureExtractor
from fedepth.sim.config import SimConfig
from fedepth.strategies import ClientInfo
from fedepth.strategies.pacfl import BASIS_KEY


@dataclass
class Fleet:
    """A scenario prepared for simulation: client infos with descriptors, test-time queries.

    With a validation split (``SimConfig.validation_share``), ``scenario``'s clients hold the
    heads of their sequences alone (what they train on and are described by) and
    ``validation`` their held-out tails, by client name; without one it is empty."""

    scenario: Scenario
    infos: list[ClientInfo]
    test_queries: list[tuple[RGBDSequence, Descriptor, dict[str, np.ndarray]]]
    descriptor_seconds: float
    validation: dict[str, list[RGBDSequence]] = field(default_factory=dict)

    @property
    def clients(self) -> list[Client]:
        return self.scenario.clients


def _client_rgb(client: Client) -> _ConcatenatedFrames:
    """A lazy indexable over the RGB frames of all of a client's sequences."""
    return _ConcatenatedFrames([s.rgb_frames() for s in client.sequences])


class _ConcatenatedFrames:
    """Several lazy frame sequences read as one, in order (frame i of the whole)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.offsets = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Any:
        k = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return self.parts[k][int(i - self.offsets[k])]


def fleet_extractor(encoder_model: FeatureExtractor, config: SimConfig) -> DescriptorExtractor:
    """The descriptor extractor of a run: ``encoder_model``'s frozen encoder over the
    configured maps, ``config.descriptor_frames`` frames sampled with the run's seed."""
    return DescriptorExtractor(
        functools.partial(encoder_model.forward_features, layers=config.descriptor_layers),
        num_frames=config.descriptor_frames,
        seed=config.seed,
    )


def describe_client(
    client: Client, extractor: DescriptorExtractor, config: SimConfig
) -> ClientInfo:
    """One training client's :class:`ClientInfo`: its descriptor from frames sampled over all
    of its data, its PACFL subspace basis, its labels (what :func:`prepare_fleet` computes for
    each client, and a federated node for its own)."""
    desc, feats = extractor.extract_with_features(
        _client_rgb(client), to_tensor=lambda img: descriptor_rgb(img, config.image_size)
    )
    basis = clustering.subspace_basis(feats.T, config.pacfl_basis)
    return ClientInfo(
        client.name,
        client.num_samples,
        desc,
        labels={"platform": client.platform, "environment": client.environment},
        extra={BASIS_KEY: basis},
    )


def prepare_fleet(
    scenario: Scenario,
    encoder_model: FeatureExtractor,
    config: SimConfig,
    *,
    progress: bool = True,
) -> Fleet:
    """Descriptors (and PACFL subspace bases) of every client and test sequence, under
    ``encoder_model``'s frozen encoder (a depth model, or the ImageNet encoder alone).

    Training clients describe n frames sampled over their data; an unseen test sequence is
    described from its first n frames, as a robot would at the start of a deployment. With
    ``config.validation_share`` > 0 the tail of every client sequence is held out first
    (:func:`~fedepth.data.holdout.holdout_validation`; it raises
    :class:`~fedepth.data.holdout.ValidationSplitError` for a client it leaves without
    training or validation frames): the clients are described by, and train on, the rest.
    """
    t0 = time.perf_counter()
    size = config.image_size
    validation: dict[str, list[RGBDSequence]] = {}
    if config.validation_share > 0:
        clients, validation = holdout_validation(scenario.clients, config.validation_share)
        scenario = dataclasses.replace(scenario, clients=clients)

    def to_tensor(img: Any) -> torch.Tensor:
        return descriptor_rgb(img, size)

    extractor = fleet_extractor(encoder_model, config)
    infos = [
        describe_client(c, extractor, config)
        for c in tqdm(
            scenario.clients, desc="descriptors", unit="client", leave=False, disable=not progress
        )
    ]
    queries = []
    for seq in scenario.test:
        n = min(len(seq), config.descriptor_frames)
        first = _FirstFrames(seq.rgb_frames(), n)
        desc, feats = extractor.extract_with_features(first, to_tensor=to_tensor)
        queries.append(
            (seq, desc, {BASIS_KEY: clustering.subspace_basis(feats.T, config.pacfl_basis)})
        )
    return Fleet(scenario, infos, queries, time.perf_counter() - t0, validation)


class _FirstFrames:
    """The first ``n`` frames of a lazy frame sequence (what a robot has seen at the start of a
    deployment)."""

    def __init__(self, frames: Any, n: int) -> None:
        self.frames, self.n = frames, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.frames[int(i)]
