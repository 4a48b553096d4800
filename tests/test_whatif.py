"""``quotastream replay --what-if``: one traffic file under several quota configurations."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from state.config import QuotaConfig, parse_quota_config
from state.core import QuotaCore
from state.events import EventBounds, parse_events
from streaming.commands.cli import main
from streaming.commands.exit_codes import EXIT_OK, EXIT_USAGE
from streaming.commands.whatif import compare, figure, trace
from tests.support.factories import BASE, MIXED_QUOTAS, mixed_payloads, produce

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parent.parent
MAX_PAYLOAD = 65_536


def quota(user: str, rate: float, client_id: str | None = None) -> dict[str, Any]:
    entity: dict[str, Any] = {"user": user, "producer_byte_rate": rate}
    if client_id is not None:
        entity["client_id"] = client_id
    return {"clients": [entity]}


def burst(user: str, nbytes: int, seconds: int) -> list[dict[str, Any]]:
    """One produce of ``nbytes`` at each whole second: aligned samples, so the window is 10 s."""
    return [produce(user, "app", nbytes, BASE + second * 1000) for second in range(seconds)]


def kafka_throttles(sizes: Sequence[int], limit: float) -> list[int]:
    """docs/semantics.md for one event per second at aligned times under 11 samples of 1 s:
    the window holds the last 11 events over 10 000 ms, and
    throttle = round_half_up((rate - limit) / limit * 10 000), at least 1 ms when over."""
    throttles = []
    for i in range(len(sizes)):
        rate = sum(sizes[max(0, i - 10) : i + 1]) / 10.0
        over = rate > limit
        throttles.append(max(1, math.floor((rate - limit) / limit * 10_000 + 0.5)) if over else 0)
    return throttles


def engine_throttled_ms(decisions: Sequence[tuple[int, int]], span: tuple[int, int]) -> int:
    """docs/replay.md, by brute force over milliseconds: each (ts, throttle_ms) decision of one
    counter, in input order, throttles from ts until ts + throttle_ms or the counter's next
    decision, whichever comes first (at once if that one is older); counted within the span."""
    covered: set[int] = set()
    for i, (ts, throttle) in enumerate(decisions):
        end = ts + throttle
        if i + 1 < len(decisions):
            end = min(end, max(ts, decisions[i + 1][0]))
        covered.update(range(max(ts, span[0]), min(end, span[1])))
    return len(covered)


class Cli:
    def __init__(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
        self.tmp_path = tmp_path
        self.capsys = capsys

    def config(self, name: str, content: dict[str, Any] | str) -> Path:
        path = self.tmp_path / f"{name}.yaml"
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        return path

    def events(self, events: Sequence[dict[str, Any] | str]) -> Path:
        path = self.tmp_path / "events.jsonl"
        lines = [event if isinstance(event, str) else json.dumps(event) for event in events]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    def replay(
        self, base: dict[str, Any] | str, events: Sequence[dict[str, Any] | str], *extra: str
    ) -> tuple[int, str, str]:
        code = main(
            [
                "replay",
                str(self.events(events)),
                "--config",
                str(self.config("base", base)),
                *extra,
            ]
        )
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tmp_path, capsys)


def table_rows(out: str) -> dict[tuple[str, str], list[str]]:
    """("quota entity", config) -> the line's cells; blank cells leave a shorter line."""
    rows: dict[tuple[str, str], list[str]] = {}
    counter = ""
    header, *lines, footer = out.splitlines()
    assert header.split()[:3] == ["quota", "entity", "config"]
    assert footer.endswith("s of events, most throttled first)")
    for line in lines:
        cells = line.split()
        if not line.startswith(" "):
            counter = f"{cells[0]} {cells[1]}"
            cells = cells[2:]
        rows[counter, cells[0]] = cells[1:]
    return rows


