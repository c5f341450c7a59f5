"""The lighthouse dashboard rendered by a real headless Chromium.

1. A lighthouse and three real replica processes; one is SIGKILLed by its
   pid, the survivors go on, and a new incarnation of it rejoins behind and
   heals. The rendered page must chart every replica, format its numbers and
   show the death, the heal and the catch-up in its timeline.
2. A synthetic 64-replica job (``synthetic.py``): the page stays within the
   window's width at 1280 and 820 CSS pixels, shows every replica, switches
   the charts to a median in a min-max band, and marks a lighthouse restart
   (a new epoch) when ``/status`` changes under it.

Screenshots and the rendered DOM are saved under each test's ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lighthouse.clock import FakeClock
from lighthouse.coordinator.core import LighthouseCore
from lighthouse.coordinator.job_state import JobStateFile
from lighthouse.coordinator.status import LighthouseMetrics, StatusHTTPServer
from tests.browser.chromium import Chromium
from tests.browser.synthetic import CONFIG, synthetic_status, wall_clock_for
from tests.integration.lh_fixtures import Proc, lighthouse, processes

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

# Everything the assertions read from the rendered page, in one evaluation.
PAGE_SUMMARY_JS = """(() => {
  const q = s => [...document.querySelectorAll(s)];
  const err = document.getElementById("err");
  return {
    rendered: Number(document.body.dataset.rendered || 0),
    epoch: document.getElementById("epoch").textContent,
    charts: q("svg.chart").length,
    series: q("svg.chart path.series").map(p => ({id: p.dataset.replicaId, points: Number(p.dataset.points)})),
    bands: q("svg.chart path.band").length,
    sparklines: q(".replica svg.spark path").length,
    tiles: q(".replica").map(t => ({id: t.dataset.replicaId, status: t.dataset.status})),
    timeline: q("#timeline li").map(li => ({kind: li.dataset.kind, ids: li.dataset.replicaIds.split(" "), text: li.textContent,
      heal: li.querySelector(".heal-figures") && [...li.querySelectorAll(".heal-figures span")].map(x => x.textContent)})),
    text: document.body.innerText,
    pageWidth: document.documentElement.scrollWidth,
    viewWidth: document.documentElement.clientWidth,
    error: err.hidden ? null : err.textContent,
  };
})()"""

RAW_FLOAT = re.compile(r"\d\.\d{4,}")  # e.g. 10.25439200020628: never shown unformatted


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``pred`` every 0.1 s for at most ``timeout_s`` seconds (a condition wait)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def replica_args(lighthouse_addr: str, replica_id: str, step_ms: float) -> list[str]:
    return [
        "-m",
        "tests.browser.replica",
        "--lighthouse",
        lighthouse_addr,
        "--replica-id",
        replica_id,
        "--step-ms",
        str(step_ms),
    ]


def samples(status: dict[str, Any], replica_id: str) -> int:
    for series in status["history"]["replicas"]:
        if series["replica_id"] == replica_id:
            return len(series["step"])
    return 0


def timeline_has(status: dict[str, Any], kind: str, replica_id: str) -> bool:
    return any(
        e["kind"] == kind and replica_id in e["replica_ids"] + e["joined"] + e["left"]
        for e in status["history"]["timeline"]
    )


def render(
    chromium: Chromium, url: str, out: Path, name: str, min_renders: int = 1
) -> dict[str, Any]:
    """Open ``url``, wait for ``min_renders`` refreshes, save a screenshot and the DOM."""
    chromium.navigate(url)
    chromium.wait_for(f"Number(document.body.dataset.rendered || 0) >= {min_renders}", 30)
    page: dict[str, Any] = chromium.evaluate(PAGE_SUMMARY_JS)
    png = chromium.screenshot(out / f"{name}.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "an empty screenshot"
    dom = chromium.evaluate("document.documentElement.outerHTML")
    (out / f"{name}.html").write_text(str(dom), encoding="utf-8")
    return page


def assert_readable(page: dict[str, Any]) -> None:
    assert page["error"] is None, page["error"]
    assert page["charts"] == 2
    assert not RAW_FLOAT.findall(page["text"]), RAW_FLOAT.findall(page["text"])[:5]
    assert page["pageWidth"] <= page["viewWidth"], (
        f"the page is {page['pageWidth']} px wide in a {page['viewWidth']} px window"
    )


def test_a_killed_replica_and_its_rejoin_show_in_the_rendered_dashboard(
    chromium_path: str, tmp_path: Path
) -> None:
    first = ["g0:1", "g1:1", "g2:1"]
    with lighthouse(min_replicas=2, join_timeout_ms=1000, http_bind="127.0.0.1:0") as lh:
        addr, url = lh.address(), lh.http_address()
        assert url is not None
        args = [replica_args(addr, rid, ms) for rid, ms in zip(first, (100, 130, 160), strict=True)]
        with processes(*args) as procs:
            for p in procs:
                p.wait_event(lambda ev: ev.get("event") == "quorum" and ev["size"] == 3, 60)
            wait_until(
                lambda: all(samples(lh.status(), rid) >= 3 for rid in first),
                30,
                "three step samples of every replica",
            )
            os.kill(procs[0].popen.pid, signal.SIGKILL)
            assert procs[0].popen.wait(timeout=10) == -signal.SIGKILL
            for p in procs[1:]:
                p.wait_event(lambda ev: ev.get("event") == "quorum" and ev["size"] == 2, 30)
            rejoined = Proc(replica_args(addr, "g0:2", 100))
            procs.append(rejoined)  # stopped by pid with the others
            heal = rejoined.wait_event(lambda ev: ev.get("healed_from") is not None, 60)
            assert heal["healed_from"] == 0 and heal["step"] > 0
            wait_until(
                lambda: (
                    timeline_has(lh.status(), "caught_up", "g0:2")
                    and samples(lh.status(), "g0:2") >= 3
                ),
                30,
                "g0:2 caught up, with three step samples",
            )
            with Chromium(chromium_path, tmp_path / "profile", 1280, 900) as chromium:
                page = render(chromium, url, tmp_path, "dashboard_kill_rejoin")
    assert_readable(page)
    lines = {s["id"]: s["points"] for s in page["series"]}
    for rid in [*first, "g0:2"]:  # the killed one keeps its line up to its death
        assert lines.get(rid, 0) >= 2, (rid, lines)
    assert len(page["series"]) == 2 * 4  # one line per replica in each of the two charts
    tiles = {t["id"]: t["status"] for t in page["tiles"]}
    assert {tiles.get(r) for r in ("g1:1", "g2:1", "g0:2")} == {"ok"}, tiles
    assert tiles.get("g0:1") == "dead", tiles
    kinds = {(e["kind"], rid) for e in page["timeline"] for rid in e["ids"]}
    assert ("death", "g0:1") in kinds, page["timeline"]
    assert ("quorum", "g0:1") in kinds  # the survivors' quorum lists it as left
    assert ("quorum", "g0:2") in kinds  # ... and the next one as joined
    assert ("heal", "g0:2") in kinds and ("caught_up", "g0:2") in kinds
    # the rejoined replica reported its (simulated) heal: 1,234,567,890 bytes in 0.42 s
    caught_up = next(e for e in page["timeline"] if e["kind"] == "caught_up")
    assert caught_up["heal"] == ["1.23 GB", "0.42 s", "2.94 GB/s"], caught_up
    assert "its heal received 1.23 GB in 0.42 s (2.94 GB/s)" in caught_up["text"]
    death = next(e for e in page["timeline"] if e["kind"] == "death")
    assert "liveness stream closed" in death["text"]
    assert re.search(r"\d+(\.\d+)? (ms|s)\b", page["text"]), "no durations with units"
    assert re.search(r"\d+(\.\d+)? steps/s", page["text"]), "no step rates with units"


@contextmanager
def serve(snapshot: Callable[[], dict[str, Any]]) -> Iterator[str]:
    """A status server answering ``snapshot()``; yields its URL."""
    server = StatusHTTPServer(("127.0.0.1", 0), snapshot, LighthouseMetrics())
    try:
        yield f"http://127.0.0.1:{server.port}/"
    finally:
        server.shutdown()


def test_64_replicas_stay_readable_and_a_new_epoch_is_marked(
    chromium_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    minutes = 5.0
    # stamp events with the simulated wall time, so they line up with the step samples
    wall = wall_clock_for(clock, int(time.time() * 1000), minutes)
    monkeypatch.setattr("lighthouse.coordinator.core._unix_ms", wall)
    job = synthetic_status(replicas=64, minutes=minutes, clock=clock)
    assert len(job.replica_ids) == 64
    json.dumps(job.status)  # what /status serves must be JSON
    current = {"status": job.status}
    with (
        serve(lambda: current["status"]) as url,
        Chromium(chromium_path, tmp_path / "profile", 1280, 900) as chromium,
    ):
        wide = render(chromium, url, tmp_path, "dashboard_64_wide")
        chromium.set_viewport(820, 900)
        narrow = render(chromium, url, tmp_path, "dashboard_64_narrow")
        # A restarted lighthouse: a new epoch, the job's step restored from its file.
        state = JobStateFile(tmp_path / "lighthouse.state.json")
        state.record(int(job.status["committed_step"]))
        state.flush()
        restarted = synthetic_restart(state, clock)
        current["status"] = restarted
        chromium.wait_for("document.querySelector('#timeline li.epoch-break')", 20)
        after = chromium.evaluate(PAGE_SUMMARY_JS)
        chromium.screenshot(tmp_path / "dashboard_new_epoch.png")
    for page in (wide, narrow):
        assert_readable(page)
        tiles = {t["id"]: t["status"] for t in page["tiles"]}
        expected = {*job.replica_ids, job.killed}  # the dead one while its line is in the window
        assert set(tiles) == expected, sorted(set(tiles) ^ expected)
        assert tiles[job.silent] == "silent" and tiles[job.killed] == "dead"
        assert page["bands"] == 2  # aggregated: a min-max band and a median per chart
        assert [s["id"] for s in page["series"]] == ["median", "median"]
        assert min(s["points"] for s in page["series"]) >= 100  # 5 min at one point per 2 s
        assert page["sparklines"] == 65
        kinds = {(e["kind"], rid) for e in page["timeline"] for rid in e["ids"]}
        assert ("death", job.killed) in kinds and ("heal", job.restarted) in kinds
    assert after["epoch"] == restarted["epoch"]
    texts = [e["text"] for e in after["timeline"]]
    assert any("restarted: epoch" in t for t in texts), texts[:5]
    assert any("restored from the state file" in t for t in texts), texts[:5]
    assert any(job.killed in e["ids"] for e in after["timeline"]), "the old epoch's events are kept"


def synthetic_restart(state: JobStateFile, clock: FakeClock) -> dict[str, Any]:
    """The ``/status`` of a lighthouse just restarted with ``state``: no quorum yet."""
    core = LighthouseCore(CONFIG, clock, "0dd0e90c0002", LighthouseMetrics(), state)
    return core.snapshot()
