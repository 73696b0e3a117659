#!/usr/bin/env python3
"""The controller under attack while a version runs (issue #29), loopback only.

Starts `wsync controller` with a job secret for the tiny world of
tests/cli/data/good (2 trainer + 2 inference ranks), registers every rank and
starts version 1 with signed requests made here. Then, from addresses other
than the agents' (127.0.0.2 and up, as hosts elsewhere would be):

  - 1,000 idle connections, opened again as soon as the controller closes one;
  - 80 slowloris clients, one byte of a request head a second;
  - a flood of unsigned 16 MiB registration bodies, 32 at a time.

All the while the four ranks send heartbeats every second and a signed
GET /v1/status goes out every 100 ms; every signed request's time to answer
is recorded. After --seconds of it, the ranks report the version done. The
last line printed is a JSON object with the figures; the exit status is 1 if
the version did not complete, the p99 of signed requests is over --p99-ms,
or the controller's peak RSS is over --rss-mb.

  python3 scripts/load_test.py [--wsync build/cli/wsync] [--seconds 20]

Only the standard library; the attackers run in a process of their own so
that their work does not delay the signed requests' clock.
"""
import argparse
import hashlib
import hmac
import http.client
import json
import multiprocessing
import os
import resource
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "cli", "data", "good")


def say(msg):
    print(f"load_test: {msg}", flush=True)