def decide(config: QuotaConfig, payloads: list[bytes]) -> pd.DataFrame:
    return QuotaCore(config).decide(parse_events(payloads, EventBounds(), MAX_PAYLOAD).accepted)


def test_burst_is_throttled_under_base_and_not_under_a_higher_quota(cli: Cli) -> None:
    events = burst("alice", 2000, 20)
    expected = kafka_throttles([2000] * 20, 1000)
    throttled = [t for t in expected if t > 0]
    assert len(throttled) == 15  # the rate passes 1000 B/s with the 6th event
    roomy = cli.config("roomy", quota("alice", 3000))

    code, out, err = cli.replay(quota("alice", 1000), events, "--what-if", f"roomy={roomy}")

    assert code == EXIT_OK
    rows = table_rows(out)
    span = (BASE, BASE + 19_000)
    wall = engine_throttled_ms(
        [(event["ts"], t) for event, t in zip(events, expected, strict=True)], span
    )
    # Each throttle runs until the next event a second later; the last one past the span.
    assert wall == 1000 * (len(throttled) - 1)
    assert wall < sum(throttled) / 7  # what the summed throttle_ms used to report
    share = f"{wall / 19_000:.1%}"
    base_row = [str(wall), share, "20", str(len(throttled)), str(max(throttled)), "1000"]
    # The window tops out at 11 events of 2000 B over 10 s: 2200 B/s.
    assert rows["produce user=alice,broker=1", "base"] == [*base_row, "220.0%"]
    assert rows["produce user=alice,broker=1", "roomy"] == [
        "0",
        "0.0%",
        "20",
        "0",
        "0",
        "3000",
        "73.3%",
    ]
    assert out.splitlines()[-1] == "(1 of 1 counters over 19.0 s of events, most throttled first)"
    # The core's own per-event decisions agree with the formula.
    payloads = [json.dumps(event).encode() for event in events]
    direct = decide(parse_quota_config(quota("alice", 1000), "base"), payloads)
    assert direct["throttle_ms"].tolist() == expected
    assert err.strip() == "quotastream: 20 lines, 20 decided, 0 rejected"


@pytest.mark.parametrize("batch", [1, 7, 100_000])
def test_aggregates_match_one_decide_over_all_events(batch: int) -> None:
    payloads = mixed_payloads(seed=3, count=150)
    configs = {
        "base": parse_quota_config(MIXED_QUOTAS, "base"),
        "half": parse_quota_config(
            {**MIXED_QUOTAS, "clients": [{"user": "<default>", "producer_byte_rate": 1000}]},
            "half",
        ),
    }
    batches = [
        parse_events(payloads[i : i + batch], EventBounds(), MAX_PAYLOAD).accepted
        for i in range(0, len(payloads), batch)
    ]

    table = compare(batches, configs).table

    for name, config in configs.items():
        decisions = decide(config, payloads)
        decisions = decisions[decisions["quota"].notna()]
        expected = (
            decisions.assign(
                quota=decisions["quota"].astype(str),
                entity=decisions["entity"].astype(str),
                utilisation=decisions["rate"] / decisions["limit"],
            )
            .groupby(["quota", "entity"])
            .agg(
                events=("throttle_ms", "size"),
                throttled=("throttle_ms", lambda t: int((t > 0).sum())),
                max_ms=("throttle_ms", "max"),
                limit=("limit", "max"),
                max_util=("utilisation", "max"),
            )
        )
        span = (int(decisions["ts"].min()), int(decisions["ts"].max()))
        expected["throttled_ms"] = [
            engine_throttled_ms(list(zip(counter["ts"], counter["throttle_ms"], strict=True)), span)
            for _, counter in decisions.groupby(
                [decisions["quota"].astype(str), decisions["entity"].astype(str)]
            )
        ]
        got = pd.DataFrame(table[name]).dropna(subset=["events"]).sort_index()
        assert list(got.index) == list(expected.index)
        for metric in ("throttled_ms", "events", "throttled", "max_ms"):
            assert got[metric].astype(np.int64).tolist() == expected[metric].tolist(), metric
        np.testing.assert_allclose(got["share"], expected["throttled_ms"] / (span[1] - span[0]))
        np.testing.assert_allclose(got["limit"], expected["limit"])
        np.testing.assert_allclose(got["max_util"], expected["max_util"])
    totals = table.loc[:, pd.IndexSlice[:, "throttled_ms"]].max(axis=1).to_numpy()
    assert (np.diff(totals) <= 0).all()  # most throttled first
    assert totals[0] > 0
    assert table.loc[:, ("half", "throttled")].sum() > table.loc[:, ("base", "throttled")].sum()


