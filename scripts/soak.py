#!/usr/bin/env python3
"""Soak the local stack under faults (issue 19): load at a share of its measured capacity for a
given time, with replicas stalled, failing, losing their metrics and killed in turn, while the
proxy's and the controller's RSS, open FDs and connections per replica are sampled.

The stack is `kinference-local` (controller, two glm-5.3 and two qwen-3.6-27b simulators, the
proxy) on free loopback ports. First a closed-loop calibration (32 clients, 30 s) measures what
the stack sustains on this machine; then an open-loop load at `--share` of it runs for
`--minutes`. Every request must be answered: a status (2xx, or an OpenAI error such as 503) is an
answer; a timeout or a reset connection is a lost request.

Faults, one at a time, cycling every `--fault-every` seconds:
- stall: SIGSTOP a glm-5.3 replica for 20 s, then SIGCONT (its requests and its /metrics hang);
- 503 storm: a qwen-3.6-27b replica answers every completion 503 for 30 s (POST /sim/faults);
- metrics outage: a glm-5.3 replica's /metrics answers 503 for 30 s;
- kill: SIGKILL a qwen-3.6-27b replica, restarted on the same port 10 s later.

Writes samples.csv, requests.json and soak.png to --out and prints a summary as JSON.

    python3 scripts/soak.py --local target/release/kinference-local --minutes 30 \
        --out docs/benchmarks/soak
"""
import argparse
import http.client
import json
import os
import queue
import random
import re
import signal
import subprocess
import threading
import time

PROMPTS = [
    "What is the capital of France?",
    "Hi! What is 2+2?",
    "Translate 'good morning' into Spanish.",
    "Write a haiku about autumn.",
    "Explain the difference between TCP and UDP in two sentences.",
    "Design a distributed consensus protocol tolerant to Byzantine faults and prove its safety.",
    "Summarise the following shared context. " + "The platform team runs vLLM on GPUs. " * 60,
]


