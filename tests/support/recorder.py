"""A consumer process that records every window it completes, for e2e checks.

Each completed window is appended to ``--out`` as one JSON line
``{"scn": S, "events": [[table, op, key], ...]}`` *before* the client persists
the checkpoint, so a crash can repeat a window in the file (at-least-once) but
never lose one. A line cut by a crash has no newline and is ignored.

    python -m tests.support.recorder --relay URL --out FILE --checkpoint FILE
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from typing import Any

from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore


def event_key_text(key: int | bytes) -> str:
    return json.dumps(key if isinstance(key, int) else json.loads(key))


class Recorder(Consumer):
    def __init__(self, path: str, owner: dict[str, Any] | None = None) -> None:
        """``owner``: a group member's partition, name and epoch, written with each
        window (to check that no partition had two owners at once)."""
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.owner = owner or {}
        self.current: list[list[Any]] = []

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.current = []

    def on_data_event(self, event: Any) -> None:
        table = event.source.split(".", 1)[1]
        self.current.append([table, event.op.letter, event_key_text(event.key)])

    def on_end_data_event_sequence(self, scn: int) -> None:
        line = json.dumps({"scn": scn, "events": self.current, **self.owner}) + "\n"
        os.write(self.fd, line.encode())  # one write: whole line or (crash) a cut line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--relay", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--group", help="zk://HOST:PORT/GROUP: record as a dynamic group member")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--member-id")
    ap.add_argument("--sources", default="")
    args = ap.parse_args()
    if args.group:
        from databus.client.membership import DynamicGroup, Ownership

        def recorder(o: Ownership) -> Recorder:
            return Recorder(args.out, {"p": o.partition, "owner": o.member, "epoch": o.epoch})

        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def note(**what: Any) -> None:  # in the same file as the windows, in time order
            os.write(fd, (json.dumps({"member": args.member_id, **what}) + "\n").encode())

        class Listener:
            def on_partitions_assigned(self, partitions: list[int]) -> None:
                note(assigned=partitions)

            def on_partitions_revoked(self, partitions: list[int]) -> None:
                note(revoked=partitions)

        note(joined=True)

        cfg = ClientConfig(relay=args.relay, poll_timeout=1.0,
                           sources=args.sources.split(","))
        # the partitions' checkpoints are files every member reads: a shared store
        DynamicGroup(args.group, cfg, partitions=args.partitions, consumer_factory=recorder,
                     store_factory=lambda p: FileCheckpointStore(f"{args.checkpoint}.p{p}"),
                     member_id=args.member_id, listener=Listener()).run(threading.Event())
        return
    client = DatabusClient(ClientConfig(relay=args.relay, poll_timeout=1.0),
                           Recorder(args.out), FileCheckpointStore(args.checkpoint))
    client.run()


if __name__ == "__main__":
    main()
