"""How often the Apple kinds ask again while they wait (the agent's `[release_endpoints]`
poll_sec): their own intervals by default, the agent's when its config sets one (the demo's agents
against the local Apple service, whose processing takes seconds)."""

from __future__ import annotations

import tomllib
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from relevo_agent.config import ReleaseEndpoints
from relevo_agent.effects import registry
from relevo_agent.effects.app_store_upload import POLL_SEC
from relevo_core.models.effect import AppStoreUpload, Notarization

KEY = "relevo/local/_release/app/asc-key"
UPLOAD = AppStoreUpload(kind="app_store_upload", file="build/App.ipa", app_id="1", api_key=KEY)
NOTARIZE = Notarization(kind="notarization", file="build/App.zip", api_key=KEY)
PLAN = SimpleNamespace(aws_profile=None)


def _made(spec, endpoints: ReleaseEndpoints):
    return registry.KINDS[spec.kind](spec, PLAN, endpoints)


def test_without_a_poll_interval_each_kind_keeps_its_own():
    # Given an agent whose config names no poll interval
    endpoints = ReleaseEndpoints()

    # When the registry makes the two Apple kinds, then each asks again at its own interval
    assert _made(UPLOAD, endpoints).poll_sec == POLL_SEC == 30
    assert _made(NOTARIZE, endpoints).poll_sec == 15


def test_the_agents_poll_interval_is_given_to_both_apple_kinds():
    # Given an agent config's [release_endpoints] table with poll_sec = 1
    table = tomllib.loads('[release_endpoints]\napp_store_connect = "http://127.0.0.1:9"\npoll_sec = 1\n')
    endpoints = ReleaseEndpoints.model_validate(table["release_endpoints"])

    # When the registry makes the two Apple kinds, then both ask again every second
    assert _made(UPLOAD, endpoints).poll_sec == 1
    assert _made(NOTARIZE, endpoints).poll_sec == 1


@pytest.mark.parametrize("bad", [0, -1, 301])
def test_a_poll_interval_out_of_range_is_refused(bad: float):
    # Given a poll interval that is not a positive number of seconds up to five minutes (five
    # minutes itself is taken), when read, then the config is refused naming the key
    assert ReleaseEndpoints(poll_sec=300).poll_sec == 300
    with pytest.raises(ValidationError, match="poll_sec"):
        ReleaseEndpoints(poll_sec=bad)
