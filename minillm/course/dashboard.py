"""The instructor's live panel for a running server (ours or vLLM's): what /metrics says, drawn as it changes.

    dash = show_dashboard("http://127.0.0.1:8000", seconds=20, rate=4)   # in a notebook cell
    ...
    dash.close()

A thread scrapes /metrics every `interval` seconds (vLLM's metric names) and keeps the samples; series() turns
them into generation tokens/s, running and waiting requests, KV-cache usage and TTFT / ITL p50 and p99. Rates and
percentiles are over the last `window` seconds, as Prometheus computes rate(...[10s]) and histogram_quantile:
from how much each counter and histogram bucket grew in that window, so they follow the load as it changes.
A load generator (Start / Stop and a rate slider in the panel, or start_load) sends open-loop Poisson arrivals with
the online benchmark's own client (minillm.bench.endpoint_request_func) and arrival function.

Headless (nbclient, CI) no widget is drawn, so run(seconds, rate) drives the load for a while and then displays
the figure as an ordinary image output: the executed notebook shows it, as every course widget's static default.
"""

import asyncio
import io
import math
import threading
import time
from collections import deque

import httpx

from minillm.bench.endpoint_request_func import RequestFuncInput, async_request_openai_completions, served_model
from minillm.bench.prometheus import grown, histogram_quantile, parse_metrics
from minillm.bench.serve_report import plain_numbers
from minillm.bench.serving import poisson_arrivals

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTER = "vllm:generation_tokens_total"
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds"}


