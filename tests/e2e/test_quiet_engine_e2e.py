"""A paused engine is quiet on purpose, not hung: the real vLLM CPU build (development routes on), paused
with requests frozen in its queue (`/pause?mode=keep`), read by the canary's own page reader (issue 45).

The same pages judged without the pause (what the canary did before) say `hung` within the bound; with it,
the canary says nothing while vLLM confirms the pause on `/is_paused`, and the frozen request is answered
after `/resume`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.server_page import PageReader, ServerPage
from deploykit.canary.settings import CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from deploykit.tinymodel import build_tiny_model
from tests.vllm_harness import running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

BOUND_S = 4.0
"""A short hung bound, so that the paused minute is many bounds long."""
PAUSED_S = 20.0


def judge(url: str) -> Canary:
    config = CanaryConfig(
        endpoint=Endpoint(url),
        served_name="tiny",
        cases=[SmokeCase(kind="completion")],
        settings=CanarySettings(metrics_every_s=0, timeout_s=120),
        store=False,
        hung_after_s=BOUND_S,
    )
    return Canary(config)


def test_a_paused_engine_with_frozen_requests_is_not_hung(tmp_path: Path) -> None:
    model = build_tiny_model()
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    with running_vllm(tiny_serve_args(model), env=env, log_dir=tmp_path) as server:
        url = server.base_url
        aware, blind = judge(url), judge(url)
        reader = PageReader()
        pause = httpx.post(url + "/pause", params={"mode": "keep"}, timeout=60)
        assert pause.status_code == 200, pause.text
        # Each canary's own run is a request frozen in the paused engine's queue: it waits, as in a hang.
        runs = [threading.Thread(target=canary.run_once, daemon=True) for canary in (aware, blind)]
        for run in runs:
            run.start()
        pages: list[ServerPage] = []
        started = time.monotonic()
        while time.monotonic() - started < PAUSED_S:
            page = reader.read(aware.config.endpoint)
            pages.append(page)
            now = time.monotonic()
            aware.observe_progress(page.progress, now=now, paused=page.paused)
            blind.observe_progress(page.progress, now=now, paused=False)  # the same page, pause unseen
            time.sleep(0.5)
        assert all(page.read for page in pages), [page.problem for page in pages]
        assert sum(page.paused for page in pages) >= len(pages) - 2  # all but the first, unchanged, reads
        assert blind.state.status == "hung", blind.state.diagnosis  # without the pause: a false alarm
        assert aware.state.status == "starting", aware.state.diagnosis  # with it: nothing to say
        assert all(run.is_alive() for run in runs)  # the requests are still frozen
        resume = httpx.post(url + "/resume", timeout=60)
        assert resume.status_code == 200, resume.text
        for run in runs:
            run.join(120)
        assert aware.state.status == "healthy", aware.state.diagnosis  # answered once resumed
