"""Wait until a vLLM server's /health answers 200: the rendered unit's ExecStartPost=, so that systemd calls
the service active only once the model is loaded, and the smoke companion starts against a ready server.

Run as `python -m deploykit.render.wait_health URL --timeout-s N`. Standard library only: it runs in the
service's sandbox, once per start.
"""

from __future__ import annotations

import argparse
import sys
import time

from deploykit import exit_codes
from deploykit.net import health_ok, redact_url

POLL_INTERVAL_S = 2.0


def wait_healthy(url: str, timeout_s: float, poll_interval_s: float = POLL_INTERVAL_S) -> float | None:
    """Seconds until healthy, or None when the deadline passed first."""
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if health_ok(url):
            return time.monotonic() - start
        if time.monotonic() + poll_interval_s > deadline:
            return None
        time.sleep(poll_interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploykit.render.wait_health", description=__doc__)
    parser.add_argument("url", help="the server's /health URL")
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--poll-interval-s", type=float, default=POLL_INTERVAL_S)
    args = parser.parse_args(argv)
    waited = wait_healthy(args.url, args.timeout_s, args.poll_interval_s)
    if waited is None:
        print(f"{redact_url(args.url)} did not answer 200 within {args.timeout_s:.0f} s", file=sys.stderr)
        return exit_codes.FAILED
    print(f"{redact_url(args.url)} healthy after {waited:.1f} s")
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