class Dashboard:
    """Polls base_url's /metrics on a thread from construction until close(); drives load on demand."""

    def __init__(
        self,
        base_url: str,
        interval: float = 1.0,
        window: float = 10.0,
        prompt: str | list[int] = "Once upon a time",
        max_tokens: int = 64,
        seed: int = 0,
    ):
        self.base_url, self.interval, self.window = base_url.rstrip("/"), interval, window
        self.prompt, self.max_tokens, self.seed = prompt, max_tokens, seed
        self.samples = deque(maxlen=int(3600 / interval))  # (time, scrape), an hour at most
        self.sent = self.failed = 0
        self.rate, self.image, self.error = 2.0, None, None
        self._lock, self._closed, self._load_stop = threading.Lock(), threading.Event(), threading.Event()
        self._load = None
        self._start = time.monotonic()
        self._poller = threading.Thread(target=self._poll, name="dashboard-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                try:
                    scrape = parse_metrics(client.get(self.base_url + "/metrics").text)
                    with self._lock:
                        self.samples.append((time.monotonic() - self._start, scrape))
                    self.error = None
                except httpx.HTTPError as e:  # a server restarting: keep polling, say why in the title
                    self.error = f"{type(e).__name__}: {e}"
                if self.image is not None:
                    self.image.value = self.png()
                if self._closed.wait(self.interval):
                    return

    def series(self) -> dict[str, list]:
        """Per sample: its time (s), the counter and gauges as scraped, and tokens/s and latency percentiles (ms)
        over the `window` seconds before it (None where the window holds no data yet)."""
        with self._lock:
            samples = list(self.samples)
        out = {k: [] for k in ("time", "generation_tokens", "generation_tokens_per_s", *GAUGES)}
        out |= {f"{h}_{p}_ms": [] for h in HISTOGRAMS for p in ("p50", "p99")}
        j = 0
        for t, scrape in samples:
            while samples[j][0] < t - self.window:
                j += 1
            t0, old = samples[j]
            out["time"].append(t)
            out["generation_tokens"].append(scrape.get(COUNTER, 0.0))
            rate = (scrape.get(COUNTER, 0.0) - old.get(COUNTER, 0.0)) / (t - t0) if t > t0 else None
            out["generation_tokens_per_s"].append(rate)
            for gauge in GAUGES:
                out[gauge].append(scrape.get(gauge))
            for key, name in HISTOGRAMS.items():
                window = grown(scrape.get(name, []), old.get(name, []))
                for p, q in (("p50", 0.5), ("p99", 0.99)):
                    value = histogram_quantile(q, window)
                    out[f"{key}_{p}_ms"].append(None if value is None else value * 1000)
        return out

    def figure(self):
        """Four panels: tokens/s, requests running and waiting, KV-cache usage, TTFT and ITL percentiles."""
        from matplotlib.figure import Figure

        s = self.series()
        nan = lambda values: [math.nan if v is None else v for v in values]
        fig = Figure(figsize=(12, 6.5), layout="constrained")
        (tok, req), (kv, lat) = fig.subplots(2, 2, sharex=True)
        tok.plot(s["time"], nan(s["generation_tokens_per_s"]), color="tab:blue")
        tok.set(title=f"generation tokens/s (over the last {self.window:g} s)", ylabel="tokens/s")
        req.plot(s["time"], nan(s[GAUGES[0]]), label="running")
        req.plot(s["time"], nan(s[GAUGES[1]]), label="waiting")
        req.set(title="requests", ylabel="requests")
        usage = [v * 100 for v in nan(s[GAUGES[2]])]
        kv.plot(s["time"], usage, color="tab:green")
        peak = max((u for u in usage if not math.isnan(u)), default=0.0)
        kv.set(title="KV-cache usage", ylabel="%", ylim=(0, min(100, max(1.0, 1.2 * peak))), xlabel="time (s)")
        for key, colour in (("ttft", "tab:purple"), ("itl", "tab:red")):
            for p, style in (("p50", "-"), ("p99", "--")):
                lat.plot(s["time"], nan(s[f"{key}_{p}_ms"]), style, color=colour, label=f"{key.upper()} {p}")
        lat.set(title=f"latency (over the last {self.window:g} s)", ylabel="ms", xlabel="time (s)", yscale="log")
        plain_numbers(lat.yaxis)
        for ax in (tok, req, kv, lat):
            ax.grid(alpha=0.3)
        tok.set_ylim(bottom=0)
        req.set_ylim(bottom=0)
        req.legend(fontsize=8, loc="upper left")
        lat.legend(fontsize=8, loc="upper left", ncols=2)
        load = (
            f"load {self.rate:g} req/s"
            if self.loading
            else f"no load (last {self.rate:g} req/s)"
            if self.sent
            else "no load"
        )
        state = f"; {self.error}" if self.error else ""
        fig.suptitle(f"{self.base_url}: {load}, {self.sent} requests sent, {self.failed} failed{state}", fontsize=10)
        return fig

    def png(self) -> bytes:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        buffer = io.BytesIO()
        FigureCanvasAgg(self.figure()).print_png(buffer)
        return buffer.getvalue()

    @property
    def loading(self) -> bool:
        return self._load is not None and self._load.is_alive()

    def start_load(self, rate: float | None = None) -> None:
        """Send requests at `rate` per second on average (Poisson arrivals; self.rate may change while it runs)."""
        self.rate = rate or self.rate
        if not self.loading:
            self._load_stop.clear()
            self._load = threading.Thread(target=lambda: asyncio.run(self._send()), name="dashboard-load", daemon=True)
            self._load.start()

    def stop_load(self) -> None:
        """Stop sending; the requests in flight are cancelled (the server aborts them)."""
        self._load_stop.set()
        if self._load is not None:
            self._load.join()

    async def _send(self) -> None:
        try:
            url, model = self.base_url + "/v1/completions", served_model(self.base_url)
        except httpx.HTTPError as e:
            self.error = f"no load: {type(e).__name__}: {e}"
            return
        in_flight = set()
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
            k = 0
            while not self._load_stop.is_set():
                gap = poisson_arrivals(1, self.rate, self.seed + k)[0]  # one exponential gap at the current rate
                k += 1
                deadline = time.monotonic() + gap
                while not self._load_stop.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(min(0.05, deadline - time.monotonic()))
                if self._load_stop.is_set():
                    break
                request = RequestFuncInput(self.prompt, self.max_tokens, model, url)
                task = asyncio.create_task(async_request_openai_completions(client, request))
                in_flight.add(task)
                task.add_done_callback(self._finished(in_flight))
                self.sent += 1
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)

    def _finished(self, in_flight: set):
        def done(task):
            in_flight.discard(task)
            if not task.cancelled() and not task.result().success:
                self.failed += 1

        return done

    def widget(self):
        """The live panel: Start / Stop, the rate slider and the figure, redrawn after every scrape."""
        import ipywidgets as widgets

        start, stop = widgets.Button(description="Start load"), widgets.Button(description="Stop load")
        rate = widgets.FloatSlider(value=self.rate, min=0.5, max=32, step=0.5, description="requests/s")
        self.image = widgets.Image(value=self.png(), format="png", layout=widgets.Layout(max_width="100%"))
        start.on_click(lambda _: self.start_load(rate.value))
        stop.on_click(lambda _: self.stop_load())
        rate.observe(lambda change: setattr(self, "rate", change["new"]), names="value")
        return widgets.VBox([widgets.HBox([start, stop, rate]), self.image])

    def run(self, seconds: float = 10.0, rate: float | None = None) -> None:
        """Load the server for `seconds`, then display the figure as an ordinary output (the static default)."""
        from IPython.display import Image, display

        self.start_load(rate)
        time.sleep(seconds)
        self.stop_load()
        time.sleep(self.interval)  # one more scrape, after the load
        display(Image(self.png()))

    def close(self) -> None:
        """Stop the load and the polling; no thread of the dashboard is left."""
        self.stop_load()
        self._closed.set()
        self._poller.join()
        self.image = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def show_dashboard(base_url: str, seconds: float = 10.0, rate: float = 4.0, **options) -> Dashboard:
    """What a notebook cell calls: the live panel, then a timed load whose final figure stays in the output.
    The dashboard polls on until its close()."""
    from IPython.display import display

    dash = Dashboard(base_url, **options)
    display(dash.widget())
    dash.run(seconds, rate)
    return dash
