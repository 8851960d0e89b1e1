"""Robot RGB-D data: the Sequence type, M3ED / NYUv2 / KITTI readers, scenarios, torch adapter.

The synthetic scenario engine lives in :mod:`fedepth.data.synth` (imported on demand: it needs
trimesh and Embree); everything here only reads.
"""

from fedepth.data.errors import DataError
from fedepth.data.kitti import KittiSequence
from fedepth.data.m3ed import M3EDSequence
from fedepth.data.nyu import NYUSequence, NYUv2Labeled
from fedepth.data.scenario import Client, Scenario, load_scenario
from fedepth.data.sequence import Frame, RGBFrames, Sequence, SequenceMeta, SubSequence

__all__ = [
    "Client",
    "DataError",
    "Frame",
    "KittiSequence",
    "M3EDSequence",
    "NYUSequence",
    "NYUv2Labeled",
    "RGBFrames",
    "Scenario",
    "Sequence",
    "SequenceMeta",
    "SubSequence",
    "load_scenario",
]
