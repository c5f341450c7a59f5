"""The lighthouse dashboard rendered by a real headless Chromium.

1. A lighthouse and three real replica processes; one is SIGKILLed by its
   pid, the survivors go on, and a new incarnation of it rejoins behind and
   heals. The rendered page must chart every replica, format its numbers and
   show the death, the heal and the catch-up in its timeline.
2. A straggler: three real replica processes, one working five times as long
   per step. The rendered page must show it quarantined with the reason (its
   work per step against the others', in ms) and its work against the job's,
   and the quarantine in the timeline; once it works as fast as the others it
   is let back in after its quarantine, and a second render shows it ok.
3. A synthetic 64-replica job (``synthetic.py``): the page stays within the
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
    tiles: q(".replica").map(t => ({id: t.dataset.replicaId, status: t.dataset.status, title: t.title,
      reason: t.querySelector(".reason") && t.querySelector(".reason").textContent,
      work: [...t.querySelectorAll(".row[data-busy] span")].map(x => x.textContent)})),
    timeline: q("#timeline li").map(li => ({kind: li.dataset.kind, ids: li.dataset.replicaIds.split(" "), text: li.textContent,
      heal: li.querySelector(".heal-figures") && [...li.querySelectorAll(".heal-figures span")].map(x => x.textContent)})),
    text: document.body.innerText,
    // what a person reads beyond the body's text: chart labels and every tooltip
    svgText: q("svg text").map(t => t.textContent),
    tooltips: q("[title]").map(e => e.getAttribute("title")).concat(q("svg title").map(t => t.textContent)),
    yLabels: q("svg.chart text.y-label").map(t => ({chart: t.closest(".chart-box").id, text: t.textContent})),
    xLabels: q("svg.chart text.x-label").map(t => t.textContent),
    cards: q(".card").map(c => ({k: c.querySelector(".k").textContent, v: c.querySelector(".v").textContent})),
    tileRows: q(".replica").map(t => [...t.querySelectorAll(".row:not([data-busy]) span")].map(x => x.textContent)),
    memberCells: q("#members tbody tr").map(tr => [...tr.cells].map(td => td.textContent)),
    // tiles whose content is wider than the tile (it runs over the tile's border)
    overflowing: q(".replica").filter(t => t.scrollWidth > t.clientWidth).map(t => t.dataset.replicaId),
    pageWidth: document.documentElement.scrollWidth,
    viewWidth: document.documentElement.clientWidth,
    error: err.hidden ? null : err.textContent,
  };
})()"""