class Signed:
    """Signed requests (controller/auth.h's canonical request, written out
    here), each on its own connection as the agents make them."""

    def __init__(self, port, key, timeout=10):
        self.port, self.key, self.timeout = port, key, timeout
        self.latencies, self.failures = [], []
        self.lock = threading.Lock()

    def request(self, method, target, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        ts, nonce = str(int(time.time())), secrets.token_hex(16)
        digest = hashlib.sha256(data).hexdigest()
        canonical = "\n".join(["wsync-hmac-sha256-v1", method, target, ts, nonce, digest])
        headers = {"X-Wsync-Timestamp": ts, "X-Wsync-Nonce": nonce, "X-Wsync-Content-Sha256": digest,
                   "X-Wsync-Signature": hmac.new(self.key, canonical.encode(), hashlib.sha256).hexdigest(),
                   "Content-Type": "application/json"}
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            conn.request(method, target, body=data if body is not None else None, headers=headers)
            r = conn.getresponse()
            text = r.read()
            conn.close()
            status = r.status
        except OSError as e:
            status, text = None, str(e).encode()
        dt = time.monotonic() - t0
        with self.lock:
            self.latencies.append(dt)
            if status is None or status >= 500:
                self.failures.append(f"{method} {target}: {status} {text[:200]!r}")
        return status, text


# --- the attackers (a process of their own) --------------------------------

def attack(port, stop_at, idle_n, slow_n, flood_n, out):
    counts = {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    kinds = {}  # socket -> (kind, state)

    def connect(kind, src):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((src, 0))
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            return
        kinds[s] = {"kind": kind, "src": src, "sent": 0, "t": time.monotonic()}
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if kind == "flood" else 0)
        sel.register(s, events)
        counts[kind + "_connects"] = counts.get(kind + "_connects", 0) + 1

    def drop(s):
        info = kinds.pop(s)
        sel.unregister(s)
        s.close()
        return info

    # 1,000 idle connections over 8 addresses (125 each: under the cap per
    # address, so that they are accepted and must be timed out), slowloris
    # from one more, the flood from another.
    for i in range(idle_n):
        connect("idle", f"127.0.0.{2 + i % 8}")
    for i in range(slow_n):
        connect("slow", "127.0.0.10")
    for i in range(flood_n):
        connect("flood", "127.0.0.11")
    head = (b"POST /v1/register/inference HTTP/1.1\r\nHost: controller\r\nContent-Type: application/json\r\n"
            b"Content-Length: 16777216\r\n\r\n")
    chunk = b"\0" * 262144
    last_drip = time.monotonic()
    while time.monotonic() < stop_at:
        for key, events in sel.select(timeout=0.1):
            s = key.fileobj
            info = kinds.get(s)
            if info is None:
                continue
            if events & selectors.EVENT_READ:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if info["kind"] == "flood" and data:
                    counts["flood_answers"] = counts.get("flood_answers", 0) + 1
                    first = data.split(b"\r\n", 1)[0].decode(errors="replace")
                    counts.setdefault("flood_answer_lines", {}).setdefault(first, 0)
                    counts["flood_answer_lines"][first] += 1
                # Anything read ends the attempt (an answer) or the server
                # closed: open another one of the same kind.
                info = drop(s)
                connect(info["kind"], info["src"])
                continue
            if events & selectors.EVENT_WRITE and info["kind"] == "flood":
                try:
                    if info["sent"] == 0:
                        s.send(head)
                        info["sent"] = len(head)
                    else:
                        n = s.send(chunk)
                        info["sent"] += n
                        counts["flood_bytes_sent"] = counts.get("flood_bytes_sent", 0) + n
                        if info["sent"] >= len(head) + 16777216:
                            sel.modify(s, selectors.EVENT_READ)
                except BlockingIOError:
                    pass
                except OSError:
                    info = drop(s)
                    connect(info["kind"], info["src"])
        now = time.monotonic()
        if now - last_drip >= 1.0:
            last_drip = now
            for s, info in list(kinds.items()):
                if info["kind"] != "slow":
                    continue
                try:
                    s.send(b"GET /v1/status HTTP/1.1\r\n" if info["sent"] == 0 else b"X")
                    info["sent"] += 1
                except OSError:
                    drop(s)
                    connect("slow", "127.0.0.10")
    counts["open_at_end"] = len(kinds)
    out.put(counts)


# --- the controller and the version ----------------------------------------

def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wsync", default=os.path.join(ROOT, "build", "cli", "wsync"))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slowloris", type=int, default=80)
    ap.add_argument("--flood", type=int, default=32)
    ap.add_argument("--p99-ms", type=float, default=1000)
    ap.add_argument("--rss-mb", type=float, default=256)
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = tempfile.mkdtemp(prefix="wsync_load_")
    secret_file = os.path.join(work, "secret")
    with open(os.open(secret_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    key = open(secret_file, "rb").read().rstrip()
    log_path = os.path.join(work, "controller.log")
    say(f"starting {args.wsync} controller (log: {log_path})")
    log = open(log_path, "w")
    ctl = subprocess.Popen([args.wsync, "controller", "--trainers", "2", "--inference", "2",
                            "--mapping", os.path.join(DATA, "mapping.json"), "--listen", "127.0.0.1:0",
                            "--secret-file", secret_file, "--state-dir", os.path.join(work, "state"),
                            "--version-timeout", "600", "--heartbeat-timeout", "10"],
                           stdout=subprocess.PIPE, stderr=log, text=True)
    result = {"version_completed": False}
    try:
        first = ctl.stdout.readline().strip()
        port = int(first.rsplit(":", 1)[1])
        threading.Thread(target=lambda: [None for _ in ctl.stdout], daemon=True).start()
        api = Signed(port, key)

        trainer = json.load(open(os.path.join(DATA, "trainer.json")))
        inference = json.load(open(os.path.join(DATA, "inference.json")))
        replica = dict(inference["ranks"][0], rank=1, instance=1, host="infer-1")
        bodies = [("trainer", dict(r, mesh_groups=trainer["mesh_groups"])) for r in trainer["ranks"]]
        bodies += [("inference", inference["ranks"][0]), ("inference", replica)]
        for role, body in bodies:
            status, text = api.request("POST", f"/v1/register/{role}", body)
            if status != 200:
                raise SystemExit(f"load_test: registering {role} rank {body['rank']}: {status} {text[:300]!r}")
        for rank in (0, 1):
            status, text = api.request("GET", f"/v1/plan?role=trainer&rank={rank}&wait_ms=10000")
            if status != 200:
                raise SystemExit(f"load_test: plan of trainer rank {rank}: {status} {text[:300]!r}")
        for rank in (0, 1):
            status, text = api.request("POST", "/v1/versions/1/start", {"rank": rank})
            if status != 200:
                raise SystemExit(f"load_test: start: {status} {text[:300]!r}")
        api.latencies.clear()
        say(f"version 1 running; attacking for {args.seconds:g} s: {args.idle} idle connections, "
            f"{args.slowloris} slowloris, {args.flood} unsigned 16 MiB bodies at a time")

        stop_at = time.monotonic() + args.seconds
        out = multiprocessing.Queue()
        attacker = multiprocessing.Process(target=attack, args=(port, stop_at, args.idle, args.slowloris,
                                                               args.flood, out))
        attacker.start()
        peak_kb = [rss_kb(ctl.pid)]
        done = threading.Event()

        def watch_rss():
            while not done.is_set():
                peak_kb[0] = max(peak_kb[0], rss_kb(ctl.pid))
                time.sleep(0.05)

        def heartbeats():
            while not done.is_set():
                for role, body in bodies:
                    api.request("POST", "/v1/heartbeat", {"role": role, "rank": body["rank"]})
                done.wait(1.0)

        threads = [threading.Thread(target=watch_rss), threading.Thread(target=heartbeats)]
        for t in threads:
            t.start()
        last_say = time.monotonic()
        while time.monotonic() < stop_at:
            api.request("GET", "/v1/status")
            time.sleep(0.1)
            if time.monotonic() - last_say >= 5:
                last_say = time.monotonic()
                say(f"{len(api.latencies)} signed requests so far, controller RSS {rss_kb(ctl.pid) // 1024} MB")
        try:
            counts = out.get(timeout=30)
        except Exception:
            counts = {}
        attacker.join(timeout=10)
        if attacker.is_alive():
            attacker.kill()
        # The attack is over: the ranks finish the version.
        for rank in (0, 1):
            api.request("POST", "/v1/versions/1/trainer_done", {"rank": rank})
        for rank in (0, 1):
            api.request("POST", "/v1/versions/1/inference_done", {"rank": rank})
        status, text = api.request("GET", "/v1/versions/1")
        state = json.loads(text).get("state") if status == 200 else f"HTTP {status}: {text[:200]!r}"
        done.set()
        for t in threads:
            t.join()
        metrics = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        metrics.request("GET", "/metrics")
        refused = {}
        for line in metrics.getresponse().read().decode().splitlines():
            if line.startswith("wsync_requests_refused_total{"):
                refused[line.split('"')[1]] = int(float(line.rsplit(" ", 1)[1]))
        lat = sorted(api.latencies)
        pct = lambda p: round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1) if lat else None
        result = {
            "version_completed": state == "complete",
            "version_state": state,
            "signed_requests": len(lat),
            "signed_failed": len(api.failures),
            "signed_p50_ms": pct(0.50),
            "signed_p99_ms": pct(0.99),
            "signed_max_ms": round(1000 * lat[-1], 1) if lat else None,
            "p99_limit_ms": args.p99_ms,
            "controller_rss_peak_mb": round(peak_kb[0] / 1024, 1),
            "rss_limit_mb": args.rss_mb,
            "attack_seconds": args.seconds,
            "idle_connects": counts.get("idle_connects", 0),
            "slowloris_connects": counts.get("slow_connects", 0),
            "flood_bodies_started": counts.get("flood_connects", 0),
            "flood_bytes_sent": counts.get("flood_bytes_sent", 0),
            "flood_answers": counts.get("flood_answer_lines", {}),
            "refused": refused,
        }
        if api.failures:
            say("failed signed requests (first 5): " + "; ".join(api.failures[:5]))
    finally:
        ctl.send_signal(signal.SIGTERM)
        try:
            ctl.wait(timeout=10)
        except subprocess.TimeoutExpired:
            ctl.kill()
        log.close()
    ok = (result["version_completed"] and result.get("signed_p99_ms") is not None
          and result["signed_p99_ms"] <= args.p99_ms and result["controller_rss_peak_mb"] <= args.rss_mb)
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"FAILED; the controller's log is {log_path}")
    print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
