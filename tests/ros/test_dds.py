"""The Fast DDS profile the nodes start with (fedepth_ros.dds)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from fedepth_ros.dds import LARGE_DATA_PROFILE, use_large_data_profile

NS = {"dds": "http://www.eprosima.com"}


def test_the_profile_is_a_default_participant_profile_with_a_large_shm_segment() -> None:
    root = ET.parse(LARGE_DATA_PROFILE).getroot()
    shm = [
        t
        for t in root.iterfind(".//dds:transport_descriptor", NS)
        if t.findtext("dds:type", namespaces=NS) == "SHM"
    ]
    assert len(shm) == 1
    # a 640x480 PointCloud2 (3.7 MB) several times over; Fast DDS's own default is 512 KiB
    assert int(shm[0].findtext("dds:segment_size", namespaces=NS) or 0) >= 16 << 20
    participant = root.find(".//dds:participant", NS)
    assert participant is not None and participant.get("is_default_profile") == "true"
    used = {t.text for t in participant.iterfind(".//dds:userTransports/dds:transport_id", NS)}
    declared = {t.findtext("dds:transport_id", namespaces=NS) for t in root.iter()
                if t.tag.endswith("transport_descriptor")}  # fmt: skip
    assert used == declared and len(used) == 2  # shared memory, and UDP for discovery


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, str(LARGE_DATA_PROFILE)),
        ({"RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}, str(LARGE_DATA_PROFILE)),
        ({"RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}, None),  # not Fast DDS: untouched
        ({"FASTDDS_DEFAULT_PROFILES_FILE": "/etc/mine.xml"}, None),  # the user's own wins
        ({"FASTRTPS_DEFAULT_PROFILES_FILE": "/etc/old.xml"}, None),
    ],
)
def test_the_profile_is_set_only_where_nothing_else_decides(
    env: dict[str, str], expected: str | None
) -> None:
    before = dict(env)
    assert use_large_data_profile(env) == expected
    if expected is None:
        assert env == before
    else:
        assert env == {**before, "FASTDDS_DEFAULT_PROFILES_FILE": expected}
