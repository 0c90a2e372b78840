#!/usr/bin/python3
"""Soak: pruneserve under constant preemption and the full strategy mix for a given
time, sampled for leaks. Starts the server with tight KV tiers, runs
pruneserve-loadtest at --concurrency streams with client cancels, deadlines, Aborts
and random priorities, samples the server's RSS, open file descriptors, threads and
used KV blocks per tier every --interval seconds, and ends with a verdict:
  - 0 unexpected errors (only the induced cancels, deadlines and aborts);
  - 0 KV blocks used in either tier once the load is gone;
  - RSS and open fds flat over the last 10 minutes (the last half of a run shorter
    than 20 minutes): the fds stay within --flat-tolerance of their minimum, and the
    RSS does not grow: the median of the window's last third stays within
    --flat-tolerance of its first third's. (RSS swings up and down by several percent
    as the allocator, and ASan's quarantine, take and give back memory under this load:
    a single sample's high is not a leak, a rising median is.)
Writes samples.csv, loadtest.json, server.log, soak.png and verdict.json to --out.
Exit 0 when every check holds."""
import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "pyutil"))
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIX = "full=0.3,lazyllm=0.15,gemfilter=0.15,critiprefill=0.15,sliminfer=0.1,pod=0.15"


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.split()
    return int(fields["VmRSS"][0]) * 1024, int(fields["Threads"][0])


def scrape(metrics_url, name, label):
    """{label value: sample value} of the samples called `name` (and for kv_blocks, state="used")."""
    page = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return {s.labels[label]: s.value for fam in text_string_to_metric_families(page) for s in fam.samples
            if s.name == name and s.labels.get("state", "used") == "used"}


def used_blocks(metrics_url):  # the gauges appear with the first engine step
    used = scrape(metrics_url, "pruneserve_kv_blocks", "tier")
    return {tier: used.get(tier, 0.0) for tier in ("device", "host")}


def request_blocks(metrics_url):
    """Blocks in use that are not the prefix cache's: what requests hold, 0 once idle."""
    used, cached = used_blocks(metrics_url), scrape(metrics_url, "pruneserve_prefix_cache_blocks", "tier")
    return {tier: used[tier] - cached.get(tier, 0.0) for tier in used}


def wait_for(cond, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def plot(samples, out_png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    ax[0].plot(t, [s["rss_bytes"] / 2**20 for s in samples], color="tab:blue")
    ax[0].set_ylabel("RSS (MiB)")
    ax[0].set_ylim(bottom=0)
    ax[1].plot(t, [s["device_blocks"] for s in samples], label="device tier", color="tab:orange")
    ax[1].plot(t, [s["host_blocks"] for s in samples], label="host tier", color="tab:green")
    ax[1].set_ylabel("KV blocks used")
    ax[1].legend(loc="upper right")
    ax[2].plot(t, [s["fds"] for s in samples], label="open fds", color="tab:red")
    ax[2].plot(t, [s["threads"] for s in samples], label="threads", color="tab:purple")
    ax[2].set_ylabel("count")
    ax[2].set_ylim(bottom=0)
    ax[2].legend(loc="upper right")
    ax[2].set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--out", default="soak-out")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="folder with pruneserve and the tools")
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "testdata", "stories260K",
                                                     "stories260K.gguf"))
    ap.add_argument("--haystack", default=os.path.join(ROOT, "..", "shared", "testdata", "haystack",
                                                        "paul_graham_essays"))
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--interval", type=float, default=5, help="seconds between samples")
    ap.add_argument("--flat-tolerance", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2, help="the server's compute threads")
    ap.add_argument("--server-arg", action="append", default=[], help="another server flag (repeatable), "
                    "e.g. --server-arg=--prefix-cache=off")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    binary = lambda name: os.path.join(args.build, name)  # noqa: E731
    for b in ("pruneserve", "pruneserve-loadtest", "pruneserve-calibrate"):
        if not os.access(binary(b), os.X_OK):
            sys.exit(f"soak: no {binary(b)}; build first (cmake --build build)")

    calibration = out("model.calibration.json")  # PoD's layer groups: the mix includes it
    subprocess.run([binary("pruneserve-calibrate"), "--model", args.model, "--haystack", args.haystack,
                    "--length", "256", "--samples", "2", "--out", calibration, "--threads", str(args.threads)],
                   check=True, capture_output=True)
    port_file = out("ports")
    if os.path.exists(port_file):
        os.remove(port_file)
    log = open(out("server.log"), "w")
    # Tight tiers: a device tier for ~12 of the 64 streams' KV and a host tier for ~24
    # more, so requests are preempted (swapped or recomputed) all the time.
    server = subprocess.Popen(
        [binary("pruneserve"), "--model", args.model, "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
         "--port-file", port_file, "--threads", str(args.threads), "--kv-device-bytes", str(3 << 20),
         "--kv-host-bytes", str(6 << 20), "--max-running", "32", "--pod-groups", calibration,
         "--drain-timeout", "30", *args.server_arg],
        stdout=log, stderr=subprocess.STDOUT)
    if not wait_for(lambda: os.path.exists(port_file) or server.poll() is not None, 60) or server.poll() is not None:
        sys.exit(f"soak: the server did not start; see {out('server.log')}")
    ports = dict(line.strip().split("=") for line in open(port_file))
    addr, metrics_url = f"127.0.0.1:{ports['grpc']}", f"http://127.0.0.1:{ports['metrics']}/metrics"
    try:
        return soak(args, server, addr, metrics_url, out, binary)
    finally:
        if server.poll() is None:
            server.kill()


