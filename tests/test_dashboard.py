"""The instructor dashboard against a real loopback server: a short load shows up in the scraped series, the
figure has its panels, the widget's buttons drive the load, and close() leaves no thread."""

import threading

import matplotlib
import pytest
from test_server import Server  # tests/ is on sys.path

from minillm import LLM
from minillm.bench.prometheus import histogram_quantile, parse_metrics
from minillm.course.dashboard import Dashboard, show_dashboard
from minillm.engine.async_llm import AsyncLLM

matplotlib.use("Agg")


def dashboard_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dashboard-")]


@pytest.fixture(scope="module")
def server():
    server = Server(AsyncLLM(LLM(num_kvcache_blocks=64)), "story")
    yield server
    server.stop()


def test_histogram_quantile_interpolates_within_the_bucket_as_prometheus():
    buckets = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (float("inf"), 40.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20 of 40: half-way in (0.1, 0.2]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.2 + 0.3 * (39.6 - 30) / 10)
    assert histogram_quantile(0.99, [(0.1, 1.0), (float("inf"), 2.0)]) == 0.1  # in +Inf: its lower bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_metrics_are_summed_over_label_sets():
    text = (
        'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
        'x_bucket{le="0.1",engine="0"} 1\nx_bucket{le="0.1",engine="1"} 2\nx_bucket{le="+Inf",engine="0"} 4\n'
    )
    assert parse_metrics(text) == {"vllm:num_requests_running": 5.0, "x": [(0.1, 3.0), (float("inf"), 4.0)]}


def test_a_short_load_is_recorded_drawn_and_closed(server, capsys):
    dash = show_dashboard(server.url, seconds=2.0, rate=8.0, interval=0.2, window=1.0, max_tokens=16)
    try:
        assert dash.sent >= 4 and dash.failed == 0 and not dash.loading
        assert "IPython.core.display.Image" in capsys.readouterr().out  # run() displayed the final figure
        s = dash.series()
        assert set(s) == {
            "time",
            "generation_tokens",
            "generation_tokens_per_s",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "itl_p50_ms",
            "itl_p99_ms",
        }
        assert len({len(v) for v in s.values()}) == 1 and len(s["time"]) >= 5
        tokens = s["generation_tokens"]
        assert tokens == sorted(tokens) and tokens[-1] >= tokens[0] + 4 * 16  # the counter grew by the load
        assert max(r for r in s["generation_tokens_per_s"] if r is not None) > 0
        assert any(v for v in s["ttft_p50_ms"] if v) and any(v for v in s["itl_p99_ms"] if v)
        gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
        assert all(v is not None and v >= 0 for g in gauges for v in s[g])  # scraped every time
        fig = dash.figure()
        titles = [ax.get_title() for ax in fig.axes]
        assert titles[:3] == ["generation tokens/s (over the last 1 s)", "requests", "KV-cache usage"]
        assert titles[3].startswith("latency") and len(fig.axes[3].get_lines()) == 4
        assert dash.png()[:8] == b"\x89PNG\r\n\x1a\n" and dash.image.value[:4] == b"\x89PNG"
    finally:
        dash.close()
    assert not dashboard_threads()


def test_the_widgets_buttons_start_and_stop_the_load(server):
    with Dashboard(server.url, interval=0.2, max_tokens=4) as dash:
        panel = dash.widget()
        (start, stop, rate), image = panel.children[0].children, panel.children[1]
        rate.value = 16.0
        start.click()
        assert dash.loading and dash.rate == 16.0 and "dashboard-load" in dashboard_threads()
        before = image.value
        threading.Event().wait(1.0)
        stop.click()
        assert not dash.loading and dash.sent >= 1 and image.value != before  # redrawn as data arrived
    assert not dashboard_threads()


def test_an_unreachable_server_is_said_in_the_title_and_closes_cleanly():
    with Dashboard("http://127.0.0.1:9", interval=0.05) as dash:
        threading.Event().wait(0.3)
        assert dash.error and dash.series()["time"] == []
        assert "ConnectError" in dash.figure()._suptitle.get_text()
        dash.start_load(4.0)
        dash._load.join(10)
        assert not dash.loading and dash.sent == 0
    assert not dashboard_threads()
