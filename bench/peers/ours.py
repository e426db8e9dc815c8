"""databus's side of the throughput comparison, in a process of its own (for its RSS).

``bench.binlog_decode.run_databus`` (``MysqlSource.read`` appending every window to an
``EventBuffer``: the relay's whole capture path) over a binlog range of a running
server, ``--repeat`` times, with an ``EventBuffer`` of ``--buffer-mb``; prints
``RESULT {json}``: events, the best time, peak RSS (the buffer's pages included).

    .venv/bin/python -m bench.peers.ours --port P --start SCN --end SCN [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

from tests.support.mariadb import MariaDB

from bench import binlog_decode
from databus.buffer import EventBuffer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--end", type=int, required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--buffer-mb", type=int, default=256,
                    help="the EventBuffer's capacity (binlog_decode's own: 1024)")
    args = ap.parse_args()
    capacity = args.buffer_mb << 20

    def buffer(_size: int) -> EventBuffer:
        return EventBuffer(capacity)

    binlog_decode.EventBuffer = buffer  # type: ignore[assignment,misc]
    server = MariaDB(Path("/nonexistent"), port=args.port)  # only its URL is used
    runs = [binlog_decode.run_databus(server, args.start, args.end)
            for _ in range(args.repeat)]
    events = runs[0][0]
    assert all(n == events for n, _ in runs), runs
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT " + json.dumps({"events": events, "seconds": [s for _, s in runs],
                                  "best_s": min(s for _, s in runs), "peak_rss_kb": peak_kb,
                                  "buffer_mb": args.buffer_mb}))


if __name__ == "__main__":
    main()
