"""The dashboard page, assembled once from the package's ``lighthouse/static/`` files.

The page fetches ``/status`` every 2 s and redraws in place: numbers with
units, per-replica step rate and step time over the history window as charts,
a health tile per replica, the timeline of quorums, deaths, joins, heals,
quarantines and lighthouse starts, and why the next quorum waits.

It is served as one self-contained HTML document: ``index.html`` with
``dashboard.css`` and ``dashboard.js`` inlined where it says
``/* dashboard.css */`` and ``/* dashboard.js */``. The sources stay separate
files to edit; the browser needs one request and the page references no URL
but ``/status``.

Why the charts are inline SVG drawn by the page's own short script: the
lighthouse often runs where nothing outside the cluster can be reached, so
the page may load nothing from a CDN; a vendored charting library would add a
few hundred KB of third-party code to review and keep current, for what
amounts to polylines, one band and a few axis labels. SVG elements are also
plain DOM, so a test can count a chart's lines and points in a real browser.

Beyond 8 replicas the charts aggregate (median line in a min-max band) and
every replica keeps its own sparkline in its health tile, so 64 or 500
replicas stay readable.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["CONTENT_TYPE", "PATHS", "dashboard_page"]

PATHS = ("/", "/index.html")  # where the status server serves the page
CONTENT_TYPE = "text/html; charset=utf-8"
_INLINED = ("dashboard.css", "dashboard.js")


def dashboard_page() -> bytes:
    """The page with its style and script inlined (read from the package's resources).

    Raises ``ValueError`` naming the marker if ``index.html`` lacks one, so a
    broken edit of the page fails at start-up rather than serving a blank page.
    """
    static = resources.files("lighthouse").joinpath("static")
    page = static.joinpath("index.html").read_text(encoding="utf-8")
    for name in _INLINED:
        marker = f"/* {name} */"
        if page.count(marker) != 1:
            raise ValueError(
                f"lighthouse/static/index.html must contain the marker {marker!r} once, "
                f"found it {page.count(marker)} times"
            )
        page = page.replace(marker, static.joinpath(name).read_text(encoding="utf-8"))
    return page.encode("utf-8")
