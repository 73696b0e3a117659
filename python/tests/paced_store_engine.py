"""An engine beside a `wsync inference-agent --paced` sidecar: it maps the
agent's weight store (shared memory) and reads its weights flat out, asking
for updates with wsync.StoreVersions.update() between some reads. For each
read it records the version update() said the weights hold and a digest of
every tensor before and after (DIR/paced-engine-<rank>.json, as
paced_engine.py does), for the test to check against the trainer's state.

    python python/tests/paced_store_engine.py --store /wsync-JOB-infer-R --rank R --out DIR [--until V]
"""

import argparse
import hashlib
import json
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from paced_engine import States  # noqa: E402

import wsync  # noqa: E402


class StoreTensors:
    """The store's tensors as byte views, from the layout it carries
    (inference_agent/weight_store_format.h)."""

    def __init__(self, name):
        path = "/dev/shm/" + name.lstrip("/")
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        word = lambda at: int.from_bytes(self.map[at:at + 8], "little")  # noqa: E731
        layout = json.loads(self.map[word(24):word(24) + word(32)])
        regions = {r["id"]: r["offset"] for r in layout["regions"]}
        self.places = {t["name"]: (regions[t["region"]] + t["offset"], t["bytes"]) for t in layout["tensors"]}

    def items(self):
        for name, (at, n) in self.places.items():
            yield name, self.map[at:at + n]


def digest_bytes(tensors):
    return {n: hashlib.sha256(b).hexdigest() for n, b in tensors.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--until", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()

    deadline = time.monotonic() + 60
    while not os.path.exists("/dev/shm/" + args.store.lstrip("/")):
        assert time.monotonic() < deadline, f"no store {args.store}"
        time.sleep(0.05)
    while True:
        try:
            versions = wsync.StoreVersions(args.store)
            break
        except ValueError:  # not complete yet
            assert time.monotonic() < deadline
            time.sleep(0.05)
    tensors = StoreTensors(args.store)
    states = States(lambda store: digest_bytes(dict(store.items())))
    passes, updates, errors = [], [], []
    held, n, start = versions.complete_version, 0, time.monotonic()
    while time.monotonic() - start < args.seconds:
        before = states.key(tensors)
        time.sleep(0.002)  # "computing" from them
        after = states.key(tensors)
        passes.append({"version": held, "before": before, "after": after})
        if held >= args.until:
            break  # one pass on the last version, then done
        n += 1
        if n % 2:
            continue
        t0 = time.perf_counter()
        try:
            held = versions.update(timeout=60)
        except (wsync.VersionError, TimeoutError) as e:
            errors.append({"type": type(e).__name__, "error": str(e)})
            break
        updates.append({"version": held, "seconds": time.perf_counter() - t0, "wait_seconds": 0.0,
                        "copy_seconds": 0.0})
    with open(os.path.join(args.out, f"paced-engine-{args.rank}.json"), "w") as f:
        json.dump({"passes": passes, "states": states.by_key, "updates": updates, "errors": errors, "held": held}, f)
    print(f"store engine {args.rank}: {len(passes)} reads, {len(updates)} updates, holding version {held}", flush=True)


if __name__ == "__main__":
    main()