def test_entity_resolved_differently_leaves_blanks(cli: Cli) -> None:
    # A (user, client-id) quota counts the pair; a user quota counts all the user's clients.
    by_user = cli.config("by_user", quota("alice", 1000))
    code, out, _ = cli.replay(
        quota("alice", 1000, client_id="app"), burst("alice", 2000, 12), "--what-if", f"u={by_user}"
    )
    assert code == EXIT_OK
    rows = table_rows(out)
    assert rows["produce user=alice,client-id=app,broker=1", "base"][2:4] == ["12", "7"]
    assert rows["produce user=alice,client-id=app,broker=1", "u"] == []
    assert rows["produce user=alice,broker=1", "base"] == []
    assert rows["produce user=alice,broker=1", "u"][2:4] == ["12", "7"]


def test_top_limits_rows_most_throttled_first(cli: Cli) -> None:
    events = [event for i in range(5) for event in burst(f"u{i}", 1200 + 300 * i, 15)]
    config = {"clients": [{"user": "<default>", "producer_byte_rate": 1000}]}
    alternative = cli.config(
        "alt", {"clients": [{"user": "<default>", "producer_byte_rate": 1500}]}
    )

    code, out, _ = cli.replay(config, events, "--what-if", f"alt={alternative}", "--top", "2")

    assert code == EXIT_OK
    assert list(table_rows(out)) == [
        ("produce user=u4,broker=1", "base"),
        ("produce user=u4,broker=1", "alt"),
        ("produce user=u3,broker=1", "base"),
        ("produce user=u3,broker=1", "alt"),
    ]
    assert out.splitlines()[-1] == "(2 of 5 counters over 14.0 s of events, most throttled first)"


def test_plot_writes_a_png_and_dead_letters_stay_as_for_replay(cli: Cli, tmp_path: Path) -> None:
    alternative = cli.config("alt", quota("alice", 3000))
    png = tmp_path / "out" / "whatif.png"
    png.parent.mkdir()
    dead_letter = tmp_path / "dead.jsonl"

    code, out, err = cli.replay(
        quota("alice", 1000),
        [*burst("alice", 2000, 20), "{broken"],
        "--what-if",
        f"alt={alternative}",
        "--plot",
        str(png),
        "--dead-letter",
        str(dead_letter),
    )

    assert code == EXIT_OK
    assert ("produce user=alice,broker=1", "base") in table_rows(out)
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > len(PNG_MAGIC)
    # Written once, although --plot reads the events twice.
    [reject] = [json.loads(line) for line in dead_letter.read_text().splitlines()]
    assert (reject["line"], reject["reason"]) == (21, "invalid_json")
    assert err.strip() == "quotastream: 21 lines, 20 decided, 1 rejected (invalid_json=1)"