def start_stack(local):
    proc = subprocess.Popen(
        [local, "--any-ports", "--no-dashboard", "--time-scale", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("kinference-local listen="):
            break
    banner = "".join(lines)
    m = re.search(r"listen=(\S+) admin=(\S+) controller-grpc=(\S+) controller-admin=(\S+)", banner)
    if not m:
        raise SystemExit(f"the stack did not start:\n{banner}")
    replicas = re.findall(r"(glm-5\.3|qwen-3\.6-27b) replica:\s+http://(\S+)", banner)
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, m.group(1), m.group(2), m.group(4), replicas


def children(pid):
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{p}/cmdline") as f:
                out[int(p)] = [a for a in f.read().split("\0") if a]
        except OSError:
            pass
    return out


def find(pid, word, port=None):
    for p, cmd in children(pid).items():
        if word in cmd and (port is None or str(port) in cmd):
            return p, cmd
    return None, None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def connections_by_port(pid, ports):
    """Established TCP connections the process holds to each of `ports` on loopback."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    counts = {p: 0 for p in ports}
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], parts[9]
            if state != "01" or inode not in inodes:
                continue
            port = int(remote.split(":")[1], 16)
            if port in counts:
                counts[port] += 1
    return counts


class Client:
    """One keep-alive connection per worker thread."""

    def __init__(self, addr, timeout):
        host, port = addr.rsplit(":", 1)
        self.host, self.port, self.timeout = host, int(port), timeout
        self.conn = None

    def post(self, path, body, stream):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            rsp = self.conn.getresponse()
            data = rsp.read()
            return rsp.status, data
        except Exception:
            self.conn.close()
            self.conn = None
            raise


def request_body(rng):
    prompt = rng.choice(PROMPTS)
    stream = rng.random() < 0.5
    return json.dumps({
        "model": "glm-5.3",
        "messages": [{"role": "user", "content": f"{rng.randint(0, 10**6)} {prompt}"}],
        "max_tokens": rng.choice([8, 16, 32]),
        "stream": stream,
    }), stream


def calibrate(listen, seconds=30, clients=32):
    done = [0]
    stop = time.time() + seconds
    lock = threading.Lock()

    def worker(i):
        rng = random.Random(i)
        c = Client(listen, 60)
        while time.time() < stop:
            body, stream = request_body(rng)
            try:
                status, _ = c.post("/v1/chat/completions", body, stream)
                if status == 200:
                    with lock:
                        done[0] += 1
            except Exception:
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / seconds


def post_faults(addr, faults):
    """Sets a replica's faults; retried for a while (a killed replica may still be restarting)."""
    host, port = addr.rsplit(":", 1)
    for _ in range(30):
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=5)
            c.request("POST", "/sim/faults", body=json.dumps(faults),
                      headers={"content-type": "application/json"})
            c.getresponse().read()
            c.close()
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{addr} did not take its faults")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--share", type=float, default=0.7)
    ap.add_argument("--fault-every", type=float, default=90)
    ap.add_argument("--sample-every", type=float, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    stack, listen, admin, controller_admin, replicas = start_stack(args.local)
    pid = stack.pid
    time.sleep(3)
    proxy_pid, _ = find(pid, "proxy")
    controller_pid, _ = find(pid, "controller")
    glm = [a for m, a in replicas if m == "glm-5.3"]
    qwen = [a for m, a in replicas if m == "qwen-3.6-27b"]
    ports = [int(a.rsplit(":", 1)[1]) for _, a in replicas]
    restarted = []

    capacity = calibrate(listen)
    rate = max(1.0, capacity * args.share)
    print(json.dumps({"capacity_rps": round(capacity, 1), "rate_rps": round(rate, 1)}), flush=True)

    work = queue.Queue()
    results = {"answered": 0, "ok": 0, "errors": {}, "lost": 0, "lost_reasons": {}}
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i):
        c = Client(listen, 120)
        while True:
            item = work.get()
            if item is None:
                return
            body, stream = item
            try:
                status, _ = c.post("/v1/chat/completions", body, stream)
                with lock:
                    results["answered"] += 1
                    if status == 200:
                        results["ok"] += 1
                    else:
                        results["errors"][str(status)] = results["errors"].get(str(status), 0) + 1
            except Exception as e:
                with lock:
                    results["lost"] += 1
                    k = type(e).__name__
                    results["lost_reasons"][k] = results["lost_reasons"].get(k, 0) + 1

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(128)]
    for w in workers:
        w.start()

    def generator():
        rng = random.Random(1)
        t = time.time()
        while not stop.is_set():
            t += rng.expovariate(rate)
            delay = t - time.time()
            if delay > 0:
                time.sleep(delay)
            work.put(request_body(rng))

    gen = threading.Thread(target=generator, daemon=True)
    gen.start()

    faults_log = []

    def fault(kind, i):
        at = round(time.time() - t0, 1)
        if kind == "stall":
            port = glm[i % len(glm)].rsplit(":", 1)[1]
            p, _ = find(pid, "vllm-sim", port)
            if p:
                os.kill(p, signal.SIGSTOP)
                time.sleep(20)
                os.kill(p, signal.SIGCONT)
        elif kind == "503 storm":
            a = qwen[i % len(qwen)]
            post_faults(a, {"fixed_status": 503})
            time.sleep(30)
            post_faults(a, {})
        elif kind == "metrics outage":
            a = glm[i % len(glm)]
            post_faults(a, {"metrics": "unavailable"})
            time.sleep(30)
            post_faults(a, {})
        elif kind == "kill":
            port = qwen[i % len(qwen)].rsplit(":", 1)[1]
            p, cmd = find(pid, "vllm-sim", port)
            if p is None:
                p, cmd = next(((q, c) for q, c, _ in reversed(restarted) if port in c), (None, None))
            if p:
                os.kill(p, signal.SIGKILL)
                time.sleep(10)
                child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                restarted.append((child.pid, cmd, port))
        faults_log.append({"at_s": at, "fault": kind})

    kinds = ["stall", "503 storm", "metrics outage", "kill"]
    samples = []
    t0 = time.time()
    end = t0 + args.minutes * 60
    next_sample = t0
    next_fault = t0 + args.fault_every
    fault_i = 0
    fault_thread = None
    while time.time() < end:
        now = time.time()
        if now >= next_sample:
            conns = connections_by_port(proxy_pid, ports)
            with lock:
                snap = dict(results)
            samples.append({
                "t_s": round(now - t0, 1),
                "proxy_rss_kib": rss_kib(proxy_pid),
                "proxy_fds": fds(proxy_pid),
                "controller_rss_kib": rss_kib(controller_pid),
                "controller_fds": fds(controller_pid),
                "max_conns_per_replica": max(conns.values()),
                "conns": conns,
                "answered": snap["answered"],
                "lost": snap["lost"],
            })
            print(json.dumps(samples[-1]), flush=True)
            next_sample += args.sample_every
        if now >= next_fault and (fault_thread is None or not fault_thread.is_alive()):
            fault_thread = threading.Thread(target=fault, args=(kinds[fault_i % 4], fault_i // 4))
            fault_thread.start()
            fault_i += 1
            next_fault += args.fault_every
        time.sleep(0.5)
    stop.set()
    if fault_thread:
        fault_thread.join()
    for _ in workers:
        work.put(None)
    for w in workers:
        w.join(timeout=150)
    os.killpg(pid, signal.SIGTERM)
    for p, _, _ in restarted:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass

    with open(os.path.join(args.out, "samples.csv"), "w") as f:
        cols = ["t_s", "proxy_rss_kib", "proxy_fds", "controller_rss_kib", "controller_fds",
                "max_conns_per_replica", "answered", "lost"]
        f.write(",".join(cols) + "\n")
        for s in samples:
            f.write(",".join(str(s[c]) for c in cols) + "\n")
    summary = {
        "minutes": args.minutes, "capacity_rps": round(capacity, 1), "rate_rps": round(rate, 1),
        "share": args.share, "results": results, "faults": faults_log,
    }
    with open(os.path.join(args.out, "requests.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        t = [s["t_s"] / 60 for s in samples]
        fig, ax = plt.subplots(1, 3, figsize=(15, 4))
        ax[0].plot(t, [s["proxy_rss_kib"] / 1024 for s in samples], label="proxy")
        ax[0].plot(t, [s["controller_rss_kib"] / 1024 for s in samples], label="controller")
        ax[0].set_title("RSS (MiB)")
        ax[1].plot(t, [s["proxy_fds"] for s in samples], label="proxy")
        ax[1].plot(t, [s["controller_fds"] for s in samples], label="controller")
        ax[1].set_title("open FDs")
        ax[2].plot(t, [s["max_conns_per_replica"] for s in samples])
        ax[2].set_title("proxy's connections to its busiest replica")
        for a in ax:
            a.set_xlabel("minutes")
            for fl in faults_log:
                a.axvline(fl["at_s"] / 60, color="grey", alpha=0.2)
        ax[0].legend()
        ax[1].legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "soak.png"), dpi=90)
    except ImportError:
        print("matplotlib is not installed: no plot", flush=True)


if __name__ == "__main__":
    main()
