"""Replicas behind a router (chapter 15): N independent `python -m minillm.serve` processes, each a whole server
with its own engine, behind vllm-router, vLLM's load balancer (a Rust binary from PyPI). The router spreads
requests by a policy (round_robin, power_of_two, cache_aware: the replica whose prefix tree already holds the
prompt's start, while the loads stay balanced), checks each replica's /health, retries a request that a replica
failed on another one, and stops sending to a replica that fails until it is healthy again.

Here every process runs on this machine on loopback ports, standing for the machines of a cluster (where the
worker URLs would be other hosts): `Replicas` starts and stops them, kills one (as a crash would) and restarts it.

    python -m minillm.replicas --replicas 2 --policy cache_aware --port 8000 -- --max-num-seqs 32
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from minillm.bench.servers import environment, free_port, stop, wait_healthy
from minillm.bench.vllm_peer import die_with_parent

POLICIES = ["round_robin", "power_of_two", "cache_aware", "consistent_hash", "random"]
HEALTH_CHECK_INTERVAL_S = 1  # how often the router asks each replica's /health (its default: 60 s)


def router_command(port: int, worker_urls: list[str], policy: str, metrics_port: int) -> list[str]:
    """vllm-router's command line: fast health checks and retries, so that a replica that dies is left out within
    seconds and the requests it failed are sent to another."""
    return [
        shutil.which("vllm-router", path=str(Path(sys.executable).parent)) or "vllm-router",
        *("--host", "127.0.0.1", "--port", str(port), "--policy", policy),
        *("--worker-urls", *worker_urls),
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)),
        *("--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S), "--health-failure-threshold", "1"),
        *("--health-check-timeout-secs", "2", "--health-success-threshold", "1"),
        *("--retry-max-retries", "5", "--retry-initial-backoff-ms", "100", "--cb-failure-threshold", "3"),
        *("--cb-timeout-duration-secs", "2", "--log-level", "warning"),
    ]


class Replicas:
    """with Replicas(2, "cache_aware") as r: ... r.url is the router's; r.replica_urls the servers'.

    server_args: `python -m minillm.serve`'s flags for every replica. Each replica gets an equal share of the CPU's
    cores. restart_dead: a thread restarts a replica that has died, on its port, and the router takes it back once
    it answers /health."""

    def __init__(self, num_replicas: int, policy: str = "cache_aware", server_args=(), port: int = 0,
                 restart_dead: bool = False):  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.policy, self.server_args, self.restart_dead = policy, list(server_args), restart_dead
        self.ports = [free_port() for _ in range(num_replicas)]
        self.replica_urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.port, self.metrics_port = port or free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = Path(tempfile.mkdtemp(prefix="minillm-replicas-"))
        self.procs: list[subprocess.Popen | None] = [None] * num_replicas
        self.router: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.supervisor: threading.Thread | None = None
        self.restarts: list[float] = []  # when each automatic restart made a replica healthy again

    def __enter__(self) -> "Replicas":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for i in range(len(self.ports)):
            self.start_replica(i)
        for i, proc in enumerate(self.procs):
            wait_healthy(proc, self.replica_urls[i], self.log(i))
        argv = router_command(self.port, self.replica_urls, self.policy, self.metrics_port)
        self.router = self.spawn(argv, self.logs / "router.log", os.environ)
        wait_healthy(self.router, self.url, self.logs / "router.log", timeout=120)
        if self.restart_dead:
            self.supervisor = threading.Thread(target=self.supervise, name="minillm-replicas", daemon=True)
            self.supervisor.start()

    def log(self, i: int) -> Path:
        return self.logs / f"replica{i}.log"

    def spawn(self, argv: list[str], log: Path, env: dict) -> subprocess.Popen:
        """A process in a group of its own (stopped whole), killed with this one (PR_SET_PDEATHSIG: with the thread
        that spawns it, so spawn from a thread that lives as long as the replicas)."""
        with open(log, "a") as out:
            return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip

    def start_replica(self, i: int) -> subprocess.Popen:
        """Start replica i on its port (not waiting for it to be healthy)."""
        argv = [sys.executable, "-m", "minillm.serve", "--port", str(self.ports[i]), *self.server_args]
        threads = max(1, (os.cpu_count() or 1) // len(self.ports))
        env = environment("minillm", threads) | {"OMP_NUM_THREADS": str(threads)}
        self.procs[i] = self.spawn(argv, self.log(i), env)
        return self.procs[i]

    def kill(self, i: int) -> None:
        """kill -9 replica i and its engine core, as a crash would."""
        os.killpg(self.procs[i].pid, signal.SIGKILL)
        self.procs[i].wait()

    def restart(self, i: int) -> float:
        """Start replica i again (it must have stopped); the seconds until it is healthy."""
        return wait_healthy(self.start_replica(i), self.replica_urls[i], self.log(i))

    def supervise(self) -> None:
        """Restart every replica that dies, until stop()."""
        while not self.stopping.wait(0.2):
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None and not self.stopping.is_set():
                    try:
                        self.restart(i)
                        self.restarts.append(time.monotonic())
                    except RuntimeError as e:  # it failed to start: say so, try again on the next round
                        print(f"minillm.replicas: replica {i} did not restart: {e}", file=sys.stderr, flush=True)

    def healthy(self) -> list[bool]:
        """Whether each replica answers /health now."""

        def ok(url):
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        return [ok(url) for url in self.replica_urls]

    def router_metrics(self) -> str:
        """The router's own Prometheus metrics (requests per worker, retries, circuit breakers)."""
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def stop(self) -> None:
        """Stop the router and every replica, and remove the logs."""
        self.stopping.set()
        if self.supervisor is not None:
            self.supervisor.join(60)
        for proc in [self.router, *self.procs]:
            if proc is not None:
                stop(proc)
        shutil.rmtree(self.logs, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minillm.replicas", description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2, help="servers to start (default 2)")
    parser.add_argument("--policy", choices=POLICIES, default="cache_aware", help="the router's (default cache_aware)")
    parser.add_argument("--port", type=int, default=8000, help="the router's port (default 8000; 0: a free one)")
    parser.add_argument("--no-restart", dest="restart_dead", action="store_false", help="leave a dead replica dead")
    parser.add_argument("server_args", nargs="*", help="after --: python -m minillm.serve's flags, for every replica")
    args = parser.parse_args(argv)
    with Replicas(args.replicas, args.policy, args.server_args, args.port, args.restart_dead) as replicas:
        print(f"vllm-router ({args.policy}) serves at {replicas.url} over {' '.join(replicas.replica_urls)} "
              "(Ctrl-C stops all)", flush=True)  # fmt: skip
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
        try:
            while replicas.router.poll() is None:
                time.sleep(0.5)
        except (KeyboardInterrupt, SystemExit):
            return 0
    return 1  # the router exited by itself