def test_no_events_gives_an_empty_table_and_plot(cli: Cli, tmp_path: Path) -> None:
    alternative = cli.config("alt", "{}")
    png = tmp_path / "empty.png"
    code, out, _ = cli.replay("{}", [], "--what-if", f"alt={alternative}", "--plot", str(png))
    assert code == EXIT_OK
    assert out.splitlines()[-1] == "(0 of 0 counters over 0.0 s of events, most throttled first)"
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_what_if_without_plot_does_not_load_matplotlib(cli: Cli) -> None:
    alternative = cli.config("alt", "{}")
    events = cli.events(burst("alice", 2000, 3))
    script = (
        "import sys\n"
        "from streaming.commands.cli import main\n"
        f"code = main(['replay', {str(events)!r}, '--config', {str(alternative)!r},"
        f" '--what-if', 'alt=' + {str(alternative)!r}])\n"
        "assert code == 0, code\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("what_if", "extra", "message"),
    [
        (["roomy"], [], "--what-if expects NAME=PATH, got 'roomy'"),
        (["=ok.yaml"], [], "--what-if expects NAME=PATH, got '=ok.yaml'"),
        (["roomy="], [], "--what-if expects NAME=PATH, got 'roomy='"),
        (["a b=ok.yaml"], [], "--what-if name 'a b': use up to 32 letters"),
        (["x=ok.yaml", "x=ok.yaml"], [], "--what-if name 'x' is given twice"),
        (["base=ok.yaml"], [], "--what-if name 'base' is taken by the --config file"),
        (["x={dir}/missing.yaml"], [], "missing.yaml: file not found"),
        (["x={dir}/broken.yaml"], [], "broken.yaml: invalid YAML"),
        (
            ["ok={dir}/ok.yaml", "x={dir}/negative.yaml"],
            [],
            "negative.yaml: clients[0].producer_byte_rate: Input should be greater than 0 (got -1)",
        ),
        (["x={dir}/ok.yaml"], ["--top", "0"], "--top must be >= 1, got 0"),
        ([], ["--top", "3"], "--top and --plot apply only with --what-if"),
        ([], ["--plot", "p.png"], "--top and --plot apply only with --what-if"),
    ],
)
def test_bad_what_if_options_exit_2_naming_them(
    cli: Cli, what_if: list[str], extra: list[str], message: str
) -> None:
    cli.config("ok", quota("alice", 3000))
    cli.config("broken", "clients: [unclosed")
    cli.config("negative", quota("alice", -1))
    options = [
        option for spec in what_if for option in ("--what-if", spec.format(dir=cli.tmp_path))
    ]
    code, out, err = cli.replay(quota("alice", 1000), burst("alice", 2000, 3), *options, *extra)
    assert code == EXIT_USAGE
    assert out == ""
    assert err.startswith("quotastream: error: ")
    assert message in err


