"""The one constraint reading (vLLM's `structured_outputs` shape) in GraphPipe's config
and Evergreen's GENERATE config, checked by the one validation, without an engine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from app.engine.constraints import Constraint
from app.errors import InvalidRequest
from app.protocols.graphpipe.config import parse_config
from tests.evergreen_frames import INFO, plan
from tests.fake_engine import FakeEngine

FAKE = FakeEngine().info


def test_graphpipe_config_carries_a_constraint() -> None:
    config = parse_config(json.dumps({"constraint": {"choice": ["yes", "no"]}}).encode())
    assert config.constraint == Constraint("choice", ("yes", "no"), "config.constraint.choice")


@pytest.mark.parametrize(
    ("constraint", "param"),
    [
        ({}, "config.constraint"),
        ([1], "config.constraint"),
        ({"regex": 1}, "config.constraint.regex"),
        ({"json": "{no"}, "config.constraint.json"),
    ],
)
def test_graphpipe_bad_constraints_name_the_field(constraint: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_config(json.dumps({"constraint": constraint}).encode())
    assert caught.value.param == param


def test_evergreen_config_carries_a_constraint() -> None:
    info = replace(INFO, check_constraint=FAKE.check_constraint)
    planned = plan({"maxTokens": 5, "constraint": {"regex": "[0-9]+"}}, info=info)
    assert planned.sampling.constraint == Constraint("regex", "[0-9]+", "constraint.regex")
    with pytest.raises(InvalidRequest) as caught:
        plan({"constraint": {"regex": "UNCOMPILABLE"}}, info=info)
    assert caught.value.param == "constraint.regex"


def test_evergreen_refuses_constraints_where_the_engine_has_none() -> None:
    with pytest.raises(InvalidRequest):
        plan({"constraint": {"choice": ["a"]}})