RAW_FLOAT = re.compile(r"\d\.\d{4,}")  # e.g. 10.25439200020628: never shown unformatted
# A number as the page writes one: thousands separated, at most 3 decimals.
NUMBER = r"-?\d{1,3}(?:,\d{3})*(?:\.\d{1,3})?"
UNIT = r"(?:ns|µs|ms|s|min|h|steps/s|steps/min|steps/h|[kMGTPE]?B(?:/s)?)"
# A quantity: a number and its unit ("1.23 GB", "2 min 5 s"; a ratio ends in the times
# sign, U+00D7), or none known.
QUANTITY = re.compile(rf"^(?:—|{NUMBER} {UNIT}(?: \d+ (?:s|min))?|{NUMBER}\u00d7)$")
AXIS_Y = {
    "chart-rate": re.compile(rf"^{NUMBER}/(?:s|min|h)$"),
    "chart-time": re.compile(rf"^{NUMBER} {UNIT}(?: \d+ (?:s|min))?$"),
}
AXIS_X = re.compile(rf"^(?:now|\d+ s ago|{NUMBER} min ago)$")
COUNT = re.compile(r"^(?:—|\d{1,3}(?:,\d{3})*)$")
COUNT_CARDS = {
    "members",
    "live replicas",
    "committed step",
    "rounds issued",
    "deaths (timeline)",
    "heals (timeline)",
    "quarantines",
    "corruption findings (timeline)",
}
# A decimal number and what follows it, in any text; addresses are taken out first. A
# ratio ends in the times sign, or in "x" in the lighthouse's own words (its reasons,
# plain ASCII as in its log: "straggler: 200 ms ... against the others' 40 ms (5.0x, ...)").
DECIMAL = re.compile(r"(\d+\.\d+)(\s?\S*)")
ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
DECIMAL_UNIT = re.compile(rf"^\s?(?:{UNIT}|\u00d7|/s|/min|/h)(?:\W|$)|^x(?:\W|$)")


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
    chromium: Chromium,
    url: str,
    out: Path,
    name: str,
    min_renders: int = 1,
    until_js: str = "true",
) -> dict[str, Any]:
    """Open ``url``, wait for ``min_renders`` refreshes and ``until_js`` (the page
    refreshes itself every 2 s), save a screenshot and the DOM."""
    chromium.navigate(url)
    chromium.wait_for(
        f"Number(document.body.dataset.rendered || 0) >= {min_renders} && ({until_js})", 30
    )
    page: dict[str, Any] = chromium.evaluate(PAGE_SUMMARY_JS)
    png = chromium.screenshot(out / f"{name}.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, "an empty screenshot"
    dom = chromium.evaluate("document.documentElement.outerHTML")
    (out / f"{name}.html").write_text(str(dom), encoding="utf-8")
    return page


def assert_readable(page: dict[str, Any]) -> None:
    assert page["error"] is None, page["error"]
    assert page["charts"] == 2
    assert_numbers_carry_units(page)
    assert page["pageWidth"] <= page["viewWidth"], (
        f"the page is {page['pageWidth']} px wide in a {page['viewWidth']} px window"
    )
    assert not page["overflowing"], (
        f"tiles whose text runs over their border: {page['overflowing']}"
    )


def assert_numbers_carry_units(page: dict[str, Any]) -> None:
    """Every number a person reads has at most 3 decimals, and every quantity its unit:
    the page's text, chart labels and tooltips, then each place that shows a quantity."""
    texts = [page["text"], *page["svgText"], *page["tooltips"]]
    raw = [m for t in texts for m in RAW_FLOAT.findall(t)]
    assert not raw, f"unformatted numbers: {raw[:5]}"
    bare = [
        f"{m[1]}{m[2]}"
        for t in texts
        for m in DECIMAL.finditer(ADDRESS.sub("", t))
        if not DECIMAL_UNIT.match(m[2])
    ]
    assert not bare, f"numbers without a unit: {bare[:5]}"
    for label in page["yLabels"]:
        assert AXIS_Y[label["chart"]].match(label["text"]), label
    assert len(page["yLabels"]) == 10  # five per chart
    for label in page["xLabels"]:
        assert AXIS_X.match(label), label
    for card in page["cards"]:
        form = COUNT if card["k"] in COUNT_CARDS else QUANTITY
        assert form.match(card["v"]), card
    for tile in page["tiles"]:  # a replica that reports its work per step: "work", "X / job Y"
        if tile["work"]:
            label, work = tile["work"]
            mine, _, job = work.partition(" / job ")
            assert label == "work" and QUANTITY.match(mine) and (not job or QUANTITY.match(job)), (
                tile
            )
    for row in page["tileRows"]:  # status, step, rate, step time, "seen ... ago" or "gone"
        _, _, rate, step_time, seen = row
        assert QUANTITY.match(rate) and QUANTITY.match(step_time.rstrip("*")), row
        assert seen == "gone" or QUANTITY.match(seen.removeprefix("seen ").removesuffix(" ago")), (
            row
        )
    for cells in page["memberCells"]:  # ..., step time, manager, store, world size, last seen
        step_time, last_seen = cells[3], cells[7]
        assert QUANTITY.match(step_time), cells
        assert last_seen == "dead" or QUANTITY.match(last_seen.removesuffix(" ago")), cells


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
    assert page["tileRows"] and page["memberCells"]  # the checks above had rows to check


STRAGGLER_WINDOW = 8  # steps of work per step the detector needs of every member
STRAGGLER_REASON = re.compile(
    rf"^straggler: (\d+) ms of work per step against the others' (\d+) ms "
    rf"\((\d+\.\d)x, over {STRAGGLER_WINDOW} steps\)$"
)
WORK = re.compile(r"^(\d+(?:\.\d+)?) ms / job (\d+(?:\.\d+)?) ms$")  # a tile's work row


def tile_of(page: dict[str, Any], replica_id: str) -> dict[str, Any]:
    tile: dict[str, Any] = next(t for t in page["tiles"] if t["id"] == replica_id)
    return tile


def tile_status_is(replica_id: str, status: str) -> str:
    """JavaScript: the tile of ``replica_id`` is shown with ``status``."""
    return (
        f"(document.querySelector('.replica[data-replica-id=\"{replica_id}\"]') || {{dataset: {{}}}})"
        f".dataset.status === '{status}'"
    )


def test_a_straggler_is_shown_quarantined_with_its_reason_and_comes_back_ok(
    chromium_path: str, tmp_path: Path
) -> None:
    fast, slow = ["g0:1", "g1:1"], "g2:1"
    with lighthouse(
        min_replicas=2,
        join_timeout_ms=1000,
        http_bind="127.0.0.1:0",
        straggler_window=STRAGGLER_WINDOW,
        quarantine_base_ms=8000,  # long enough to render the page while it is held
    ) as lh:
        addr, url = lh.address(), lh.http_address()
        assert url is not None
        args = [replica_args(addr, rid, 40) for rid in fast]
        # five times the others' work per step, until a SIGUSR1 brings it to their pace
        args.append([*replica_args(addr, slow, 200), "--then-step-ms", "40", "--timeout-s", "30"])
        with (
            processes(*args) as procs,
            Chromium(chromium_path, tmp_path / "profile", 1280, 900) as chromium,
        ):
            wait_until(
                lambda: any(q["replica_id"] == slow for q in lh.status()["quarantined"]),
                60,
                f"{slow} quarantined as a straggler",
            )
            held = render(
                chromium,
                url,
                tmp_path,
                "dashboard_straggler_held",
                until_js=tile_status_is(slow, "quarantined"),
            )
            os.kill(procs[2].popen.pid, signal.SIGUSR1)  # from now on it keeps pace
            # it says so after its held ask returns, taken back in once its quarantine ends
            procs[2].wait_event(lambda ev: ev.get("event") == "step_ms", 60)
            procs[2].wait_event(lambda ev: ev.get("event") == "quorum" and ev["size"] == 3, 30)

            def judged_at_pace() -> bool:
                # a whole new window of its work per step is in, and it was not held again
                status = lh.status()
                return slow in status["stragglers"]["median_busy_ms"] and not status["quarantined"]

            wait_until(judged_at_pace, 60, f"a full window of {slow}'s steps at the others' pace")
            back = render(
                chromium,
                url,
                tmp_path,
                "dashboard_straggler_back",
                until_js=tile_status_is(slow, "ok"),
            )
            status = lh.status()
    # held: its tile says quarantined, why (its work per step against the others', in
    # ms), and its work against the job's; the others are ok; the timeline has it
    assert_readable(held)
    tile = tile_of(held, slow)
    assert tile["status"] == "quarantined", tile
    reason = STRAGGLER_REASON.match(tile["reason"] or "")
    assert reason is not None, tile
    busy, others, ratio = int(reason[1]), int(reason[2]), float(reason[3])
    assert busy >= 150 and others < 120 and ratio >= 1.5, tile  # about 200 ms against 40 ms
    assert len(tile["work"]) == 2 and tile["work"][0] == "work", tile
    work = WORK.match(tile["work"][1])
    assert work is not None and float(work[1]) > 1.5 * float(work[2]), tile
    remaining = rf"quarantined {NUMBER} (?:ms|s) more \({re.escape(tile['reason'])}\)"
    assert re.search(remaining, tile["title"]), tile
    assert f"against the job's {work[2]} ms" in tile["title"], tile
    assert {tile_of(held, rid)["status"] for rid in fast} == {"ok"}, held["tiles"]
    shown = [e for e in held["timeline"] if e["kind"] == "quarantine" and slow in e["ids"]]
    assert len(shown) == 1 and f"(strike 1): {tile['reason']}" in shown[0]["text"], shown
    # back: ok, its work at the others' pace, no reason; the quarantine stays on record
    assert_readable(back)
    again = tile_of(back, slow)
    assert again["status"] == "ok" and again["reason"] is None, again
    work = WORK.match(again["work"][1]) if len(again["work"]) == 2 else None
    assert work is not None and float(work[1]) < 1.5 * float(work[2]), again
    assert {tile_of(back, rid)["status"] for rid in fast} == {"ok"}, back["tiles"]
    assert [e["kind"] for e in back["timeline"] if slow in e["ids"]].count("quarantine") == 1
    assert {m["replica_id"] for m in status["quorum"]["members"]} == {*fast, slow}
    assert [q["strikes"] for q in status["recent_quarantines"]] == [1], status["recent_quarantines"]
    # it was taken back in with both others: no quorum since left a fast one out
    events = status["history"]["timeline"]
    since = next(i for i, e in enumerate(events) if e["kind"] == "quarantine")
    left = [e["text"] for e in events[since:] if e["kind"] == "quorum" and set(e["left"]) & {*fast}]
    assert not left, left


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
        assert ("integrity", job.corrupt) in kinds
        cards = {c["k"]: c["v"] for c in page["cards"]}
        assert cards["corruption findings (timeline)"] == "1"
    assert after["epoch"] == restarted["epoch"]
    texts = [e["text"] for e in after["timeline"]]
    assert any("restarted: epoch" in t for t in texts), texts[:5]
    assert any("restored from the state file" in t for t in texts), texts[:5]
    assert any(job.killed in e["ids"] for e in after["timeline"]), "the old epoch's events are kept"


def synthetic_restart(state: JobStateFile, clock: FakeClock) -> dict[str, Any]:
    """The ``/status`` of a lighthouse just restarted with ``state``: no quorum yet."""
    core = LighthouseCore(CONFIG, clock, "0dd0e90c0002", LighthouseMetrics(), state)
    return core.snapshot()


# The page's own formatters over 22 decades (1e-9 to 1e12, and 0), as the page calls them.
FORMATTERS_JS = """(() => {
  const xs = [0];
  for (let k = -9; k <= 12; k++) for (const m of [1, 1.234567, 4.99999, 9.87654]) xs.push(m * 10 ** k);
  const out = [];
  for (const x of xs) {
    out.push(["time", x, fmt.ms(x)], ["time", x, fmt.secs(x)], ["time", x, fmt.heal_s(x)],
      ["ago", x, fmt.ago(x)], ["rate", x, fmt.rate(x)], ["bytes", x, fmt.bytes(Math.round(x))],
      ["bytes/s", x, fmt.bytesPerS(x)], ["axis", x, fmt.rateAxis(x, x)], ["axis", x, fmt.rateAxis(x, 4 * x)]);
  }
  return out;
})()"""
TIME = rf"{NUMBER} (?:ns|µs|ms|s|min|h)(?: \d+ (?:s|min))?"
FORMS = {
    "time": re.compile(rf"^{TIME}$"),
    "ago": re.compile(rf"^{TIME} ago$"),
    "rate": re.compile(rf"^{NUMBER} steps/(?:s|min|h)$"),
    "bytes": re.compile(rf"^{NUMBER} [kMGTPE]?B$"),
    "bytes/s": re.compile(rf"^{NUMBER} [kMGTPE]?B/s$"),
    "axis": AXIS_Y["chart-rate"],
}


def test_every_number_format_has_its_unit_and_at_most_three_decimals(
    chromium_path: str, tmp_path: Path
) -> None:
    """Durations, step rates, bytes and heal rates from 1e-9 to 1e12 of their unit, and
    0: each comes out as a number with at most 3 decimals and its unit (a value too
    small for its unit moves to a smaller one), never as a raw float."""
    job = synthetic_status(replicas=8, minutes=1.0, clock=FakeClock())
    with (
        serve(lambda: job.status) as url,
        Chromium(chromium_path, tmp_path / "profile", 1280, 900) as chromium,
    ):
        assert_readable(render(chromium, url, tmp_path, "dashboard_8"))
        outputs: list[list[Any]] = chromium.evaluate(FORMATTERS_JS)
    assert len(outputs) == 89 * 9
    bad = [(form, x, text) for form, x, text in outputs if not FORMS[form].match(text)]
    assert not bad, f"{len(bad)} formatted values without their unit or with 4+ decimals: {bad[:8]}"