def soak(args, server, addr, metrics_url, out, binary):

    seconds = args.minutes * 60
    loadtest = subprocess.Popen(
        [binary("pruneserve-loadtest"), "--addr", addr, "--haystack", args.haystack, "--num-requests", "0",
         "--duration", str(seconds), "--request-rate", "inf", "--max-concurrency", str(args.concurrency),
         "--input-len", "192", "--range-ratio", "0.5", "--output-len", "48", "--strategy-mix", MIX,
         "--cancel-fraction", "0.1", "--cancel-within", "2", "--deadline-fraction", "0.1", "--deadline", "3",
         "--abort-fraction", "0.05", "--abort-within", "2", "--priorities", "4", "--progress", "off",
         "--result-file", out("loadtest.json")],
        stdout=open(out("loadtest.txt"), "w"), stderr=subprocess.STDOUT)
    samples = []
    start = time.monotonic()
    with open(out("samples.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, ["t", "rss_bytes", "fds", "threads", "device_blocks", "host_blocks"])
        writer.writeheader()
        while loadtest.poll() is None and server.poll() is None:  # samples under load only
            t = time.monotonic() - start
            rss, threads = proc_status(server.pid)
            fds = len(os.listdir(f"/proc/{server.pid}/fd"))  # before the scrape opens a connection
            used = used_blocks(metrics_url)
            s = {"t": round(t, 1), "rss_bytes": rss, "fds": fds, "threads": threads, "device_blocks": used["device"],
                 "host_blocks": used["host"]}
            samples.append(s)
            writer.writerow(s)
            f.flush()
            print(f"soak {t / 60:5.1f} min  RSS {rss / 2**20:7.1f} MiB  fds {s['fds']:4d}  threads {threads:3d}  "
                  f"KV blocks device {used['device']:6.0f} host {used['host']:6.0f}", flush=True)
            time.sleep(args.interval)  # the sampling period, not a synchronisation
    loadtest.wait()
    drained = wait_for(lambda: sum(request_blocks(metrics_url).values()) == 0, 30)
    end_used = request_blocks(metrics_url)
    preemptions = scrape(metrics_url, "pruneserve_preemptions_total", "mode")
    server.send_signal(signal.SIGTERM)
    exit_code = server.wait(timeout=60)

    result = json.load(open(out("loadtest.json")))["runs"][0]
    window = 600 if seconds >= 1200 else seconds / 2
    tail = [s for s in samples if s["t"] >= samples[-1]["t"] - window]

    def spread(key):
        lo = min(s[key] for s in tail)
        return (max(s[key] for s in tail) - lo) / lo

    def growth(key):
        third = max(1, len(tail) // 3)
        first, last = sorted(s[key] for s in tail[:third]), sorted(s[key] for s in tail[-third:])
        return last[len(last) // 2] / first[len(first) // 2] - 1

    checks = {
        "unexpected_errors": result["failed"] == 0,
        "kv_blocks_used_at_end": drained,
        "rss_flat": growth("rss_bytes") <= args.flat_tolerance,
        "fds_flat": spread("fds") <= args.flat_tolerance,
        "server_exit_0": exit_code == 0,
    }
    verdict = {
        "pass": all(checks.values()),
        "checks": checks,
        "minutes": args.minutes,
        "requests": {k: result[k] for k in ("completed", "cancelled", "failed")},
        "failures": result.get("failures", {}),
        "kv_blocks_used_at_end": end_used,
        "window_seconds": window,
        "rss_mib": {"first": samples[0]["rss_bytes"] / 2**20, "window_min": min(s["rss_bytes"] for s in tail) / 2**20,
                    "window_max": max(s["rss_bytes"] for s in tail) / 2**20, "spread": spread("rss_bytes"), "median_growth": growth("rss_bytes")},
        "fds": {"window_min": min(s["fds"] for s in tail), "window_max": max(s["fds"] for s in tail)},
        "threads": {"window_min": min(s["threads"] for s in tail), "window_max": max(s["threads"] for s in tail)},
        "preemptions": preemptions,
    }
    with open(out("server.log")) as f:
        verdict["injected_or_logged_errors"] = sum("[error]" in line for line in f)
    json.dump(verdict, open(out("verdict.json"), "w"), indent=2)
    plot(samples, out("soak.png"),
         f"pruneserve soak: {args.minutes:g} min, {args.concurrency} streams, tight KV tiers, full strategy mix\n"
         f"{result['completed']} completed, {result['cancelled']} cancelled (induced), {result['failed']} failed")
    print(json.dumps(verdict, indent=2))
    print("soak:", "PASS" if verdict["pass"] else "FAIL", f"(details in {args.out})")
    return 0 if verdict["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
