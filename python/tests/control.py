"""Signed control requests to a `wsync controller`, written here in a few
lines of plain Python (controller/auth.h states the canonical request)
rather than through wsync's own client: what the tests check is then not
also what sends their requests."""

import hashlib
import hmac
import json
import secrets
import time
import urllib.request


def signed(address, secret_file, method, target, body=None):
    """The controller's JSON answer to METHOD TARGET (body: a dict, sent as
    JSON), signed with the job secret in `secret_file`."""
    with open(secret_file, "rb") as f:
        key = f.read().rstrip()
    data = b"" if body is None else json.dumps(body).encode()
    ts, nonce = str(int(time.time())), secrets.token_hex(16)
    canonical = "\n".join(["wsync-hmac-sha256-v1", method, target, ts, nonce, hashlib.sha256(data).hexdigest()])
    req = urllib.request.Request(f"http://{address}{target}", data=data if body is not None else None, method=method,
                                 headers={"X-Wsync-Timestamp": ts, "X-Wsync-Nonce": nonce,
                                          "X-Wsync-Content-Sha256": hashlib.sha256(data).hexdigest(),
                                          "X-Wsync-Signature": hmac.new(key, canonical.encode(),
                                                                        hashlib.sha256).hexdigest(),
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())
