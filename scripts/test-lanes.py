#!/usr/bin/env python3
"""Runs every test binary of the workspace, as `cargo test --workspace` does, in two lanes.

Most of the workspace's test time is spent waiting (timeouts, real salt-master processes coming
up, failovers), one binary after the other; on CI's two cores the test phase used ~30 % of the CPU
for most of its length. So the binaries run in two lanes at once:

- lane `bench`: the saltgate-bench package (the release build its tests start, the bench smoke,
  the real-Salt scenarios), CPU-heavy;
- lane `rest`: every other package.

Each binary runs as cargo runs it (its package directory as the working directory,
CARGO_MANIFEST_DIR and CARGO set). The two lanes never use the same loopback address: each test
file has its own 127.x.y.0/24 or port 0 (README, "Tests"), and those of saltgate-bench differ from
every other package's. Each binary's output is printed whole when it ends, with its time, so
the lanes' outputs never interleave.

A binary that fails is run again alone once both lanes are done. If it passes alone, the run
still passes, and the summary names it, with its first output above: a test that fails only under
the other lane's load is a finding to fix, not a pass to forget. One that fails alone too fails
the run. The doc tests run last (`cargo test --doc`).

Usage: scripts/test-lanes.py (no arguments: scripts/test.sh passes its own arguments to a plain
`cargo test --workspace` instead). Environment: TEST_LANES=1 runs the binaries one after the
other (one lane), as cargo would; TEST_LANES_PACKAGES=a,b runs only those packages' binaries.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HEAVY_LANE_PACKAGES = {"saltgate-bench"}
# These build the release binaries (`cargo build --release`, or wait for a build already under
# way: .ci/run starts one in the background): last in their lane, so that the build has the
# cores the waiting tests leave idle before they need it.
RELEASE_LAST = {("saltgate-bench", "tests/quick.rs"),
                ("saltgate-bench", "tests/authstorm_cluster_real.rs")}


def say(msg):
    print(msg, flush=True)


def cargo():
    return os.environ.get("CARGO") or shutil.which("cargo") or "cargo"


def packages():
    """manifest directory -> package name, for the workspace's members"""
    out = subprocess.run([cargo(), "metadata", "--no-deps", "--format-version", "1", "--locked"],
                         check=True, stdout=subprocess.PIPE).stdout
    meta = json.loads(out)
    return {os.path.dirname(p["manifest_path"]): p["name"] for p in meta["packages"]}


def build():
    """builds every test target (as `cargo test --workspace --no-run`); returns the binaries in
    cargo's order: (package, label, executable, package dir, cargo's option to select it)"""
    by_dir = packages()
    cmd = [cargo(), "test", "--workspace", "--locked", "--no-run",
           "--message-format=json-render-diagnostics"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    bins = []
    for line in p.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        pdir = os.path.dirname(msg["manifest_path"])
        tgt = msg["target"]
        src = os.path.relpath(tgt["src_path"], pdir)
        kind = tgt["kind"][0]
        label = src if kind == "test" else f"unittests {src}"
        select = {"test": f"--test {tgt['name']}", "bin": f"--bin {tgt['name']}"}.get(kind, "--lib")
        bins.append((by_dir.get(pdir, os.path.basename(pdir)), label, msg["executable"], pdir,
                     select))
    if p.wait() != 0:
        sys.exit(f"test-lanes: `{' '.join(cmd)}` failed (exit {p.returncode})")
    return bins


class Runner:
    def __init__(self, logdir):
        self.logdir = logdir
        self.lock = threading.Lock()
        self.results = []  # (package, label, ok, seconds, log path)
        self.children = set()
        self.stopping = False

    def run_one(self, b, lane, tag=""):
        pkg, label, exe, pdir, _ = b
        log = os.path.join(self.logdir, f"{len(self.results)}-{os.path.basename(exe)}{tag}.log")
        env = dict(os.environ, CARGO_MANIFEST_DIR=pdir, CARGO_PKG_NAME=pkg, CARGO=cargo())
        t0 = time.monotonic()
        with open(log, "w") as f:
            child = subprocess.Popen([exe], cwd=pdir, env=env, stdout=f, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            with self.lock:
                self.children.add(child)
            rc = child.wait()
            with self.lock:
                self.children.discard(child)
        dt = time.monotonic() - t0
        ok = rc == 0
        with self.lock:
            self.results.append((pkg, label, ok, dt, log))
            say(f"\n----- [{lane}] {pkg} {label} ({os.path.basename(exe)}): "
                f"{'ok' if ok else f'FAILED (exit {rc})'} in {dt:.1f} s")
            with open(log, errors="replace") as f:
                sys.stdout.write(f.read())
            sys.stdout.flush()
        return ok

    def lane(self, name, bins, failed):
        for b in bins:
            if self.stopping:
                return
            if not self.run_one(b, name):
                failed.append(b)

    def stop(self, *_):
        self.stopping = True
        with self.lock:
            for c in self.children:
                try:
                    os.killpg(c.pid, signal.SIGTERM)
                except OSError:
                    pass
        sys.exit("test-lanes: interrupted")


def main():
    if len(sys.argv) > 1:
        sys.exit("test-lanes: no arguments (scripts/test.sh runs `cargo test --workspace ARGS` "
                 "when given any)")
    bins = build()
    only = [p for p in os.environ.get("TEST_LANES_PACKAGES", "").split(",") if p]
    if only:
        bins = [b for b in bins if b[0] in only]
    one_lane = os.environ.get("TEST_LANES") == "1"
    bins.sort(key=lambda b: (b[0], b[1]) in RELEASE_LAST)  # stable: cargo's order otherwise
    heavy = [b for b in bins if b[0] in HEAVY_LANE_PACKAGES]
    rest = [b for b in bins if b[0] not in HEAVY_LANE_PACKAGES]
    lanes = [("all", bins)] if one_lane else [("bench", heavy), ("rest", rest)]
    say(f"test-lanes: {len(bins)} test binaries in {len(lanes)} lane(s): "
        + ", ".join(f"{n} {len(b)}" for n, b in lanes))
    with tempfile.TemporaryDirectory(prefix="test-lanes.") as logdir:
        r = Runner(logdir)
        signal.signal(signal.SIGINT, r.stop)
        signal.signal(signal.SIGTERM, r.stop)
        t0 = time.monotonic()
        failed = []
        threads = [threading.Thread(target=r.lane, args=(n, b, failed)) for n, b in lanes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        lanes_s = time.monotonic() - t0
        flaky, broken = [], []
        for b in failed:
            say(f"\ntest-lanes: {b[0]} {b[1]} failed in its lane; running it again, alone")
            (flaky if r.run_one(b, "alone", ".again") else broken).append(b)
        say("\ntest-lanes: doc tests (cargo test --workspace --doc)")
        doc_ok = subprocess.run([cargo(), "test", "--workspace", "--locked", "--doc"]).returncode == 0
        say(f"\ntest-lanes: {len(bins)} binaries in {lanes_s:.0f} s; the slowest:")
        for pkg, label, ok, dt, _ in sorted(r.results, key=lambda x: -x[3])[:10]:
            say(f"  {dt:7.1f} s  {pkg} {label}{'' if ok else '  (failed)'}")
        for b in flaky:
            say(f"test-lanes: LOAD-SENSITIVE: {b[0]} {b[1]} failed beside the other lane and "
                "passed alone (its first output is above): fix it")
        for b in broken:
            say(f"test-lanes: FAILED: {b[0]} {b[1]} (again: cargo test -p {b[0]} {b[4]})")
        if broken or not doc_ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
