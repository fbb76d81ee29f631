"""A bounded load test of `tformer serve` on the loopback interface: requests/s and latency percentiles for
batch-1 and batch-32 requests from several concurrent clients (keep-alive connections, stdlib http.client).

    python benchmarks/serve_load.py outputs/train/<date>/<time> [--runtime torch|onnx] [--clients 8]
                                    [--requests 400]

Starts the server itself on a free loopback port, sends --requests requests per batch size (split over
--clients threads), prints one row per batch size, stops the server. Texts are the demo data's (varied lengths).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def start_server(run: Path, runtime: str, extra: list[str]):
    tformer = Path(sys.executable).parent / "tformer"
    proc = subprocess.Popen([str(tformer), "serve", f"checkpoint={run}", f"runtime={runtime}", "port=0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline()
    if "http://127.0.0.1:" not in line:
        raise SystemExit(f"server did not start: {line}{proc.stderr.read()}")
    return proc, int(line.split("http://127.0.0.1:")[1].split()[0])


def load(port: int, texts: list[str], batch: int, requests: int, clients: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = [requests // clients + (i < requests % clients) for i in range(clients)]

    def client(n: int, offset: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        for i in range(n):
            start = (offset + i) * batch % max(len(texts) - batch, 1)
            body = json.dumps(texts[start:start + batch])
            t0 = time.perf_counter()
            conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            mine.append(time.perf_counter() - t0)
            if response.status != 200 or len(json.loads(payload)["predictions"]) != batch:
                raise SystemExit(f"bad answer {response.status}: {payload[:200]!r}")
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(n, k * 1000)) for k, n in enumerate(per_client)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--runtime", default="torch", choices=["torch", "onnx"])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--server-arg", action="append", default=[], help="extra `tformer serve` key=value")
    args = ap.parse_args()

    from benchmarks.onnx_export import cpu_name
    from tformer_cli.data.demo import generate

    texts = generate(2000, seed=7)[0]
    proc, port = start_server(args.run, args.runtime, args.server_arg)
    try:
        load(port, texts, 1, 20, 2)  # warm-up
        print(f"machine: {cpu_name()}, {os.cpu_count()} cores; server: {args.runtime} runtime, {args.run}; "
              f"{args.clients} concurrent clients, {args.requests} requests per row, loopback")
        print(f"{'texts/request':>14}{'requests/s':>12}{'texts/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
        for batch in (1, 32):
            seconds, lat = load(port, texts, batch, args.requests, args.clients)
            q = statistics.quantiles(lat, n=100)
            print(f"{batch:>14}{len(lat) / seconds:>12.1f}{len(lat) * batch / seconds:>10.0f}"
                  f"{statistics.median(lat) * 1000:>9.1f}{q[98] * 1000:>9.1f}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        h = json.loads(conn.getresponse().read())
        conn.close()
        print(f"server: {h['requests']} requests in {h['batches']} forward batches")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