def test_plot_refuses_stdin(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    alternative = cli.config("alt", "{}")
    code = main(
        [
            "replay",
            "-",
            "--config",
            str(alternative),
            "--what-if",
            f"alt={alternative}",
            "--plot",
            str(cli.tmp_path / "p.png"),
        ]
    )
    assert code == EXIT_USAGE
    assert "--plot reads the events twice: give a file, not stdin" in capsys.readouterr().err


def test_shipped_example_with_a_roomier_config(cli: Cli) -> None:
    roomy = (REPO / "conf" / "quotas.yaml").read_text().replace("3145728", "6291456")
    code = main(
        [
            "replay",
            str(REPO / "examples" / "events.jsonl"),
            "--config",
            str(REPO / "conf" / "quotas.yaml"),
            "--what-if",
            f"roomy={cli.config('roomy', roomy)}",
        ]
    )
    rows = table_rows(cli.capsys.readouterr().out)
    assert code == EXIT_OK
    # Doubling the leader replication rate lifts every replication throttle.
    for broker in (1, 2):
        assert int(rows[f"leader_replication broker={broker}", "base"][0]) > 0
        assert rows[f"leader_replication broker={broker}", "roomy"][:4] == ["0", "0.0%", "120", "0"]


def test_a_decision_back_under_the_limit_releases_the_throttle(cli: Cli) -> None:
    # 5000 B over the first 10 s window: 500 B/s against 100, a 40 s throttle. 12 s later the
    # sample has left the window, the rate is 0 and that decision releases the throttle.
    events = [produce("alice", "app", nbytes, BASE + ms) for nbytes, ms in [(5000, 0), (0, 12_000)]]
    events.append(produce("alice", "app", 0, BASE + 50_000))
    code, out, _ = cli.replay(
        quota("alice", 100), events, "--what-if", f"same={cli.config('same', quota('alice', 100))}"
    )
    assert code == EXIT_OK
    payloads = [json.dumps(event).encode() for event in events]
    direct = decide(parse_quota_config(quota("alice", 100), "base"), payloads)
    assert direct["throttle_ms"].tolist() == [40_000, 0, 0]
    # Whole throttles would count 40 000 ms; the engine released it after 12 000.
    assert table_rows(out)["produce user=alice,broker=1", "base"][:2] == ["12000", "24.0%"]


def test_json_output_has_the_rows_of_the_table(cli: Cli) -> None:
    events = [event for i in range(3) for event in burst(f"u{i}", 1500 + 400 * i, 15)]
    config = {"clients": [{"user": "<default>", "producer_byte_rate": 1000}]}
    roomy = cli.config("roomy", {"clients": [{"user": "<default>", "producer_byte_rate": 1800}]})
    options = ("--what-if", f"roomy={roomy}", "--top", "2")

    _, table, _ = cli.replay(config, events, *options)
    code, out, err = cli.replay(config, events, *options, "--output", "json")

    assert code == EXIT_OK
    assert err.strip() == "quotastream: 45 lines, 45 decided, 0 rejected"
    document = json.loads(out)
    assert (document["first_ts"], document["last_ts"], document["span_ms"]) == (
        BASE,
        BASE + 14_000,
        14_000,
    )
    assert document["counters"] == 3
    as_json = {
        (f"{row['quota']} {row['entity']}", row["config"]): [
            str(row["throttled_ms"]),
            f"{row['share']:.1%}",
            str(row["events"]),
            str(row["throttled"]),
            str(row["max_ms"]),
            f"{row['limit']:.15g}",
            f"{row['max_util']:.1%}",
        ]
        for row in document["rows"]
    }
    assert as_json == table_rows(table)
    assert next(iter(as_json)) == ("produce user=u2,broker=1", "base")


def test_unlimited_counters_are_null_in_json(cli: Cli) -> None:
    alternative = cli.config("alt", "{}")
    code, out, _ = cli.replay(
        "{}", burst("alice", 10, 2), "--what-if", f"alt={alternative}", "--output", "json"
    )
    assert code == EXIT_OK
    [base, alt] = json.loads(out)["rows"]
    assert (base["limit"], base["max_util"], base["throttled_ms"]) == (None, None, 0)
    assert alt["config"] == "alt"


@pytest.mark.parametrize(
    ("plot", "problem"),
    [
        ("out.jpg", "the plot is a PNG; give a path ending in .png"),
        ("missing/out.png", "directory {dir}/missing does not exist"),
        ("taken.png", "is a directory"),
        ("events.jsonl/out.png", "{dir}/events.jsonl is not a directory"),
    ],
)
def test_plot_path_is_refused_before_the_replay(cli: Cli, plot: str, problem: str) -> None:
    (cli.tmp_path / "taken.png").mkdir()
    alternative = cli.config("alt", quota("alice", 3000))
    code, out, err = cli.replay(
        quota("alice", 1000),
        [*burst("alice", 2000, 3), "{broken"],
        "--what-if",
        f"alt={alternative}",
        "--plot",
        str(cli.tmp_path / plot),
    )
    assert (code, out) == (EXIT_USAGE, "")
    # One line: no reject and no summary, so no event was read.
    path = cli.tmp_path / plot
    assert err == f"quotastream: error: --plot {path}: {problem.format(dir=cli.tmp_path)}\n"


def test_output_table_needs_what_if(cli: Cli) -> None:
    code, out, err = cli.replay("{}", burst("alice", 1, 2), "--output", "table")
    assert (code, out) == (EXIT_USAGE, "")
    assert "without --what-if, replay writes JSON lines: --output table needs it" in err
    code, out, _ = cli.replay("{}", burst("alice", 1, 2), "--output", "json")
    assert code == EXIT_OK
    assert [json.loads(line)["line"] for line in out.splitlines()] == [1, 2]


def test_plot_shades_each_configurations_throttled_periods() -> None:
    # Two configurations throttle alice over different, overlapping periods.
    payloads = [json.dumps(event).encode() for event in burst("alice", 2000, 20)]
    configs = {
        "base": parse_quota_config(quota("alice", 1000), "base"),
        "tight": parse_quota_config(quota("alice", 600), "tight"),
    }
    batches = [parse_events(payloads, EventBounds(), MAX_PAYLOAD).accepted]
    comparison = compare(batches, configs)
    counter = ("produce", "user=alice,broker=1")
    series = trace(batches, configs, [counter], comparison.span)

    [panel] = figure(series, comparison, [counter], list(configs)).axes
    shading = {c.get_label(): c for c in panel.collections}
    shaded: dict[str, list[float]] = {}

    assert set(shading) == {"base throttled", "tight throttled"}
    assert shading["base throttled"].get_hatch() != shading["tight throttled"].get_hatch()
    assert not np.array_equal(
        shading["base throttled"].get_facecolor(), shading["tight throttled"].get_facecolor()
    )
    for name in configs:
        drawn: list[float] = []
        for path in shading[f"{name} throttled"].get_paths():
            xs = np.asarray(path.vertices, dtype=np.float64)[:, 0]
            drawn.extend((xs.min(), xs.max()))
        periods = comparison.periods[comparison.periods["config"] == name]
        edges = periods[["start", "end"]].to_numpy().ravel()
        assert drawn == pytest.approx(((edges - BASE) / 1000).tolist())
        shaded[name] = drawn
    # base throttles from the 6th second, tight from the 4th: overlapping, not equal.
    assert (shaded["base"][0], shaded["tight"][0]) == (5.0, 3.0)
    legend = [text.get_text() for text in panel.figure.legends[0].get_texts()]
    assert {"base throttled", "tight throttled", "base limit", "tight limit"} <= set(legend)


def test_replay_doc_prose_numbers_are_the_examples() -> None:
    """docs/replay.md quotes the shipped example's throttle count, summed throttles, throttled wall
    time and whole-throttle union; all recomputed here, so regenerating the example shows which
    sentence went stale."""
    payloads = (REPO / "examples" / "events.jsonl").read_bytes().splitlines()
    decisions = decide(
        parse_quota_config(yaml.safe_load((REPO / "conf" / "quotas.yaml").read_text()), "base"),
        payloads,
    )
    span = (int(decisions["ts"].min()), int(decisions["ts"].max()))

    def counter(entity: str) -> pd.DataFrame:
        return decisions[decisions["entity"].astype(str) == entity]

    replication = counter("broker=1").query("quota == 'leader_replication'")
    throttles = [int(throttle) for throttle in replication["throttle_ms"]]
    summed = sum(throttles)
    wall = engine_throttled_ms(
        [(int(ts), throttle) for ts, throttle in zip(replication["ts"], throttles, strict=True)],
        span,
    )
    loader = counter("user=ingest,client-id=bulk-loader,broker=1")
    whole: set[int] = set()
    for ts, throttle in zip(loader["ts"], loader["throttle_ms"], strict=True):
        whole.update(range(ts, min(ts + throttle, span[1])))
    doc = " ".join((REPO / "docs" / "replay.md").read_text().split())
    throttled = sum(throttle > 0 for throttle in throttles)
    assert f"{throttled} throttles summing to {summed:,} ms" in doc
    assert f"{summed / wall:.1f} times the {wall:,} ms" in doc
    assert f"would count {len(whole):,} ms from whole throttles" in doc
